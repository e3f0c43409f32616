// paged_attention (paged_attention.cpp): causal attention of a batch's new tokens over their
// requests' whole context, K/V read in place from the KV pool through req_to_token. One call for
// decode, extend and mixed batches; long extends and batches sharing a long prefix go to the
// kernels of amx_attention.h where the caller allows them.
//
// Torch-free (kernels/parallel.h): operands are raw pointers and sizes; a refused operand is a
// std::runtime_error (kernels/check.h). The torch entry point (bindings/torch_attention.cpp)
// checks the tensors and calls this.
#pragma once

#include <cstdint>

namespace radixlm {

// The element type of q / out and of a KV pool: float32, or bfloat16 bits (uint16_t).
enum class DType : int { kFloat32 = 0, kBFloat16 = 1 };

// One layer's KV pool buffers, each [num_slots, num_kv_heads, head_dim] contiguous, of `dtype`.
// Non-const: DecodeStack writes its new tokens' K and V there; attention only reads them.
struct KvBuffers {
  void* k = nullptr;
  void* v = nullptr;
  int64_t num_slots = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kFloat32;
};

// The requests of a batch: request b's slots are row rows[b] of req_to_token [num_rows, context]
// (position order); it has seq_lens[b] positions, of which the last extend_lens[b] are new, their
// q rows starting at extend_start[b]. Every pointer is [size].
struct AttentionBatch {
  const int32_t* req_to_token = nullptr;
  int64_t num_rows = 0, context = 0;
  const int64_t* rows = nullptr;
  const int64_t* seq_lens = nullptr;
  const int64_t* extend_lens = nullptr;
  const int64_t* extend_start = nullptr;
  int64_t size = 0;
};

// Head sizes the kernel takes (16, 32, 64, 80, 96, 128, 256).
bool is_supported_head_dim(int64_t head_dim);

// q, out [num_tokens, num_heads, kv.head_dim], contiguous, both of q_dtype (bfloat16 q is widened
// to float32 and the output rounded back once). New token i of request b is q row
// extend_start[b] + i at position seq_lens[b] - extend_lens[b] + i, and attends positions
// [0, that position] of its request, scaled by `scale`. amx / flash: requests with at least
// kAmxMinTokens new tokens over a bfloat16 pool take the AMX kernel, or the vector one
// (amx_attention.h: over a float32 pool, with float32 q, too), where this CPU runs it; with flash,
// a batch whose requests share a long prefix goes whole to the cascade kernel. Every row of
// `out` the batch names is written. Refuses (std::runtime_error) a head size, shape, row, length
// or slot out of range.
void paged_attention(const void* q, void* out, DType q_dtype, int64_t num_tokens, int64_t num_heads,
                     const KvBuffers& kv, const AttentionBatch& batch, float scale, bool amx = false, bool flash = false);

// Calls of paged_attention that took the cascade over a shared prefix (since the process
// started): a statistic for tests.
int64_t num_cascade_calls();

}  // namespace radixlm
