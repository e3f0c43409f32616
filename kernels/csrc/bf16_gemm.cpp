// bf16 GEMM over VNNI panels (see bf16_gemm.h): AMX tiles, vdpbf16ps, or vdpbf16ps emulated.
#include "bf16_gemm.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "simd_math.h"

namespace radixlm {
namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // Linux: ask for an extended state component
constexpr long kXfeatureXtileData = 18;     // the AMX tile data component
// The vector paths compute blocks of kRowsNative (vdpbf16ps) or kRowsEmulated rows x 64 columns (two
// panels side by side): 4 accumulators a row, so a pass does 4 x rows dot products per k-pair
// for 4 weight loads and `rows` broadcasts (24 : 10 at 6 rows), and holds 24 independent sums,
// enough to cover the instruction's latency at two per cycle. The emulation needs 8 weight
// registers (even and odd halves), so it takes 4 rows. A lone panel (the end of a thread's odd
// run of panels) takes the same pass over 32 columns, 2 accumulators a row.
constexpr int kRowsNative = 6;
constexpr int kRowsEmulated = 4;
constexpr int64_t kBlockCols = 2 * kVnniPanel;
constexpr int64_t kRowChunk = 96;  // rows of one work unit of a large product (a multiple of 6, 4 and 32)
constexpr int64_t kAmxRowChunk = 128;  // rows of one AMX work unit (a multiple of 32)

uint64_t xcr0() {
  uint32_t lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  const bool osxsave = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27));
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    const uint64_t tile_state = (1ull << 17) | (1ull << 18);  // XTILECFG, XTILEDATA
    f.amx_bf16 = tile && bf16 && osxsave && (xcr0() & tile_state) == tile_state;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = a & (1u << 5);
  if (f.amx_bf16) f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  return f;
}

// 16 floats -> 16 bfloat16, nearest even (NaN stays NaN), in AVX-512F.
inline __m256i to_bf16x16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

// xb [Mp, Kp] = bf16(x [M, K]), zero-padded (rows split between threads: a prefill chunk's
// activations are megabytes).
void round_rows(const float* x, int64_t M, int64_t K, int64_t Mp, int64_t Kp, uint16_t* xb) {
  std::memset(xb + M * Kp, 0, sizeof(uint16_t) * (Mp - M) * Kp);
  at::parallel_for(0, M, 64, [&](int64_t first, int64_t last) {
    for (int64_t m = first; m < last; ++m) {
      const float* src = x + m * K;
      uint16_t* dst = xb + m * Kp;
      int64_t k = 0;
      for (; k + 16 <= K; k += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), to_bf16x16(_mm512_loadu_ps(src + k)));
      for (; k < K; ++k) dst[k] = float_to_bf16(src[k]);
      std::memset(dst + K, 0, sizeof(uint16_t) * (Kp - K));
    }
  });
}

// The output block's start: residual (+ bias), or bias, or zero.
inline __m512 start(const float* res, const float* bias, int64_t col) {
  __m512 a = res ? _mm512_loadu_ps(res + col) : _mm512_setzero_ps();
  return bias ? _mm512_add_ps(a, _mm512_loadu_ps(bias + col)) : a;
}

template <int V>
inline void init_acc(__m512* acc, int rows, const float* res, int64_t ld_res, const float* bias) {
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < V; ++v) acc[V * r + v] = start(res ? res + r * ld_res : nullptr, bias, v * 16);
  }
}

template <int V>
inline void store_acc(const __m512* acc, int rows, float* out, int64_t ld_out) {
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + r * ld_out + v * 16, acc[V * r + v]);
  }
}

inline __m512i pair_of(const uint16_t* xb, int64_t p) {
  int32_t pair;
  std::memcpy(&pair, xb + 2 * p, sizeof pair);
  return _mm512_set1_epi32(pair);
}

// One pass of the vector paths: R rows x the 32 * NP columns of NP adjacent panels from a (b = a's
// second panel), with vdpbf16ps...
template <int R, int NP>
__attribute__((target("avx512bf16"))) void native_pass(const uint16_t* xb, int64_t Kp, const uint16_t* a,
                                                       const uint16_t* b, float* out, int64_t ld_out, const float* res,
                                                       int64_t ld_res, const float* bias) {
  constexpr int V = 2 * NP;
  __m512 acc[V * R];
  init_acc<V>(acc, R, res, ld_res, bias);
  for (int64_t p = 0; p < Kp / 2; ++p) {
    __m512i w[V];
    for (int v = 0; v < V; ++v) w[v] = _mm512_loadu_si512((v < 2 ? a : b) + p * 64 + (v % 2) * 32);
    prefetch_ahead<2>(a + p * 64);
    if constexpr (NP == 2) prefetch_ahead<2>(b + p * 64);
    for (int r = 0; r < R; ++r) {
      const __m512bh xp = (__m512bh)pair_of(xb + r * Kp, p);
      for (int v = 0; v < V; ++v) acc[V * r + v] = _mm512_dpbf16_ps(acc[V * r + v], xp, (__m512bh)w[v]);
    }
  }
  store_acc<V>(acc, R, out, ld_out);
}

