// bf16 GEMM over pair panels (see bf16_gemm.h): AMX tiles, vdpbf16ps, or vdpbf16ps emulated.
// Torch-free (kernels/parallel.h): errors are std::runtime_error (Python sees RuntimeError).
#include "kernels/bf16_gemm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "simd/vec.h"
#if defined(RADIXLM_SIMD_AVX512)
#include <immintrin.h>  // AMX tiles, vdpbf16ps
#endif

#include "dispatch/cpu_features.h"
#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"
#include "simd/math.h"

namespace radixlm {
namespace {

using namespace simd;

// The vector paths' tiles (packed_gemm.h's PackedTile): passes of at most kRows rows over a unit
// of one or two adjacent panels (a, then b: 2 or 4 vectors), each the widest of 4, 2 or 1
// vectors with at most Acc accumulators. The native pass (vdpbf16ps) holds 6 x 64: 24
// accumulators and 4 weight vectors, 4 dot products per weight load, enough independent sums
// for the instruction's latency at two per cycle. The emulation needs twice the weight registers
// (each pair's even and odd halves widened to float32), so it holds fewer accumulators; its
// tiles are per level, chosen by timing candidates (the default model's decode-step products,
// 1-16 rows, on an AVX-512 machine running each level's build):
//  - AVX-512: 4 rows, 16 accumulators (+ 8 weights + 2 broadcasts of the 32 zmm): 4 x 64.
//  - AVX2 (a vector is two of the 16 ymm) and NEON (not timed): 4 rows, 8 accumulators: 1-2 x 64,
//    3-4 x 32 (4 accumulators: 6-15% slower at 2-8 rows; 16: 13-17% slower at 8-16).
//  - generic: 4 rows, 4 accumulators: 1 x 64, 2 x 32, 3-4 x 16 (8: ~1.7x slower at 16 rows).
template <int Rows, int Acc>
using Bf16Tile = PackedTile<Rows, Acc>;
using NativeTile = Bf16Tile<6, 24>;
#if defined(RADIXLM_SIMD_AVX512)
using EmulatedTile = Bf16Tile<4, 16>;
#elif defined(RADIXLM_SIMD_AVX2) || defined(RADIXLM_SIMD_NEON)
using EmulatedTile = Bf16Tile<4, 8>;
#else
using EmulatedTile = Bf16Tile<4, 4>;
#endif

constexpr int64_t kBlockCols = 2 * kPairPanel;
constexpr int64_t kRowChunk = 96;      // rows of one work unit of a large product (a multiple of 6, 4 and 32)
constexpr int64_t kSplitRows = 12;     // a product of few column blocks is also split by rows from this many
constexpr int64_t kAmxRowChunk = 128;  // rows of one AMX work unit (a multiple of 32)

void check(bool ok, const char* message) {
  if (!ok) throw std::runtime_error(message);
}

// xb [Mp, Kp] = bf16(x [M, K]), zero-padded (rows split between threads: a prefill chunk's
// activations are megabytes).
void round_rows(const float* x, int64_t M, int64_t K, int64_t Mp, int64_t Kp, uint16_t* xb) {
  std::memset(xb + M * Kp, 0, sizeof(uint16_t) * (Mp - M) * Kp);
  parallel_for(0, M, 64, [&](int64_t first, int64_t last) {
    for (int64_t m = first; m < last; ++m) {
      const float* src = x + m * K;
      uint16_t* dst = xb + m * Kp;
      int64_t k = 0;
      for (; k + 16 <= K; k += 16) vstore_bf16(dst + k, vload(src + k));
      for (; k < K; ++k) dst[k] = float_to_bf16(src[k]);
      std::memset(dst + K, 0, sizeof(uint16_t) * (Kp - K));
    }
  });
}

// The output block's start: residual (+ bias), or bias, or zero.
inline Vf start(const float* res, const float* bias, int64_t col) {
  const Vf a = res ? vload(res + col) : vzero();
  return bias ? vadd(a, vload(bias + col)) : a;
}

template <int R, int V>
inline void init_acc(Vf (&acc)[R][V], const float* res, int64_t ld_res, const float* bias) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = start(res ? res + r * ld_res : nullptr, bias, v * 16);
  }
}

template <int R, int V>
inline void store_acc(const Vf (&acc)[R][V], float* out, int64_t ld_out) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vstore(out + r * ld_out + v * 16, acc[r][v]);
  }
}

// Pair-row p's 16 lanes of the unit's vector j (panel a or b: j / 2; columns 16 * (j % 2) on).
inline const uint16_t* pair_row(const uint16_t* a, const uint16_t* b, int64_t p, int j) {
  return (j < 2 ? a : b) + p * 2 * kPairPanel + (j % 2) * 16 * 2;
}

