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
#include <type_traits>

#include "simd_math.h"

namespace radixlm {

constexpr int64_t kPanel = 64;
constexpr int64_t kRowsPerPass = 6;

// kRows rows x V vectors of 16 columns (V = 4: a whole panel; 2: one half of it) starting at
// w + w_offset; out, residual and bias start at the same columns.
template <int kRows, int V = 4>
inline void panel(const float* x, int64_t K, const float* w, int64_t w_offset, float* out, int64_t ld_out,
           const float* residual, int64_t ld_res, const float* bias) {
  __m512 acc[kRows][V];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < V; ++v) {
      __m512 a = residual ? _mm512_loadu_ps(residual + r * ld_res + v * 16) : _mm512_setzero_ps();
      acc[r][v] = bias ? _mm512_add_ps(a, _mm512_loadu_ps(bias + v * 16)) : a;
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const int64_t at = w_offset + k * kPanel;
    __m512 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(w + at + 16 * v);
    prefetch_ahead<V>(w + at);
    for (int r = 0; r < kRows; ++r) {
      const __m512 xk = _mm512_set1_ps(x[r * K + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(wv[v], xk, acc[r][v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + r * ld_out + v * 16, acc[r][v]);
  }
}

// Rows [m0, m1) x panel b (half = -1), or x its columns 0-31 (half = 0) or 32-63 (half = 1), in
// passes of at most kRowsPerPass rows, as even as they can be.
inline void packed_unit(const float* x, int64_t m0, int64_t m1, int64_t K, const float* w, int64_t b, float* out,
                        int64_t ld_out, const float* residual, int64_t ld_res, const float* bias, int half = -1) {
  const int64_t col = b * kPanel + (half == 1 ? kPanel / 2 : 0), w_offset = b * K * kPanel + (half == 1 ? kPanel / 2 : 0);
  int64_t passes = (m1 - m0 + kRowsPerPass - 1) / kRowsPerPass;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    const float* xr = x + r0 * K;
    float* o = out + r0 * ld_out + col;
    const float* res = residual ? residual + r0 * ld_res + col : nullptr;
    const float* bb = bias ? bias + col : nullptr;
    auto run = [&](auto rows_c) {
      constexpr int R = decltype(rows_c)::value;
      if (half < 0) {
        panel<R>(xr, K, w, w_offset, o, ld_out, res, ld_res, bb);
      } else {
        panel<R, 2>(xr, K, w, w_offset, o, ld_out, res, ld_res, bb);
      }
    };
    switch (rows) {
      case 1: run(std::integral_constant<int, 1>{}); break;
      case 2: run(std::integral_constant<int, 2>{}); break;
      case 3: run(std::integral_constant<int, 3>{}); break;
      case 4: run(std::integral_constant<int, 4>{}); break;
      case 5: run(std::integral_constant<int, 5>{}); break;
      default: run(std::integral_constant<int, 6>{}); break;
    }
    r0 += rows;
  }
}

// x [M, K] (row stride K); out and residual rows `ld_out` / `ld_res` apart, N = panels * 64.
// Units are (panel, half of the rows) when there are few panels (576 columns are 9) and rows
// enough, so both threads get equal work. A product of few rows instead splits the columns in
// 32-column halves, each thread an equal run of them (9 panels: 4.5 each, where whole panels
// would split 5 : 4); whole panels where a run covers both halves.
inline void packed_gemm(const float* x, int64_t M, int64_t K, const float* w, int64_t panels, float* out, int64_t ld_out,
         const float* residual, int64_t ld_res, const float* bias) {
  const int64_t chunks = panels < 8 * at::get_num_threads() && M >= 2 * kRowsPerPass ? 2 : 1;
  if (chunks == 1) {
    at::parallel_for(0, 2 * panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t h = first; h < last;) {
        if (h % 2 == 0 && h + 1 < last) {
          packed_unit(x, 0, M, K, w, h / 2, out, ld_out, residual, ld_res, bias);
          h += 2;
        } else {
          packed_unit(x, 0, M, K, w, h / 2, out, ld_out, residual, ld_res, bias, static_cast<int>(h % 2));
          h += 1;
        }
      }
    });
    return;
  }
  const int64_t chunk = (M + chunks - 1) / chunks;
  at::parallel_for(0, panels * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t m0 = (u % chunks) * chunk;
      packed_unit(x, m0, std::min(M, m0 + chunk), K, w, u / chunks, out, ld_out, residual, ld_res, bias);
    }
  });
}


}  // namespace radixlm