// ... or with vdpbf16ps emulated in AVX-512F: per lane, acc += x_odd * w_odd, then
// acc += x_even * w_even (bf16 products are exact in float32, so each step rounds once, as the
// instruction does).
template <int R, int NP>
void emulated_pass(const uint16_t* xb, int64_t Kp, const uint16_t* a, const uint16_t* b, float* out, int64_t ld_out,
                   const float* res, int64_t ld_res, const float* bias) {
  constexpr int V = 2 * NP;
  __m512 acc[V * R];
  init_acc<V>(acc, R, res, ld_res, bias);
  const __m512i odd_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < Kp / 2; ++p) {
    __m512 even[V], odd[V];
    for (int v = 0; v < V; ++v) {
      const __m512i w = _mm512_loadu_si512((v < 2 ? a : b) + p * 64 + (v % 2) * 32);
      even[v] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      odd[v] = _mm512_castsi512_ps(_mm512_and_si512(w, odd_mask));
    }
    prefetch_ahead<2>(a + p * 64);
    if constexpr (NP == 2) prefetch_ahead<2>(b + p * 64);
    for (int r = 0; r < R; ++r) {
      const __m512 xe = _mm512_set1_ps(bf16_to_float(xb[r * Kp + 2 * p]));
      const __m512 xo = _mm512_set1_ps(bf16_to_float(xb[r * Kp + 2 * p + 1]));
      for (int v = 0; v < V; ++v) acc[V * r + v] = _mm512_fmadd_ps(xe, even[v], _mm512_fmadd_ps(xo, odd[v], acc[V * r + v]));
    }
  }
  store_acc<V>(acc, R, out, ld_out);
}

template <int R, int NP>
void vector_pass(bool native, const uint16_t* xb, int64_t Kp, const uint16_t* a, const uint16_t* b, float* out,
                 int64_t ld_out, const float* res, int64_t ld_res, const float* bias) {
  if constexpr (R <= kRowsEmulated) {
    if (!native) return emulated_pass<R, NP>(xb, Kp, a, b, out, ld_out, res, ld_res, bias);
  }
  native_pass<R, NP>(xb, Kp, a, b, out, ld_out, res, ld_res, bias);
}

// Rows [m0, m1) x the columns of NP adjacent panels (a, then b), in passes of at most kRowsNative
// (kRowsEmulated) rows, as even as they can be (32 rows: 6, 6, 5, 5, 5, 5, not 6 x 5 + 2).
template <int NP>
void vector_unit(bool native, const uint16_t* xb, int64_t m0, int64_t m1, int64_t Kp, const uint16_t* a,
                 const uint16_t* b, float* out, int64_t ld_out, const float* res, int64_t ld_res, const float* bias) {
  const int64_t max_rows = native ? kRowsNative : kRowsEmulated;
  int64_t passes = (m1 - m0 + max_rows - 1) / max_rows;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    const uint16_t* x = xb + r0 * Kp;
    float* o = out + r0 * ld_out;
    const float* rs = res ? res + r0 * ld_res : nullptr;
    switch (rows) {
      case 1: vector_pass<1, NP>(native, x, Kp, a, b, o, ld_out, rs, ld_res, bias); break;
      case 2: vector_pass<2, NP>(native, x, Kp, a, b, o, ld_out, rs, ld_res, bias); break;
      case 3: vector_pass<3, NP>(native, x, Kp, a, b, o, ld_out, rs, ld_res, bias); break;
      case 4: vector_pass<4, NP>(native, x, Kp, a, b, o, ld_out, rs, ld_res, bias); break;
      case 5: vector_pass<5, NP>(native, x, Kp, a, b, o, ld_out, rs, ld_res, bias); break;
      default: vector_pass<6, NP>(native, x, Kp, a, b, o, ld_out, rs, ld_res, bias); break;
    }
    r0 += rows;
  }
}

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
  const int64_t steps = Kp / kVnniK, ld_x = Kp * sizeof(uint16_t);
  for (int64_t m = m0; m < m1; m += 32) {
    const bool two = m + 16 < m1;
    const uint16_t* a = xb + m * Kp;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t t = 0; t < steps; ++t) {
        const uint16_t* b = panel + t * 16 * 2 * kVnniPanel;
        _tile_loadd(4, a + t * kVnniK, ld_x);
        _tile_loadd(5, a + 16 * Kp + t * kVnniK, ld_x);
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
        const uint16_t* b = panel + t * 16 * 2 * kVnniPanel;
        _tile_loadd(4, a + t * kVnniK, ld_x);
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
      for (int v = 0; v < 2; ++v) {
        _mm512_storeu_ps(out + r * ld_out + v * 16, _mm512_add_ps(_mm512_loadu_ps(s + v * 16), start(rs, bias, v * 16)));
      }
    }
  }
}

}  // namespace