// Read ahead the lines of pair-row p of a unit of kUnit vectors (a pass covering part of the
// unit reads its whole rows ahead: the other passes then find them in cache).
template <int kUnit>
inline void prefetch_pair_row(const uint16_t* a, const uint16_t* b, int64_t p) {
  prefetch_ahead<std::min(kUnit, 2)>(a + p * 2 * kPairPanel);
  if constexpr (kUnit == 4) prefetch_ahead<2>(b + p * 2 * kPairPanel);
}

// A pass: R rows x V vectors of the unit (kUnit vectors: panels a, then b) from its vector J on;
// out, res and bias start at the tile's first column. (Loops over rows and vectors are unrolled
// by pragma, and passes are never inlined: as packed_gemm.h's panel.)

// vdpbf16ps emulated: per lane, acc += x_odd * w_odd, then acc += x_even * w_even (bf16 products
// are exact in float32, so each step rounds once, as the instruction does).
template <int R, int V, int kUnit, int J>
__attribute__((noinline)) void emulated_pass(const uint16_t* xb, int64_t Kp, const uint16_t* a, const uint16_t* b,
                                             float* out, int64_t ld_out, const float* res, int64_t ld_res,
                                             const float* bias) {
  Vf acc[R][V];
  init_acc(acc, res, ld_res, bias);
  for (int64_t p = 0; p < Kp / 2; ++p) {
    Vf even[V], odd[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const Vi w = vload_i(pair_row(a, b, p, J + v));
      even[v] = vbf16_low(w);
      odd[v] = vbf16_high(w);
    }
    prefetch_pair_row<kUnit>(a, b, p);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vf xe = vset1(bf16_to_float(xb[r * Kp + 2 * p]));
      const Vf xo = vset1(bf16_to_float(xb[r * Kp + 2 * p + 1]));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = vfmadd(xe, even[v], vfmadd(xo, odd[v], acc[r][v]));
    }
  }
  store_acc(acc, out, ld_out);
}

#if defined(RADIXLM_SIMD_AVX512)
// vdpbf16ps (AVX512-BF16: only where cpu_has(kAvx512Bf16)).
template <int R, int V, int kUnit, int J>
__attribute__((noinline, target("avx512bf16"))) void native_pass(const uint16_t* xb, int64_t Kp, const uint16_t* a,
                                                                 const uint16_t* b, float* out, int64_t ld_out,
                                                                 const float* res, int64_t ld_res, const float* bias) {
  Vf acc[R][V];
  init_acc(acc, res, ld_res, bias);
  for (int64_t p = 0; p < Kp / 2; ++p) {
    Vi w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) w[v] = vload_i(pair_row(a, b, p, J + v));
    prefetch_pair_row<kUnit>(a, b, p);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, xb + r * Kp + 2 * p, sizeof pair);
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v].v = _mm512_dpbf16_ps(acc[r][v].v, xp, (__m512bh)w[v].v);
    }
  }
  store_acc(acc, out, ld_out);
}
#endif

// f(std::integral_constant<int, J>) for J = J0, J0 + V, ... below kUnit.
template <int J0, int V, int kUnit, typename F>
inline void for_each_tile(F&& f) {
  if constexpr (J0 < kUnit) {
    f(std::integral_constant<int, J0>{});
    for_each_tile<J0 + V, V, kUnit>(f);
  }
}

// The vector paths' kernels: a tile shape and the pass computing one tile.
template <typename T>
struct Emulated {
  using Tile = T;
  template <int R, int V, int kUnit, int J, typename... Args>
  static void pass(Args... args) { emulated_pass<R, V, kUnit, J>(args...); }
};
#if defined(RADIXLM_SIMD_AVX512)
struct Native {
  using Tile = NativeTile;
  template <int R, int V, int kUnit, int J, typename... Args>
  static void pass(Args... args) { native_pass<R, V, kUnit, J>(args...); }
};
#endif

