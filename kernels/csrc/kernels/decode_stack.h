// DecodeStack: every decoder layer of a decode step (each request one new token) in one C++ call,
// for a Llama-family model whose linear layers are packed (float32: packed_gemm.h; bfloat16:
// bf16_gemm.h, AMX where the CPU has it; block-quantized: quant_gemm.h). Per layer: RMSNorm, fused
// q/k/v product (+ bias), Qwen3's per-head q/k norms, RoPE on interleaved pairs, K/V written to the
// pool slots, attention read in place from the pool (paged_attention.h: GQA, flash-style float32
// softmax), o_proj accumulated onto the residual, RMSNorm, fused gate/up product, SiLU(gate) * up,
// down_proj accumulated onto the residual. The residual stream stays float32 throughout.
// A sparse layer (Qwen3-MoE, Mixtral, OLMoE) takes a mixture of experts in place of the dense
// MLP: RMSNorm, the router's logits, softmax, top-k (renormalised where the model says), and every
// routed expert's SwiGLU and the weighted sum in one moe_experts call (moe_experts.h), added to
// the residual.
//
// Why: a decode step of a small model on a CPU is bound by per-op overhead (Python, dispatch,
// small kernels, dtype conversions) as much as by reading the weights; here a step has one call
// per step instead of ~20 torch ops per layer.
//
// Torch-free: the layers are plain views of memory the caller owns and keeps alive (weights,
// biases, norms, KV buffers); a refused operand is a std::runtime_error (kernels/check.h). The
// torch class (bindings/torch_layers.h, torch_decode_stack.cpp) holds the tensors and builds
// these views.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/bf16_gemm.h"
#include "kernels/moe_experts.h"
#include "kernels/paged_attention.h"
#include "kernels/quant_gemm.h"

namespace radixlm {

// How a linear layer's weight W [K, N] is packed, N padded to a multiple of 64 columns:
//   kFloat32   float32 panels [Np/64][K][64] (packed_gemm.h)
//   kBFloat16  bfloat16 pair panels [Np/32][Kp/2][32][2] (bf16_gemm.h)
//   kQuant     uint8 quant groups [Np/16][K/block k][block bytes] of `format` (quant_gemm.h)
enum class WeightKind : int { kFloat32 = 0, kBFloat16 = 1, kQuant = 2 };

struct PackedWeight {
  WeightKind kind = WeightKind::kFloat32;
  const void* data = nullptr;
  int64_t units = 0;                  // panels (64 or 32 columns) or quant groups (16 columns)
  QFormat format = QFormat::kQ8_0;  // kQuant only

  int64_t columns() const { return units * (kind == WeightKind::kFloat32 ? 64 : kind == WeightKind::kBFloat16 ? 32 : 16); }
};

// A sparse layer's mixture of experts: router float32 [num_experts, hidden] (one row per expert,
// HF's gate layout), the experts as moe_experts reads them (hidden the stack's). Each token takes
// the top_k experts of softmax(router @ x) in float32 (ties: the lower id first), in descending
// order, their probabilities divided by their sum where norm_topk_prob. top_k 0: a dense layer.
struct DecodeExperts {
  const float* router = nullptr;
  MoeExperts experts;
  int64_t top_k = 0;
  bool norm_topk_prob = false;
};

// One part of a product whose output columns come from weights of different formats side by side
// (a Q4_K_M file's q and k in Q4_K, v in Q6_K): `columns` (unpadded) of the output, after the
// parts before it; its weight packed for those columns.
struct WeightPart {
  PackedWeight weight;
  int64_t columns = 0;
};

// One layer. Biases float32 padded to the packed width, q_norm / k_norm float32 [head_dim],
// attn_norm / ffn_norm float32 [hidden]: each null where the layer has none (the RMSNorm weights
// before qkv and gate_up are folded into those products where they are float; quantized ones
// cannot absorb them, and the norms carry them). kv: the layer's pool buffers, [slots,
// num_kv_heads, head_dim], float32 or bfloat16.
struct DecodeLayer {
  PackedWeight qkv, o, gate_up, down;
  const float* qkv_bias = nullptr;
  const float* o_bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  KvBuffers kv;
  DecodeExperts moe;  // a sparse layer's (then gate_up / down are unused and may be null)
  // q/k/v or gate/up in parts (then qkv / gate_up are unused and may be null); empty: whole
  std::vector<WeightPart> qkv_parts, gate_up_parts;

