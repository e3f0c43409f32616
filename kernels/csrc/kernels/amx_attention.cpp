// Causal attention of long extends on AMX tiles (see amx_attention.h), flash-style: no score
// matrix beyond one 16 x 32 block, online softmax in float32.
//
// First each (request, kv head)'s context is packed once from the pool: K as rows [keys][D] (an
// A tile is 16 keys x 32 dims) and V transposed per 32-key block as [D][32 keys] (an A tile is 16
// dims x 32 keys), zero past the context. A work unit is (request, query head, 16 new tokens).
// Its queries become Q^T in bf16 pairs ([D/2][16 rows][2]: a B tile per 32 dims), and for each
// 32-key block:
//   S^T = K Q^T   two 16 x 16 float32 tiles, keys down, query rows across;
//   softmax       one vector per key over the 16 rows: the block's row maxima are 31 vmaxps (no
//                 horizontal reductions), exp in float32, the causal mask on diagonal blocks only;
//   O^T += V^T P^T  the weights P^T as bf16 pairs (a B tile), one float32 tile per 16 dims,
//                 folded into the float32 accumulator with the rescale of the running maximum.
// Rows and keys are interleaved so that every reduction runs across vectors, never within one.
//
// The kernels are compiled into the avx512 build only (tiles beside AVX-512 vectors) and run where
// cpu_has(kAmxBf16); the softmax's bf16 pairs use vcvtne2ps2bf16 where the CPU has AVX512-BF16,
// the vector layer's rounding otherwise. Other builds answer amx_attention_supported() false.
#include "kernels/amx_attention.h"

#include <stdexcept>
#include <vector>

#include "simd/vec.h"  // defines RADIXLM_SIMD_AVX512 in the avx512 build: the test below needs it first
#if defined(RADIXLM_SIMD_AVX512)
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "dispatch/cpu_features.h"
#include "kernels/online_softmax.h"
#include "kernels/parallel.h"
#include "simd/math.h"
#endif

namespace radixlm {

#if defined(RADIXLM_SIMD_AVX512)
namespace {

using namespace simd;

constexpr int64_t kBlock = kSoftmaxKeys;  // keys per block
constexpr int64_t kRows = kSoftmaxRows;    // new tokens (query rows) per unit

struct Unit {
  int64_t request, head, first;  // first: the unit's first new token (of the request's)
};

// The tile configuration of every unit: all 8 tiles 16 rows x 64 bytes (a bf16 A / B tile
// 16 x 32, a float32 accumulator 16 x 16). A namespace-scope object: gcc drops stores into a
// local that only ldtilecfg reads.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig sixteen_by_64() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

const TileConfig kTiles = sixteen_by_64();

__attribute__((target("amx-tile"))) void configure_tiles() { _tile_loadconfig(&kTiles); }
__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

// Pack keys [kb*32, kb*32 + 32) of one kv head: K rows and the V^T block (zeros past seq_len).
void pack_block(const ExtendRequest& r, int64_t g, int64_t kb, int64_t Hkv, int64_t D, const uint16_t* k_buf,
                const uint16_t* v_buf, uint16_t* kp, uint16_t* vt) {
  uint16_t* vtb = vt + kb * D * kBlock;
  for (int64_t k = 0; k < kBlock; ++k) {
    const int64_t key = kb * kBlock + k;
    uint16_t* dst = kp + key * D;
    if (key >= r.seq_len) {
      std::memset(dst, 0, D * sizeof(uint16_t));
      for (int64_t d = 0; d < D; ++d) vtb[d * kBlock + k] = 0;
      continue;
    }
    const int64_t row = (static_cast<int64_t>(r.slots[key]) * Hkv + g) * D;
    std::memcpy(dst, k_buf + row, D * sizeof(uint16_t));
    const uint16_t* v = v_buf + row;
    for (int64_t d = 0; d < D; ++d) vtb[d * kBlock + k] = v[d];
  }
}

// O^T += V^T P^T for the 64 dims [dg, dg + 64) of one key block into tiles 0-3 (P^T in tile 7).
__attribute__((target("amx-tile,amx-bf16"))) inline void pv_tiles(const uint16_t* vblock, int64_t dg) {
  _tile_loadd(6, vblock + dg * kBlock, 64);
  _tile_dpbf16ps(0, 6, 7);
  _tile_loadd(6, vblock + (dg + 16) * kBlock, 64);
  _tile_dpbf16ps(1, 6, 7);
  _tile_loadd(6, vblock + (dg + 32) * kBlock, 64);
  _tile_dpbf16ps(2, 6, 7);
  _tile_loadd(6, vblock + (dg + 48) * kBlock, 64);
  _tile_dpbf16ps(3, 6, 7);
}

__attribute__((target("amx-tile"))) inline void store_tiles(float* dst) {  // tiles 0-3 -> [64 dims][16 rows]
  _tile_stored(0, dst, 64);
  _tile_stored(1, dst + 16 * kRows, 64);
  _tile_stored(2, dst + 32 * kRows, 64);
  _tile_stored(3, dst + 48 * kRows, 64);
}

__attribute__((target("amx-tile"))) inline void load_tiles(const float* src) {
  _tile_loadd(0, src, 64);
  _tile_loadd(1, src + 16 * kRows, 64);
  _tile_loadd(2, src + 32 * kRows, 64);
  _tile_loadd(3, src + 48 * kRows, 64);
}

// With D = 64 the accumulator stays in tiles 0-3 for the whole unit: the reference maximum moves
// rarely (kRescaleMargin, online_softmax.h), and only then is it stored, rescaled and reloaded.

// S^T = K Q^T for one 32-key block (K rows [32][D], Q^T bf16 pairs): tiles 4, 5 -> sc [32 keys][16 rows].
template <int D>
__attribute__((target("amx-tile,amx-bf16"))) inline void score_tiles(const uint16_t* kblock, const uint32_t* qt,
                                                                   float* sc) {
  _tile_zero(4);
  _tile_zero(5);
  for (int64_t t = 0; t < D / 32; ++t) {
    _tile_loadd(7, qt + t * 16 * kRows, 64);
    _tile_loadd(6, kblock + t * 32, D * 2);
    _tile_dpbf16ps(4, 6, 7);
    _tile_loadd(6, kblock + 16 * D + t * 32, D * 2);
    _tile_dpbf16ps(5, 6, 7);
  }
  _tile_stored(4, sc, 64);
  _tile_stored(5, sc + 16 * kRows, 64);
}

// O^T [D][16 rows] += V^T P^T (P^T in tile 7) for D > 64, 64 dims (tiles 0-3) at a time.
template <int D>
__attribute__((target("amx-tile,amx-bf16"))) inline void value_tiles(const uint16_t* vblock, float* acc) {
  alignas(64) float pv[64 * kRows];  // one group of 4 output tiles: [dim][row]
  for (int64_t dg = 0; dg < D; dg += 64) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    pv_tiles(vblock, dg);
    store_tiles(pv);
    for (int64_t d = 0; d < 64; ++d) vstore(acc + (dg + d) * kRows, vadd(vload(acc + (dg + d) * kRows), vload(pv + d * kRows)));
  }
}

// The n rows' outputs O^T / l, transposed back to rows of `out` (rows `stride` elements apart).
template <int D, typename T>
inline void store_rows(const float* acc, Vf l, int64_t n, T* out, int64_t stride) {
  const Vf inv = vdiv(vset1(1.0f), l);  // l >= 1: a row's own key is visible
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    Vf v[16];
    for (int64_t i = 0; i < 16; ++i) v[i] = vmul(vload(acc + (d0 + i) * kRows), inv);
    transpose16(v);
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        vstore(out + i * stride + d0, v[i]);
      } else {
        vstore_bf16(out + i * stride + d0, v[i]);
      }
    }
  }
}

