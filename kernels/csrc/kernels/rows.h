// Row-wise ops of a prefill or extend step, fused and vectorized (rows.cpp): RMSNorm and
// SiLU(gate) * up over rows of float32 or bfloat16 (T = uint16_t bits: read and written as
// bfloat16, arithmetic in float32, one rounding at the end, to nearest even). Rows are split
// between threads; each row's arithmetic is the same on any thread count.
//
// Torch-free (kernels/parallel.h); the torch entry points are bindings/torch_rows.cpp.
#pragma once

#include <cstdint>

namespace radixlm {

// y [rows, n] (contiguous) = x / sqrt(mean(x^2) + eps) (* weight), x's rows ld_x apart; weight
// float32 [n] or null.
template <typename T>
void rms_norm_rows(const T* x, int64_t rows, int64_t n, int64_t ld_x, const float* weight, float eps, T* y);

// y [rows, n] (contiguous) = silu(gate) * up = gate / (1 + e^-gate) * up, where row r's gate is
// gu[r * ld_gu, + n) and its up the n values after.
template <typename T>
void silu_mul_rows(const T* gu, int64_t rows, int64_t n, int64_t ld_gu, T* y);

}  // namespace radixlm