__attribute__((target("amx-tile,amx-bf16"))) void amx_configure() { _tile_loadconfig(&kTileConfig); }

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Bf16Path bf16_path(int requested) {
  const CpuFeatures& f = cpu_features();
  const Bf16Path best = f.amx_permitted ? Bf16Path::kAmx : f.avx512bf16 ? Bf16Path::kAvx512Bf16 : Bf16Path::kEmulated;
  if (requested < 0) return best;
  TORCH_CHECK(requested <= static_cast<int>(Bf16Path::kAmx), "unknown bf16 GEMM path ", requested);
  const auto path = static_cast<Bf16Path>(requested);
  TORCH_CHECK(path != Bf16Path::kAmx || f.amx_permitted, "this CPU (or its OS) does not let this process use AMX tiles");
  TORCH_CHECK(path != Bf16Path::kAvx512Bf16 || f.avx512bf16, "this CPU lacks AVX512-BF16 (vdpbf16ps)");
  return path;
}

void bf16_gemm(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t panels, float* out, int64_t ld_out,
               const float* residual, int64_t ld_res, const float* bias, Bf16Path path) {
  if (M == 0 || panels == 0) return;
  const int64_t Kp = vnni_k(K), Mp = (M + 15) / 16 * 16;
  std::vector<uint16_t> xb_store(Mp * Kp + 32);
  uint16_t* xb = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(xb_store.data()) + 63) & ~uintptr_t{63});
  round_rows(x, M, K, Mp, Kp, xb);
  const int64_t panel_elems = Kp * kVnniPanel;
  if (path == Bf16Path::kAmx) {
    const int64_t chunks = (M + kAmxRowChunk - 1) / kAmxRowChunk;
    at::parallel_for(0, panels * chunks, 1, [&](int64_t first, int64_t last) {
      amx_configure();
      for (int64_t u = first; u < last; ++u) {
        const int64_t p = u / chunks, m0 = (u % chunks) * kAmxRowChunk, m1 = std::min(M, m0 + kAmxRowChunk);
        const int64_t col = p * kVnniPanel;
        amx_unit(xb, m0, m1, M, Kp, w + p * panel_elems, out + col, ld_out, residual ? residual + col : nullptr, ld_res,
                 bias ? bias + col : nullptr);
      }
      amx_release();
    });
    return;
  }
  // Vector paths. A product of few rows (one chunk) gives each thread an equal run of panels,
  // computed two at a time (a lone panel at a run's end by itself): 576 output columns are 18
  // panels, 9 a thread, where units of two panels would split them 10 : 8.
  TORCH_CHECK(panels % 2 == 0, "VNNI panels come in pairs (N padded to a multiple of 64)");
  const bool native = path == Bf16Path::kAvx512Bf16;
  const int64_t blocks = panels / 2;
  int64_t chunk = kRowChunk;
  if (M <= kRowChunk && blocks < 8 * at::get_num_threads() && M >= 2 * kRowsNative) chunk = (M + 1) / 2;
  if (chunk >= M) {
    at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; p += 2) {
        const uint16_t* a = w + p * panel_elems;
        const int64_t col = p * kVnniPanel;
        float* o = out + col;
        const float* rs = residual ? residual + col : nullptr;
        const float* bs = bias ? bias + col : nullptr;
        if (p + 1 < last) {
          vector_unit<2>(native, xb, 0, M, Kp, a, a + panel_elems, o, ld_out, rs, ld_res, bs);
        } else {
          vector_unit<1>(native, xb, 0, M, Kp, a, nullptr, o, ld_out, rs, ld_res, bs);
        }
      }
    });
    return;
  }
  // Else units of 64 columns x a chunk of rows. A product with few column blocks is also split by
  // rows, so both threads get equal work; the second reader of a block finds its weights in the
  // shared cache.
  const int64_t chunks = (M + chunk - 1) / chunk;
  at::parallel_for(0, blocks * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t blk = u / chunks, m0 = (u % chunks) * chunk, m1 = std::min(M, m0 + chunk);
      const uint16_t* a = w + 2 * blk * panel_elems;
      const int64_t col = blk * kBlockCols;
      vector_unit<2>(native, xb, m0, m1, Kp, a, a + panel_elems, out + col, ld_out, residual ? residual + col : nullptr,
                     ld_res, bias ? bias + col : nullptr);
    }
  });
}

}  // namespace radixlm
