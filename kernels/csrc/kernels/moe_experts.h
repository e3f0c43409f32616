// A sparse mixture-of-experts layer's experts in one call (one parallel region): for each token
// t of x [T, H] and each of its k routed experts e = ids[t][j] (weight w[t][j]),
//     y[t] = sum_j w[t][j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))
// each routed expert's weights read once for all the rows routed to it.
//
// Work: the (token, expert) pairs are grouped by expert (a counting sort), their x rows gathered;
// then one parallel region runs three kinds of items off one shared counter, in this order:
//  1. (routed expert, a slice of its intermediate width): the gate and up columns' products
//     for the expert's rows and silu(gate) * up of them;
//  2. (routed expert, a slice of H): its down product's columns, once every item 1 of that
//     expert is done;
//     (a slice: 64, 128 or 256 columns, the widest that leaves each thread 16 items of the kind);
//  3. (a run of tokens): the weighted sum of each token's k outputs in its choices' order, once
//     every item 2 is done.
// A thread waits only for items claimed before the one it holds (claimed items are being run), so
// the region cannot deadlock at any thread count; at T = 1 the k experts' columns share the
// threads, so every core streams weights.
// Each product is the layer's own kernel on a column slice of the weight (packed_gemm.h float32
// panels, bf16_gemm.h pair panels, quant_gemm.h quant groups of any format and mode), which runs
// serially inside the region: every output is the value the expert's own linear layers give. In
// the int8 modes the slices share x's quantized rows (q_quantize_x, each token once per call,
// before the region, then gathered) and, in kInt8Block, the activations' (each 32-block quantized by the item computing it):
// the same int8 values and scales each slice's product would make itself, made once. A slice of
// one row in Q4_K (a token alone on its expert: every expert at batch 1) is q4k_int8_row's
// (kquant_gemm.h), the same bits at memory speed.
//
// Torch-free (kernels/parallel.h): errors are std::runtime_error, thrown before the region starts.
#pragma once

#include <cstdint>

#include "kernels/bf16_gemm.h"
#include "kernels/quant_gemm.h"

namespace radixlm {

enum class MoeWeights : int { kFloat32 = 0, kBf16 = 1, kQuant = 2 };

// One layer's experts: expert e's fused gate_up weight ([H] -> [2I]: gate columns, then up) at
// arena + offsets[2e], its down weight ([I] -> [H]) at arena + offsets[2e + 1], in `kind`'s packed
// layout (N padded to a multiple of 64 columns). I must be a multiple of 64 (float32) or 32.
struct MoeExperts {
  int64_t hidden = 0, inter = 0, num_experts = 0;
  MoeWeights kind = MoeWeights::kFloat32;
  QFormat formats[2] = {QFormat::kQ8_0, QFormat::kQ8_0};  // kQuant: gate_up's and down's blocks (Q4_K_M
  QMode mode = QMode::kFloat;  // files mix them: Q4_K gate / up, Q6_K down), and how they multiply
  Bf16Path bf16_path = Bf16Path::kEmulated;  // kBf16
  const uint8_t* arena = nullptr;
  const int64_t* offsets = nullptr;  // [num_experts][2] bytes
};

// x [T, H] float32 (rows H apart); ids int64 [T, k] in [0, num_experts), distinct within a row;
// weights float32 [T, k]; y [T, H] float32 (rows H apart).
void moe_experts(const MoeExperts& layer, const float* x, int64_t T, const int64_t* ids, const float* weights,
                 int64_t k, float* y);

}  // namespace radixlm
