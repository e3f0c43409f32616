// The float32 packed-panel GEMM core shared by packed_linear.cpp and decode_stack.cpp:
// out[M, N] = x[M, K] @ W (+ bias) (+ residual), W[k, 64*b + j] = packed[b][k][j]. Each panel is
// one contiguous stream (read ahead in software: simd_math.h), read once for up to 6 rows of x
// (24 accumulators: 4 FMAs per weight vector loaded, enough independent sums for the FMA
// latency); the panels (and, for a product with few panels, the rows) are split across threads.
// (bfloat16 weights take bf16_gemm.h.)
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "simd_math.h"

namespace radixlm {

constexpr int64_t kPanel = 64;
constexpr int64_t kRowsPerPass = 6;

template <int kRows>
inline void panel(const float* x, int64_t K, const float* w, int64_t w_offset, float* out, int64_t ld_out,
           const float* residual, int64_t ld_res, const float* bias) {
  __m512 acc[kRows][4];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < 4; ++v) {
      __m512 a = residual ? _mm512_loadu_ps(residual + r * ld_res + v * 16) : _mm512_setzero_ps();
      acc[r][v] = bias ? _mm512_add_ps(a, _mm512_loadu_ps(bias + v * 16)) : a;
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const int64_t at = w_offset + k * kPanel;
    const __m512 w0 = _mm512_loadu_ps(w + at), w1 = _mm512_loadu_ps(w + at + 16);
    const __m512 w2 = _mm512_loadu_ps(w + at + 32), w3 = _mm512_loadu_ps(w + at + 48);
    prefetch_ahead<4>(w + at);
    for (int r = 0; r < kRows; ++r) {
      const __m512 xk = _mm512_set1_ps(x[r * K + k]);
      acc[r][0] = _mm512_fmadd_ps(w0, xk, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(w1, xk, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(w2, xk, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(w3, xk, acc[r][3]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(out + r * ld_out + v * 16, acc[r][v]);
  }
}

// Rows [m0, m1) x panel b, in passes of at most kRowsPerPass rows, as even as they can be.
inline void packed_unit(const float* x, int64_t m0, int64_t m1, int64_t K, const float* w, int64_t b, float* out,
                        int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  const int64_t col = b * kPanel;
  int64_t passes = (m1 - m0 + kRowsPerPass - 1) / kRowsPerPass;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    const float* xr = x + r0 * K;
    float* o = out + r0 * ld_out + col;
    const float* res = residual ? residual + r0 * ld_res + col : nullptr;
    const float* bb = bias ? bias + col : nullptr;
    switch (rows) {
      case 1: panel<1>(xr, K, w, b * K * kPanel, o, ld_out, res, ld_res, bb); break;
      case 2: panel<2>(xr, K, w, b * K * kPanel, o, ld_out, res, ld_res, bb); break;
      case 3: panel<3>(xr, K, w, b * K * kPanel, o, ld_out, res, ld_res, bb); break;
      case 4: panel<4>(xr, K, w, b * K * kPanel, o, ld_out, res, ld_res, bb); break;
      case 5: panel<5>(xr, K, w, b * K * kPanel, o, ld_out, res, ld_res, bb); break;
      default: panel<6>(xr, K, w, b * K * kPanel, o, ld_out, res, ld_res, bb); break;
    }
    r0 += rows;
  }
}

// x [M, K] (row stride K); out and residual rows `ld_out` / `ld_res` apart, N = panels * 64.
// Units are (panel, half of the rows) when there are few panels (576 columns are 9), so both
// threads get equal work; else whole panels.
inline void packed_gemm(const float* x, int64_t M, int64_t K, const float* w, int64_t panels, float* out, int64_t ld_out,
         const float* residual, int64_t ld_res, const float* bias) {
  const int64_t chunks = panels < 8 * at::get_num_threads() && M >= 2 * kRowsPerPass ? 2 : 1;
  const int64_t chunk = (M + chunks - 1) / chunks;
  at::parallel_for(0, panels * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t m0 = (u % chunks) * chunk;
      packed_unit(x, m0, std::min(M, m0 + chunk), K, w, u / chunks, out, ld_out, residual, ld_res, bias);
    }
  });
}


}  // namespace radixlm