// One unit: up to 16 new tokens of one query head over the packed K rows kp and V^T vt of its kv
// head. cvt: the CPU has AVX512-BF16 (the weights' pairs by vcvtne2ps2bf16).
template <int D, typename T>
__attribute__((target("amx-tile,amx-bf16"))) void attend_unit(const ExtendRequest& r, const Unit& u, const T* q,
                                                              T* out, int64_t Hq, const uint16_t* kp,
                                                              const uint16_t* vt, float scale, bool cvt) {
  constexpr bool kResident = D == 64;  // the accumulator fits tiles 0-3
  alignas(64) uint32_t qt[D / 2 * kRows];
  alignas(64) float sc[kBlock * kRows];         // S^T: [key][row]
  alignas(64) uint32_t pt[kBlock / 2 * kRows];  // P^T bf16 pairs: [key pair][row]
  alignas(64) float acc[D * kRows];             // O^T: [dim][row]
  alignas(64) static constexpr int32_t kLane[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int64_t n = std::min(kRows, r.extend_len - u.first);
  const int64_t pos0 = r.seq_len - r.extend_len + u.first;  // the first row's position
  const int64_t q_row = r.q_start + u.first;
  const T* rows[kRows];  // rows past n repeat row n - 1 (their outputs are dropped)
  for (int64_t i = 0; i < kRows; ++i) rows[i] = q + ((q_row + std::min(i, n - 1)) * Hq + u.head) * D;
  pack_query_pairs(rows, D, qt);
  std::fill(acc, acc + D * kRows, 0.0f);
  if constexpr (kResident) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const Vi row_pos = vadd_i(vset1_i(static_cast<int32_t>(pos0)), vmin_i(vload_i(kLane), vset1_i(static_cast<int32_t>(n - 1))));
  const Vf vscale = vset1(scale);
  Vf m = vset1(-std::numeric_limits<float>::infinity()), l = vzero();
  const int64_t blocks = (pos0 + n - 1) / kBlock + 1;
  for (int64_t kb = 0; kb < blocks; ++kb) {
    score_tiles<D>(kp + kb * kBlock * D, qt, sc);
    Vf s[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) s[k] = vload(sc + k * kRows);
    Mask keep[kBlock];
    const Vf mx = block_max(s, keep, kb * kBlock, kb * kBlock + kBlock - 1 > pos0, row_pos);
    Vf alpha;
    if (move_max(vmul(mx, vscale), m, l, alpha) && kb > 0) {
      if constexpr (kResident) store_tiles(acc);
      for (int64_t d = 0; d < D; ++d) vstore(acc + d * kRows, vmul(vload(acc + d * kRows), alpha));
      if constexpr (kResident) load_tiles(acc);
    }
    block_weights(s, keep, vscale, m, l);
    if (cvt) {
      weights_to_pairs_bf16(s, pt);
    } else {
      weights_to_pairs(s, pt);
    }
    _tile_loadd(7, pt, 64);
    if constexpr (kResident) {
      pv_tiles(vt + kb * D * kBlock, 0);
    } else {
      value_tiles<D>(vt + kb * D * kBlock, acc);
    }
  }
  if constexpr (kResident) store_tiles(acc);
  store_rows<D>(acc, l, n, out + (q_row * Hq + u.head) * D, Hq * D);
}

}  // namespace