// Rows [m0, m1) x the columns of NP adjacent panels (a, then b), in passes of at most
// Tile::kRows rows, as even as they can be (32 rows at 6: 6, 6, 5, 5, 5, 5, not 6 x 5 + 2); each
// pass covers the unit in tiles of Tile::vectors(rows, 2 * NP) vectors.
template <typename Kernel, int NP>
void vector_unit(const uint16_t* xb, int64_t m0, int64_t m1, int64_t Kp, const uint16_t* a, const uint16_t* b,
                 float* out, int64_t ld_out, const float* res, int64_t ld_res, const float* bias) {
  using Tile = typename Kernel::Tile;
  constexpr int kUnit = 2 * NP;
  int64_t passes = (m1 - m0 + Tile::kRows - 1) / Tile::kRows;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    dispatch_rows<Tile::kRows>(rows, [&](auto rows_c) {
      constexpr int R = decltype(rows_c)::value, V = Tile::vectors(R, kUnit);
      for_each_tile<0, V, kUnit>([&](auto j_c) {  // the tile of the unit's vectors J, J + 1, ..., J + V - 1
        constexpr int J = decltype(j_c)::value;
        Kernel::template pass<R, V, kUnit, J>(xb + r0 * Kp, Kp, a, b, out + r0 * ld_out + 16 * J, ld_out,
                                              res ? res + r0 * ld_res + 16 * J : nullptr, ld_res,
                                              bias ? bias + 16 * J : nullptr);
      });
    });
    r0 += rows;
  }
}

// The vector paths, with Kernel's tiles. A product of few rows (one chunk) gives each thread an
// equal run of panels, computed two at a time (a lone panel at a run's end by itself): 576
// output columns are 18 panels, 9 a thread, where units of two panels would split them 10 : 8.
// Else units of 64 columns x a chunk of rows; a product with few column blocks is also split by
// rows, so both threads get equal work (the second reader of a block finds its weights in the
// shared cache).
template <typename Kernel>
void vector_gemm(const uint16_t* xb, int64_t M, int64_t Kp, const uint16_t* w, int64_t panels, float* out,
                 int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  const int64_t panel_elems = Kp * kPairPanel, blocks = panels / 2;
  int64_t chunk = kRowChunk;
  if (M <= kRowChunk && blocks < 8 * num_threads() && M >= kSplitRows) chunk = (M + 1) / 2;
  if (chunk >= M) {
    parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; p += 2) {
        const uint16_t* a = w + p * panel_elems;
        const int64_t col = p * kPairPanel;
        float* o = out + col;
        const float* rs = residual ? residual + col : nullptr;
        const float* bs = bias ? bias + col : nullptr;
        if (p + 1 < last) {
          vector_unit<Kernel, 2>(xb, 0, M, Kp, a, a + panel_elems, o, ld_out, rs, ld_res, bs);
        } else {
          vector_unit<Kernel, 1>(xb, 0, M, Kp, a, nullptr, o, ld_out, rs, ld_res, bs);
        }
      }
    });
    return;
  }
  const int64_t chunks = (M + chunk - 1) / chunk;
  parallel_for(0, blocks * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t blk = u / chunks, m0 = (u % chunks) * chunk, m1 = std::min(M, m0 + chunk);
      const uint16_t* a = w + 2 * blk * panel_elems;
      const int64_t col = blk * kBlockCols;
      vector_unit<Kernel, 2>(xb, m0, m1, Kp, a, a + panel_elems, out + col, ld_out, residual ? residual + col : nullptr,
                             ld_res, bias ? bias + col : nullptr);
    }
  });
}

#if defined(RADIXLM_SIMD_AVX512)
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: the output block (rows m..m+15 / m+16..m+31 x columns 0-15 / 16-31); 4, 5: x rows;
// 6, 7: the panel's two column halves. Every tile is 16 rows x 64 bytes. (A namespace-scope object:
// gcc drops stores into a local that only ldtilecfg reads.)
TileConfig make_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

const TileConfig kTileConfig = make_tile_config();

