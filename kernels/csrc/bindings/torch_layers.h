// The torch layer over the torch-free kernels that take more than a product's pointers (the
// products' own wrappers are in torch_ops.cpp): each checks its tensors (TORCH_CHECK), allocates
// its output and calls the core of kernels/. Python sees these through torch_ops.cpp.
//   paged_attention  -> kernels/paged_attention.h   (torch_attention.cpp)
//   rms_norm, silu_mul -> kernels/rows.h            (torch_rows.cpp)
//   DecodeStack      -> kernels/decode_stack.h      (torch_decode_stack.cpp)
//   moe_experts      -> kernels/moe_experts.h       (torch_moe.cpp)
#pragma once

#include <torch/extension.h>

#include <memory>
#include <vector>

#include "kernels/decode_stack.h"
#include "kernels/shm_all_reduce.h"

namespace radixlm::bindings {

// q [T, Hq, D] float32 or bfloat16; k_buf / v_buf [slots, Hkv, D] float32 or bfloat16;
// req_to_token int32 [rows, context]; rows, seq_lens, extend_lens, extend_start int64 [B]. Output
// [T, Hq, D] in q's dtype. amx / flash as radixlm::paged_attention.
torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                              const torch::Tensor& req_to_token, const torch::Tensor& rows, const torch::Tensor& seq_lens,
                              const torch::Tensor& extend_lens, const torch::Tensor& extend_start, double scale,
                              bool amx = false, bool flash = false);

// x [T, n] (rows may be strided) -> x / sqrt(mean(x^2) + eps) (* weight), contiguous, x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& weight, double eps);

// gu [T, 2n] (gate columns, then up; rows may be strided) -> silu(gate) * up [T, n], gu's dtype.
torch::Tensor silu_mul(const torch::Tensor& gu);

// x [T, H] float32; ids int64 / weights float32 [T, k] (each token's experts and their weights);
// arena uint8: expert e's packed gate_up ([H] -> [2 * inter]) at byte offsets[e][0], its down
// ([inter] -> [H]) at offsets[e][1]; kind a radixlm::MoeWeights; for kQuant gate_up's and down's
// block bytes (naming their formats) and mode a radixlm::QMode; bf16_path a radixlm::Bf16Path or
// -1 for kBf16.
// Returns y [T, H] float32: each token's weighted sum of its experts' SwiGLU outputs.
torch::Tensor moe_experts(const torch::Tensor& x, const torch::Tensor& ids, const torch::Tensor& weights,
                          const torch::Tensor& arena, const torch::Tensor& offsets, int64_t inter, int64_t kind,
                          int64_t gate_up_block_bytes, int64_t down_block_bytes, int64_t mode, int64_t bf16_path);

// q4k_int8_row_parallel (kernels/kquant_gemm.h; torch_moe.cpp): x [1, K] float32 @ packed Q4_K quant
// groups [N/16, K/256, 2304] in int8 `mode` (+ residual [1, N]) (+ bias [N]) -> [1, N], the bits of
// q_linear's product.
torch::Tensor q4k_row_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t mode,
                             const c10::optional<torch::Tensor>& residual, const c10::optional<torch::Tensor>& bias);

// The view of one layer's experts (moe_experts' arguments past x, ids and weights) for a hidden
// width, its arena checked to hold every offset's weight.
MoeExperts moe_layer(const torch::Tensor& arena, const torch::Tensor& offsets, int64_t hidden, int64_t inter,
                     int64_t kind, int64_t gate_up_block_bytes, int64_t down_block_bytes, int64_t mode,
                     int64_t bf16_path);

// radixlm::DecodeStack over tensors it keeps alive.
// A sparse layer's mixture of experts for DecodeStack::add_layer: the router float32 [E, hidden]
// and the experts as moe_experts takes them (checked: moe_layer); the stack keeps the tensors alive.
struct Experts {
  Experts(torch::Tensor router, torch::Tensor arena, torch::Tensor offsets, int64_t inter, int64_t kind,
          int64_t gate_up_block_bytes, int64_t down_block_bytes, int64_t mode, int64_t bf16_path, int64_t top_k,
          bool norm_topk_prob);
  DecodeExperts view;
  std::vector<torch::Tensor> kept;
};

class DecodeStack {
 public:
  DecodeStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t intermediate,
              double rms_eps, double scale);

  // One layer, in order (a sparse layer: gate_up and down None, and `experts` its mixture of
  // experts). Weights are float32 packed [N/64, K, 64] (packed_gemm.h), bfloat16 VNNI
  // panels [N/32, Kp/2, 32, 2] (bf16_gemm.h) or uint8 quant groups [N/16, K/32, block bytes]
  // (quant_gemm.h); biases float32 padded to the packed width, or None; q_norm / k_norm float32
  // [head_dim] or None; k_buf / v_buf are the layer's KV pool buffers [slots, num_kv_heads,
  // head_dim] (float32 or bfloat16); attn_norm / ffn_norm float32 [hidden], or None where folded.
  // qkv_parts / gate_up_parts: where that product comes in parts of different quantized formats,
  // each part's weight and its (unpadded) columns, in order (then qkv / gate_up is None).
  void add_layer(c10::optional<torch::Tensor> qkv, c10::optional<torch::Tensor> qkv_bias, torch::Tensor o,
                 c10::optional<torch::Tensor> o_bias, c10::optional<torch::Tensor> gate_up,
                 c10::optional<torch::Tensor> down, c10::optional<torch::Tensor> q_norm,
                 c10::optional<torch::Tensor> k_norm, torch::Tensor k_buf, torch::Tensor v_buf,
                 c10::optional<torch::Tensor> attn_norm, c10::optional<torch::Tensor> ffn_norm,
                 const Experts* experts, const std::vector<std::pair<torch::Tensor, int64_t>>& qkv_parts,
                 const std::vector<std::pair<torch::Tensor, int64_t>>& gate_up_parts);

  // hidden [B, H] float32 (the embeddings of the new tokens); rope [B, head_dim/2, 2] float32
  // (cos, sin of each token's position); slots int64 [B] (KV slots of the new tokens);
  // req_to_token int32 [rows, context]; rows int64 [B]; seq_lens int64 [B] (including the new
  // token). Returns the residual stream after the last layer, float32 [B, H].
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& rope, const torch::Tensor& slots,
                        const torch::Tensor& req_to_token, const torch::Tensor& rows,
                        const torch::Tensor& seq_lens);

  // The bf16 GEMM path (a Bf16Path; by default the fastest this CPU runs), settable for tests.
  void set_bf16_path(int64_t path);
  int64_t get_bf16_path() const;
  // Tensor parallel: this stack is rank `comm.rank()`'s shard (its heads and MLP columns); the
  // outputs of o_proj and down_proj are summed over the ranks through `comm` (rank 0's carrying
  // the residual), so every rank's residual stream stays the whole one.
  void set_tensor_parallel(std::shared_ptr<ShmAllReduce> comm);
  // How quantized weights multiply (a QMode; default weight-only float32).
  void set_quant_mode(int64_t mode);
  int64_t get_quant_mode() const;
  // Whether attention may take the flash kernels (radixlm::DecodeStack::flash_attention).
  void set_flash_attention(bool on) { core_.flash_attention = on; }
  bool get_flash_attention() const { return core_.flash_attention; }

 private:
  radixlm::DecodeStack core_;
  std::vector<torch::Tensor> kept_;  // every tensor a layer's views point into
  std::shared_ptr<ShmAllReduce> tp_;
};

}  // namespace radixlm::bindings