bool amx_attention_supported(int64_t head_dim) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 256) && cpu_has(kAmxBf16);
}

template <typename T>
void amx_extend_attention(const std::vector<ExtendRequest>& requests, const T* q, T* out, int64_t Hq, int64_t Hkv,
                          int64_t D, const uint16_t* k_buf, const uint16_t* v_buf, float scale) {
  const int64_t R = static_cast<int64_t>(requests.size()), group = Hq / Hkv;
  std::vector<int64_t> offset(R + 1, 0);  // packed K and V^T of request i's kv heads start at offset[i]
  std::vector<std::array<int64_t, 3>> items;  // (request, kv head, key block) to pack
  std::vector<Unit> units;
  for (int64_t i = 0; i < R; ++i) {
    const ExtendRequest& r = requests[i];
    const int64_t blocks = (r.seq_len + kBlock - 1) / kBlock;
    offset[i + 1] = offset[i] + Hkv * 2 * blocks * kBlock * D;
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t kb = 0; kb < blocks; ++kb) items.push_back({i, g, kb});
    }
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t first = 0; first < r.extend_len; first += kRows) units.push_back(Unit{i, h, first});
    }
  }
  std::vector<uint16_t> packed(offset[R]);
  auto heads_of = [&](int64_t i, int64_t g) {  // K rows, then V^T, of request i's kv head g
    const int64_t span = (requests[i].seq_len + kBlock - 1) / kBlock * kBlock * D;
    uint16_t* kp = packed.data() + offset[i] + g * 2 * span;
    return std::pair<uint16_t*, uint16_t*>(kp, kp + span);
  };
  parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const auto [i, g, kb] = items[it];
      const auto [kp, vt] = heads_of(i, g);
      pack_block(requests[i], g, kb, Hkv, D, k_buf, v_buf, kp, vt);
    }
  });
  const int64_t n = static_cast<int64_t>(units.size());
  // Units interleaved from both ends (0, n-1, 1, n-2, ...): under a causal mask a request's late
  // tokens cost more, and parallel_for hands each thread one contiguous range.
  const bool cvt = cpu_has(kAvx512Bf16);
  parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    configure_tiles();
    for (int64_t it = lo; it < hi; ++it) {
      const Unit& u = units[it % 2 == 0 ? it / 2 : n - 1 - it / 2];
      const auto [kp, vt] = heads_of(u.request, u.head / group);
      switch (D) {
        case 64: attend_unit<64>(requests[u.request], u, q, out, Hq, kp, vt, scale, cvt); break;
        case 128: attend_unit<128>(requests[u.request], u, q, out, Hq, kp, vt, scale, cvt); break;
        default: attend_unit<256>(requests[u.request], u, q, out, Hq, kp, vt, scale, cvt); break;
      }
    }
    release_tiles();
  });
}

#else  // not the avx512 build: no AMX kernels

bool amx_attention_supported(int64_t) { return false; }

template <typename T>
void amx_extend_attention(const std::vector<ExtendRequest>&, const T*, T*, int64_t, int64_t, int64_t, const uint16_t*,
                          const uint16_t*, float) {
  throw std::runtime_error("the AMX attention kernel is in the avx512 build only (amx_attention_supported)");
}

#endif

template void amx_extend_attention<float>(const std::vector<ExtendRequest>&, const float*, float*, int64_t, int64_t,
                                          int64_t, const uint16_t*, const uint16_t*, float);
template void amx_extend_attention<uint16_t>(const std::vector<ExtendRequest>&, const uint16_t*, uint16_t*, int64_t,
                                             int64_t, int64_t, const uint16_t*, const uint16_t*, float);

}  // namespace radixlm