// Rows [m0, m1) (m0 a multiple of 16; xb zero-padded to whole 16-row blocks) x one panel.
__attribute__((target("amx-tile,amx-bf16"))) void amx_unit(const uint16_t* xb, int64_t m0, int64_t m1, int64_t M,
                                                           int64_t Kp, const uint16_t* panel, float* out,
                                                           int64_t ld_out, const float* res, int64_t ld_res,
                                                           const float* bias) {
  alignas(64) float block[32 * 32];
  const int64_t steps = Kp / kPairK, ld_x = Kp * sizeof(uint16_t);
  for (int64_t m = m0; m < m1; m += 32) {
    const bool two = m + 16 < m1;
    const uint16_t* a = xb + m * Kp;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t t = 0; t < steps; ++t) {
        const uint16_t* b = panel + t * 16 * 2 * kPairPanel;
        _tile_loadd(4, a + t * kPairK, ld_x);
        _tile_loadd(5, a + 16 * Kp + t * kPairK, ld_x);
        _tile_loadd(6, b, 128);
        _tile_loadd(7, b + 32, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(2, block + 16 * 32, 128);
      _tile_stored(3, block + 16 * 32 + 16, 128);
    } else {
      for (int64_t t = 0; t < steps; ++t) {
        const uint16_t* b = panel + t * 16 * 2 * kPairPanel;
        _tile_loadd(4, a + t * kPairK, ld_x);
        _tile_loadd(6, b, 128);
        _tile_loadd(7, b + 32, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
      }
    }
    _tile_stored(0, block, 128);
    _tile_stored(1, block + 16, 128);
    for (int64_t r = m; r < std::min(m + 32, M); ++r) {
      const float* s = block + (r - m) * 32;
      const float* rs = res ? res + r * ld_res : nullptr;
      for (int v = 0; v < 2; ++v) vstore(out + r * ld_out + v * 16, vadd(vload(s + v * 16), start(rs, bias, v * 16)));
    }
  }
}

// Units of one panel x kAmxRowChunk rows; each thread configures its tiles once.
void amx_gemm(const uint16_t* xb, int64_t M, int64_t Kp, const uint16_t* w, int64_t panels, float* out,
              int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  const int64_t panel_elems = Kp * kPairPanel, chunks = (M + kAmxRowChunk - 1) / kAmxRowChunk;
  parallel_for(0, panels * chunks, 1, [&](int64_t first, int64_t last) {
    amx_configure();
    for (int64_t u = first; u < last; ++u) {
      const int64_t p = u / chunks, m0 = (u % chunks) * kAmxRowChunk, m1 = std::min(M, m0 + kAmxRowChunk);
      const int64_t col = p * kPairPanel;
      amx_unit(xb, m0, m1, M, Kp, w + p * panel_elems, out + col, ld_out, residual ? residual + col : nullptr, ld_res,
               bias ? bias + col : nullptr);
    }
    amx_release();
  });
}
#endif

}  // namespace

#if defined(RADIXLM_SIMD_AVX512)
__attribute__((target("amx-tile,amx-bf16"))) void amx_configure() { _tile_loadconfig(&kTileConfig); }

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }
#endif

bool bf16_path_runs(Bf16Path path) {
  switch (path) {
    case Bf16Path::kEmulated:
      return true;
#if defined(RADIXLM_SIMD_AVX512)
    case Bf16Path::kAvx512Bf16:
      return cpu_has(kAvx512Bf16);
    case Bf16Path::kAmx:
      return cpu_has(kAmxBf16);
#endif
    default:
      return false;
  }
}

Bf16Path bf16_path(int requested) {
  if (requested < 0) {
    for (Bf16Path p : {Bf16Path::kAmx, Bf16Path::kAvx512Bf16}) {
      if (bf16_path_runs(p)) return p;
    }
    return Bf16Path::kEmulated;
  }
  check(requested <= static_cast<int>(Bf16Path::kAmx), "unknown bf16 GEMM path (0 emulated, 1 vdpbf16ps, 2 AMX tiles)");
  const auto path = static_cast<Bf16Path>(requested);
  check(path != Bf16Path::kAmx || bf16_path_runs(path),
        "the AMX bf16 path needs the avx512 build of the kernels on a CPU (and OS) that lets this process use AMX tiles");
  check(path != Bf16Path::kAvx512Bf16 || bf16_path_runs(path),
        "the AVX512-BF16 (vdpbf16ps) path needs the avx512 build of the kernels on a CPU that has it");
  return path;
}

void bf16_gemm(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t panels, float* out, int64_t ld_out,
               const float* residual, int64_t ld_res, const float* bias, Bf16Path path) {
  if (M == 0 || panels == 0) return;
  check(bf16_path_runs(path), "this bf16 GEMM path does not run here (see bf16_path_runs)");
  const int64_t Kp = pair_k(K), Mp = (M + 15) / 16 * 16;
  std::vector<uint16_t> xb_store(Mp * Kp + 32);
  uint16_t* xb = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(xb_store.data()) + 63) & ~uintptr_t{63});
  round_rows(x, M, K, Mp, Kp, xb);
#if defined(RADIXLM_SIMD_AVX512)
  if (path == Bf16Path::kAmx) return amx_gemm(xb, M, Kp, w, panels, out, ld_out, residual, ld_res, bias);
#endif
  check(panels % 2 == 0, "pair panels come in pairs (N padded to a multiple of 64)");
#if defined(RADIXLM_SIMD_AVX512)
  if (path == Bf16Path::kAvx512Bf16) {
    return vector_gemm<Native>(xb, M, Kp, w, panels, out, ld_out, residual, ld_res, bias);
  }
#endif
  vector_gemm<Emulated<EmulatedTile>>(xb, M, Kp, w, panels, out, ld_out, residual, ld_res, bias);
}

}  // namespace radixlm
