// The float32 packed-panel GEMM core shared by torch_ops.cpp and decode_stack.cpp:
// out[M, N] = x[M, K] @ W (+ bias) (+ residual), W[k, 64*b + j] = packed[b][k][j]. Each panel is
// one contiguous stream (read ahead in software: simd/math.h). A pass holds a tile of the output
// (rows x 16*V columns: PackedTile, per level) in rows*V vector accumulators for the whole of K,
// so each weight vector loaded feeds `rows` FMAs; the panels (and, for a product with few
// panels, the rows) are split across threads. (bfloat16 weights take bf16_gemm.h.)
//
// Every output column is the same sequence of FMAs whatever the tile and the thread split:
// start (residual + bias, or bias, or 0), then + x[k] * W[k] for k = 0, 1, ..., K-1. So the
// result has the same bits on every thread count and tile shape (at one ISA level).
//
// Torch-free (kernels/parallel.h only): a C++ driver built with -DRADIXLM_NO_TORCH runs it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/parallel.h"
#include "simd/math.h"

namespace radixlm {

constexpr int64_t kPanel = 64;

// The tiles of passes: at most Rows rows of x, and at most Acc vector accumulators (which must
// stay in registers beside the weight vectors and a broadcast). A pass of r rows spans V = 4, 2
// or 1 vectors (16 * V columns) of its unit (a panel, or half of one), the widest with r * V <=
// Acc: so a product of few rows streams each panel row whole, in order (memory-bound), and one
// of many rows fills the registers (compute-bound).
template <int Rows, int Acc>
struct PackedTile {
  static_assert(Rows >= 1 && Acc >= 1);
  static constexpr int kRows = Rows;
  // the vectors of a pass of r rows over a unit `unit` (4 or 2) vectors wide
  static constexpr int vectors(int r, int unit) { return std::min(unit, Acc >= 4 * r ? 4 : Acc >= 2 * r ? 2 : 1); }
};

// Per level, chosen by timing candidates (the default model's decode-step products through
// packed_gemm_tiled, 1-64 rows; an AVX-512 machine running each level's build):
//  - AVX-512: 6 rows, 24 accumulators (of the 32 zmm): 6 x 64, 4 FMAs per weight vector loaded.
//  - AVX2 (a vector is two of the 16 ymm): 6 rows, 8 accumulators: 1-2 x 64, 3-4 x 32, 5-6 x 16
//    (6 x 64 would need 48 ymm; 6 x 16 alone reads each panel row in four passes, ~1.6x slower
//    at 1-2 rows).
//  - NEON (a vector is four of the 32 q registers: the same bytes as AVX2's 16 ymm): as AVX2
//    (not timed: no ARM machine at hand).
//  - generic (the x86-64 baseline's 16 xmm, a vector is four): 2 rows, 2 accumulators: 1 x 32,
//    2 x 16 (3 x 16 spills: 2.5-3x slower at 16-64 rows).
#if defined(RADIXLM_SIMD_AVX512)
using PackedLevelTile = PackedTile<6, 24>;
#elif defined(RADIXLM_SIMD_AVX2) || defined(RADIXLM_SIMD_NEON)
using PackedLevelTile = PackedTile<6, 8>;
#else
using PackedLevelTile = PackedTile<2, 2>;
#endif

// f(std::integral_constant<int, R>) for R = min(rows, N), rows >= 1: a pass's row count as a
// template argument.
template <int N, typename F>
inline void dispatch_rows(int64_t rows, F&& f) {
  if constexpr (N > 1) {
    if (rows < N) return dispatch_rows<N - 1>(rows, f);
  }
  f(std::integral_constant<int, N>{});
}

// kRows rows x V vectors of 16 columns starting at w + w_offset (a panel's column 16 * j for
// some j); out, residual and bias start at the same columns. Reads ahead the kAhead lines of each
// weight row from w + ahead_offset: the unit's whole row where the pass covers part of it (its
// other columns' passes then find them in cache, rather than each stream a quarter of the lines).
// Code generation: the loops over rows and vectors are unrolled by pragma (left to gcc's
// heuristics, a body of two-register vectors (AVX2) stays a loop until after scalar replacement,
// and the accumulators go through the stack on every k); and a tile is never inlined, so it is
// the same code wherever it runs (inlined copies of the generic build's came out 1x-3x apart).
template <int kRows, int V, int kAhead>
__attribute__((noinline)) void panel(const float* x, int64_t K, const float* w, int64_t w_offset, int64_t ahead_offset,
                                     float* out, int64_t ld_out, const float* residual, int64_t ld_res,
                                     const float* bias) {
  using namespace simd;
  Vf acc[kRows][V];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const Vf a = residual ? vload(residual + r * ld_res + v * 16) : vzero();
      acc[r][v] = bias ? vadd(a, vload(bias + v * 16)) : a;
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const int64_t at = w_offset + k * kPanel;
    Vf wv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) wv[v] = vload(w + at + 16 * v);
    prefetch_ahead<kAhead>(w + ahead_offset + k * kPanel);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const Vf xk = vset1(x[r * K + k]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = vfmadd(wv[v], xk, acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vstore(out + r * ld_out + v * 16, acc[r][v]);
  }
}

// Rows [m0, m1) x the unit of kUnit vectors (4: panel b; 2: its columns 0-31, or 32-63 where
// `second`), in passes of at most Tile::kRows rows, as even as they can be (13 rows at 6: 5, 4,
// 4); each pass covers the unit in tiles of Tile::vectors(rows, kUnit) vectors.
template <typename Tile, int kUnit>
inline void unit_passes(const float* x, int64_t m0, int64_t m1, int64_t K, const float* w, int64_t b, bool second,
                        float* out, int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  const int64_t first = second ? kPanel / 2 : 0, unit_offset = b * K * kPanel + first;
  int64_t passes = (m1 - m0 + Tile::kRows - 1) / Tile::kRows;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    dispatch_rows<Tile::kRows>(rows, [&](auto rows_c) {
      constexpr int R = decltype(rows_c)::value, V = Tile::vectors(R, kUnit);
      for (int64_t c = first; c < first + 16 * kUnit; c += 16 * V) {
        const int64_t col = b * kPanel + c;
        panel<R, V, kUnit>(x + r0 * K, K, w, b * K * kPanel + c, unit_offset, out + r0 * ld_out + col, ld_out,
                           residual ? residual + r0 * ld_res + col : nullptr, ld_res, bias ? bias + col : nullptr);
      }
    });
    r0 += rows;
  }
}

