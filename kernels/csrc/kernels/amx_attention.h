// Causal attention of long extends (prompts, chunks of prompts) over their requests' context in
// the KV pool: on AMX tiles (amx_attention.cpp; the avx512 build on a CPU with AMX-BF16) or with
// vector registers (flash_attention.cpp, the same algorithm; float32 FMAs at every ISA level, or
// AVX512-BF16 dot products in the avx512 build). paged_attention.cpp hands them the requests with
// at least kAmxMinTokens new tokens when the caller allows it.
#pragma once

#include <cstdint>
#include <vector>

namespace radixlm {

struct ExtendRequest {
  const int32_t* slots;  // the request's pool slots, position order
  int64_t seq_len;       // context length, new tokens included
  int64_t extend_len;    // new tokens: positions seq_len - extend_len .. seq_len - 1
  int64_t q_start;       // q / out row of the first new token
};

// Requests with fewer new tokens stay on the vector kernel (packing a long context for a few
// queries costs more than it saves); measured with the default model, see paged_attention().
constexpr int64_t kAmxMinTokens = 16;

// True when the AMX path serves this head size here: the avx512 build, cpu_has(kAmxBf16) (AMX
// tile data permitted), D 64, 128 or 256. Elsewhere amx_extend_attention throws.
bool amx_attention_supported(int64_t head_dim);

// q, out [T, Hq, D] float32 or bfloat16 (T = uint16_t); k_buf, v_buf [slots, Hkv, D] bfloat16. Scores
// and softmax in float32; q, K, V and the softmax weights enter the tile products as bfloat16 (as
// in torch's bf16 SDPA).
template <typename T>
void amx_extend_attention(const std::vector<ExtendRequest>& requests, const T* q, T* out, int64_t Hq, int64_t Hkv,
                          int64_t D, const uint16_t* k_buf, const uint16_t* v_buf, float scale);

// True when the vector path below serves this head size (D 64 or 128; at every ISA level, with
// vdpbf16ps where it runs and is the faster math, else float32 FMAs).
bool flash_attention_supported(int64_t head_dim);

// The math of the vector path (flash_attention.cpp): vdpbf16ps on bf16 operands, or float32 FMAs.
enum class LongExtendMath : int { kDpbf16 = 0, kFma = 1 };

// Whether the vector path runs in float32 FMAs over a bf16 pool: always but in the avx512 build on
// a CPU with AVX512-BF16 (cpu_has(kAvx512Bf16)); there, decided once per process by timing one
// unit with each math (fma_is_faster), unless set.
bool long_extend_uses_fma();

// Sets the math (a LongExtendMath; -1: decide again by timing), for tests and benchmarks; throws
// std::runtime_error for an unknown math, or kDpbf16 where vdpbf16ps does not run.
void set_long_extend_math(int64_t math);

// As amx_extend_attention, with vdpbf16ps or float32 FMAs (long_extend_uses_fma), over a bf16
// pool (P = uint16_t) or a float32 one (P = float: always FMAs); units are (request, kv head, 16
// rows of (new token, query head of the group)).
template <typename T, typename P>
void flash_extend_attention(const std::vector<ExtendRequest>& requests, const T* q, T* out, int64_t Hq, int64_t Hkv,
                           int64_t D, const P* k_buf, const P* v_buf, float scale);

// Cascade attention with the vector kernel (its math and pools as above) for a batch whose
// requests share their first `shared_len` KV slots (a prefix the radix cache shares; none of them
// a new token's): every row of every request attends over the shared keys in one pass (their
// values packed once, rows of all requests filling the vector lanes), then over its own request's remaining keys, and the two partial softmaxes
// are merged per row. Any extend lengths, decodes included. paged_attention() takes this path
// when at least kCascadeMinShared slots are shared and they are 4x the requests' other keys.
constexpr int64_t kCascadeMinShared = 64;

template <typename T, typename P>
void flash_cascade_attention(const std::vector<ExtendRequest>& requests, int64_t shared_len, const T* q, T* out,
                            int64_t Hq, int64_t Hkv, int64_t D, const P* k_buf, const P* v_buf, float scale);

}  // namespace radixlm