  bool is_sparse() const { return moe.top_k > 0; }
};

struct DecodeShape {
  int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
  float rms_eps, scale;  // scale: of the attention scores
};

// Tensor parallel: this stack is rank `rank`'s shard (its heads and MLP columns); `sum(data, n)`
// sums data[0, n) over the ranks in place (every rank the same bits), for at most `max_floats`.
struct AllReduce {
  std::function<void(float*, int64_t)> sum;
  int64_t rank = 0, max_floats = 0;
};

// A decode step's batch of B requests: hidden [B, hidden] (the new tokens' embeddings); rope [B,
// head_dim/2, 2] (cos, sin of each token's position); slots [B] (the new tokens' KV slots);
// req_to_token [num_rows, context] int32; rows, seq_lens [B] (seq_lens including the new token).
struct DecodeBatch {
  int64_t size = 0;
  const float* hidden = nullptr;
  const float* rope = nullptr;
  const int64_t* slots = nullptr;
  const int32_t* req_to_token = nullptr;
  int64_t num_rows = 0, context = 0;
  const int64_t* rows = nullptr;
  const int64_t* seq_lens = nullptr;
};

class DecodeStack {
 public:
  explicit DecodeStack(const DecodeShape& shape);

  // One layer, in order; its weights' kinds and sizes are checked against the shape (a dense
  // layer's gate_up / down; a sparse layer's experts: their widths and top_k).
  void add_layer(const DecodeLayer& layer);

  // The step: writes each layer's K/V at the new tokens' slots, and out [B, hidden] (rows
  // `hidden` apart) = the residual stream after the last layer.
  void forward(const DecodeBatch& batch, float* out) const;

  const DecodeShape& shape() const { return shape_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // The bf16 GEMM path (by default the fastest this CPU runs); how quantized weights multiply
  // (default weight-only float32); the tensor-parallel sum (default none: one rank).
  Bf16Path bf16_path = radixlm::bf16_path();
  QMode quant_mode = QMode::kFloat;
  // Whether attention may take the flash kernels (paged_attention's `flash`: a batch sharing a
  // long prefix attends through the cascade): the caller's kernel policy decides (the runtime's:
  // runtime/model/kernel_policy.py attention_kernels); off by default.
  bool flash_attention = false;
  AllReduce all_reduce;

 private:
  void linear_parts(const PackedWeight& whole, const std::vector<WeightPart>& parts, const float* x, int64_t M,
                    int64_t K, float* out, int64_t ld_out, const float* bias) const;
  void linear(const PackedWeight& w, const float* x, int64_t M, int64_t K, float* out, int64_t ld_out,
              const float* residual, int64_t ld_res, const float* bias) const;
  struct Scratch;
  void attention_block(const DecodeLayer& L, const DecodeBatch& batch, Scratch& s) const;
  void mlp_block(const DecodeLayer& L, int64_t B, Scratch& s) const;
  void experts_block(const DecodeLayer& L, int64_t B, Scratch& s) const;
  template <typename F>
  void reduce_into_residual(Scratch& s, int64_t B, const F& accumulate) const;

  DecodeShape shape_;
  std::vector<DecodeLayer> layers_;
  int64_t qkv_ld_ = 0, gate_up_ld_ = 0;  // the row strides of the q/k/v and gate/up products' outputs
};

}  // namespace radixlm
