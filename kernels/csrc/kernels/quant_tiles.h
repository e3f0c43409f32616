// The tiling shared by the quantized GEMMs (quant_gemm.cpp: the 32-k block formats, kquant_gemm.cpp:
// the K-quants): a product is cut into units of 32 columns (two quant groups) x a chunk of rows,
// run on the threads, each unit in passes of a tile of rows x groups held in registers.
// Internal to those two files (compiled into each, per ISA level); torch-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"
#include "kernels/quant_gemm.h"
#include "simd/vec.h"

namespace radixlm::qtiles {

using namespace simd;

// A pass's tile: at most kRows rows x kGroups groups (16 columns each). Each weight vector loaded
// (and unpacked) serves the tile's rows; rows x groups accumulators (and, int8, as many block
// sums) must stay in registers beside the weights. Per level, chosen by timing the candidates on
// the default model's decode-step shapes (runtime/bench/gemm.py's) at 1, 4, 8 and 32 rows:
//  - AVX-512 (32 zmm): 6 x 2 in both modes (24 accumulators + 4 weights at 6 rows).
//  - AVX2 (a vector is two of the 16 ymm): one group a pass, so more rows fit: float 4 x 1 and
//    int8 6 x 1 (12 ymm of block sums + 2 of weights), ~1.7x the two-group tiles' speed at 32 rows.
//  - generic (a vector is four of the baseline's 16 xmm): 4 x 1 in both modes.
//  - NEON (four of the 32 q registers): 4 x 1 in both modes, as generic (not timed on an ARM CPU).
// Int8NarrowTile is the int8 tile of a product of at most its kRows rows (a decode step of one
// request, a verify step of few rows): on AVX-512, one group a pass (each group's blocks one
// contiguous stream) read the decode step's weights faster than two side by side: 3 x 1 took
// ~0.82x the 6 x 2 tile's time at 1 row and ~0.9x at 2-3 rows on the default model's products
// (quiet core of a loaded Zen 5, min of 30; from 5 rows on 6 x 2 is faster). Elsewhere it is the
// level's Int8Tile. A tile changes which rows share a pass, never a row's sequence of operations.
template <int Rows, int Groups>
struct QTile {
  static_assert(Rows >= 1 && Rows <= 6 && (Groups == 1 || Groups == 2));
  static constexpr int kRows = Rows;
  static constexpr int kGroups = Groups;
};
#if defined(RADIXLM_SIMD_AVX512)
using FloatTile = QTile<6, 2>;
using Int8Tile = QTile<6, 2>;
using Int8NarrowTile = QTile<2, 1>;
#elif defined(RADIXLM_SIMD_AVX2)
using FloatTile = QTile<4, 1>;
using Int8Tile = QTile<6, 1>;
using Int8NarrowTile = Int8Tile;
#else
using FloatTile = QTile<4, 1>;
using Int8Tile = QTile<4, 1>;
using Int8NarrowTile = Int8Tile;
#endif
constexpr int64_t kQRowChunk = 96;  // rows of one work unit of a large product (a multiple of 6, 4, 3 and 2)

inline void check(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error(message);
}

// x as a GEMM reads it: float32 rows, and for the int8 modes their int8 values (in [-127, 127])
// with, per row and block, the scale dx, the sum of the int8 values sq and dx * sq.
struct Activations {
  const float* x = nullptr;
  const int8_t* xq = nullptr;
  const float* dx = nullptr;
  const int32_t* sq = nullptr;
  const float* cx = nullptr;
  int64_t K = 0, nb = 0;

  Activations from_row(int64_t r) const {
    Activations a = *this;
    a.x = x + r * K;
    if (xq) {
      a.xq = xq + r * K;
      a.dx = dx + r * nb;
      a.sq = sq + r * nb;
      a.cx = cx + r * nb;
    }
    return a;
  }
};

// A pass's operands: activations from its first row, its groups' weight streams (g[1] unused by
// a one-group tile), and out / residual / bias at the pass's first row and column.
struct PassArgs {
  Activations a;
  const uint8_t* g[2];
  float* out;
  int64_t ld_out;
  const float* res;
  int64_t ld_res;
  const float* bias;
};

inline Vf half16(const uint8_t* p) { return vload_f16(reinterpret_cast<const uint16_t*>(p)); }

template <int R, int G>
inline void init_acc(Vf (&acc)[R][G], const PassArgs& p) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) {
      const Vf a = p.res ? vload(p.res + r * p.ld_res + 16 * g) : vzero();
      acc[r][g] = p.bias ? vadd(a, vload(p.bias + 16 * g)) : a;
    }
  }
}

template <int R, int G>
inline void store_acc(const Vf (&acc)[R][G], const PassArgs& p) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) vstore(p.out + r * p.ld_out + 16 * g, acc[r][g]);
  }
}

// Rows [m0, m1) x the 32 columns of groups g0, g1, in passes of at most Tile::kRows rows, as even
// as they can be, each over the two groups (a two-group tile) or one after the other.
template <typename Kernel>
void unit(const Activations& act, int64_t m0, int64_t m1, const uint8_t* g0, const uint8_t* g1, float* out,
          int64_t ld_out, const float* res, int64_t ld_res, const float* bias) {
  using Tile = typename Kernel::Tile;
  const uint8_t* groups[2] = {g0, g1};
  int64_t passes = (m1 - m0 + Tile::kRows - 1) / Tile::kRows;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    dispatch_rows<Tile::kRows>(rows, [&](auto rows_c) {
      for (int g = 0; g < 2; g += Tile::kGroups) {
        const int64_t col = 16 * g;
        const PassArgs p{act.from_row(r0), {groups[g], groups[std::min(g + 1, 1)]}, out + r0 * ld_out + col, ld_out,
                         res ? res + r0 * ld_res + col : nullptr, ld_res, bias ? bias + col : nullptr};
        Kernel::template pass<decltype(rows_c)::value>(p);
      }
    });
    r0 += rows;
  }
}

template <typename Kernel>
void run(const Activations& act, int64_t M, const uint8_t* w, int64_t groups, int64_t group_bytes, float* out,
         int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  // Units of 32 columns x a chunk of rows; a product with few column blocks is also split by
  // rows, so both threads get equal work. A group is `group_bytes` of weight stream.
  const int64_t tiles = groups / 2;
  int64_t chunk = kQRowChunk;
  if (M <= kQRowChunk && tiles < 8 * num_threads() && M >= 2 * Kernel::Tile::kRows) chunk = (M + 1) / 2;
  const int64_t chunks = (M + chunk - 1) / chunk;
  parallel_for(0, tiles * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t tile = u / chunks, m0 = (u % chunks) * chunk, m1 = std::min(M, m0 + chunk);
      const uint8_t* g0 = w + 2 * tile * group_bytes;
      const int64_t col = tile * 2 * kQGroup;
      unit<Kernel>(act, m0, m1, g0, g0 + group_bytes, out + col, ld_out, residual ? residual + col : nullptr, ld_res,
                   bias ? bias + col : nullptr);
    }
  });
}

}  // namespace radixlm::qtiles