// Rows [m0, m1) x panel b (half = -1), or x its columns 0-31 (half = 0) or 32-63 (half = 1).
template <typename Tile>
inline void packed_unit(const float* x, int64_t m0, int64_t m1, int64_t K, const float* w, int64_t b, float* out,
                        int64_t ld_out, const float* residual, int64_t ld_res, const float* bias, int half = -1) {
  if (half < 0) {
    unit_passes<Tile, 4>(x, m0, m1, K, w, b, false, out, ld_out, residual, ld_res, bias);
  } else {
    unit_passes<Tile, 2>(x, m0, m1, K, w, b, half == 1, out, ld_out, residual, ld_res, bias);
  }
}

// packed_gemm (below) with a given tile: every level's candidates, for timing them.
// Units are (panel, half of the rows) when there are few panels (576 columns are 9) and rows
// enough, so both threads get equal work. A product of few rows instead splits the columns in
// 32-column halves, each thread an equal run of them (9 panels: 4.5 each, where whole panels
// would split 5 : 4); whole panels where a run covers both halves.
template <typename Tile>
inline void packed_gemm_tiled(const float* x, int64_t M, int64_t K, const float* w, int64_t panels, float* out,
                              int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  const int64_t chunks = panels < 8 * num_threads() && M >= 2 * Tile::kRows ? 2 : 1;
  if (chunks == 1) {
    parallel_for(0, 2 * panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t h = first; h < last;) {
        if (h % 2 == 0 && h + 1 < last) {
          packed_unit<Tile>(x, 0, M, K, w, h / 2, out, ld_out, residual, ld_res, bias);
          h += 2;
        } else {
          packed_unit<Tile>(x, 0, M, K, w, h / 2, out, ld_out, residual, ld_res, bias, static_cast<int>(h % 2));
          h += 1;
        }
      }
    });
    return;
  }
  const int64_t chunk = (M + chunks - 1) / chunks;
  parallel_for(0, panels * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t m0 = (u % chunks) * chunk;
      packed_unit<Tile>(x, m0, std::min(M, m0 + chunk), K, w, u / chunks, out, ld_out, residual, ld_res, bias);
    }
  });
}

// x [M, K] (row stride K); w [panels][K][64]; out and residual rows `ld_out` / `ld_res` apart
// (out may alias residual), N = panels * 64; bias [N] or null.
inline void packed_gemm(const float* x, int64_t M, int64_t K, const float* w, int64_t panels, float* out, int64_t ld_out,
                        const float* residual, int64_t ld_res, const float* bias) {
  packed_gemm_tiled<PackedLevelTile>(x, M, K, w, panels, out, ld_out, residual, ld_res, bias);
}

}  // namespace radixlm
