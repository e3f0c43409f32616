// DecodeStack: every decoder layer of a decode step (each request one new token) in one C++ call,
// for a Llama-family model whose linear layers are packed (float32: packed_gemm.h; bfloat16:
// bf16_gemm.h, AMX where the CPU has it; block-quantized: quant_gemm.h). Per layer: RMSNorm, fused q/k/v product (+ bias),
// Qwen3's per-head q/k norms, RoPE on interleaved pairs, K/V written to the pool slots, attention
// read in place from the pool (paged_attention.cpp: GQA, flash-style float32 softmax), o_proj
// accumulated onto the residual, RMSNorm, fused gate/up product, SiLU(gate) * up, down_proj
// accumulated onto the residual. The residual stream stays float32 throughout.
//
// Why: a decode step of a small model on a CPU is bound by per-op overhead (Python, dispatch,
// small kernels, dtype conversions) as much as by reading the weights; here a step has one call
// per step instead of ~20 torch ops per layer.
#pragma once

#include <torch/extension.h>

#include "kernels/bf16_gemm.h"
#include "kernels/quant_gemm.h"
#include "kernels/shm_all_reduce.h"

#include <memory>
#include <vector>

namespace radixlm {

// paged_attention.cpp; amx / vnni: requests with at least kAmxMinTokens new tokens over a bfloat16
// pool take the AMX kernel, or the vdpbf16ps one (amx_attention.h), where the CPU runs it.
torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                              const torch::Tensor& req_to_token, const torch::Tensor& rows, const torch::Tensor& seq_lens,
                              const torch::Tensor& extend_lens, const torch::Tensor& extend_start, double scale,
                              bool amx = false, bool vnni = false);

// Calls of paged_attention that took the vdpbf16ps cascade over a shared prefix (since the
// process started): a statistic for tests.
int64_t num_cascade_calls();

class DecodeStack {
 public:
  // The RMSNorm weights before qkv and gate_up are folded into those products where they are
  // float; quantized ones cannot absorb them, and the norms get them (add_layer's attn_norm / ffn_norm).
  DecodeStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t intermediate,
              double rms_eps, double scale);

  // One layer, in order. Weights are float32 packed [N/64, K, 64] (packed_gemm.h), bfloat16 VNNI
  // panels [N/32, Kp/2, 32, 2] (bf16_gemm.h) or uint8 quant groups [N/16, K/32, block bytes]
  // (quant_gemm.h); biases float32 padded to the packed width, or None; q_norm / k_norm float32
  // [head_dim] or None; k_buf / v_buf are the layer's KV pool buffers [slots, num_kv_heads,
  // head_dim] (float32 or bfloat16); attn_norm / ffn_norm float32 [hidden], or None where folded.
  void add_layer(torch::Tensor qkv, c10::optional<torch::Tensor> qkv_bias, torch::Tensor o,
                 c10::optional<torch::Tensor> o_bias, torch::Tensor gate_up, torch::Tensor down,
                 c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, torch::Tensor k_buf,
                 torch::Tensor v_buf, c10::optional<torch::Tensor> attn_norm, c10::optional<torch::Tensor> ffn_norm);

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

 private:
  void linear(const torch::Tensor& w, const float* x, int64_t M, int64_t K, float* out, int64_t ld_out,
              const float* residual, int64_t ld_res, const torch::Tensor& bias) const;

  struct Layer {
    torch::Tensor qkv, qkv_bias, o, o_bias, gate_up, down, q_norm, k_norm, k_buf, v_buf, attn_norm, ffn_norm;
  };
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_, intermediate_;
  float eps_, scale_;
  Bf16Path bf16_path_;
  QMode quant_mode_ = QMode::kFloat;
  std::vector<Layer> layers_;
  std::shared_ptr<ShmAllReduce> tp_;
};

}  // namespace radixlm
