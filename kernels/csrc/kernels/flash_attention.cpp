// The flash kernels ("flash" in paged_attention): causal attention of long extends with vector
// registers, for CPUs without AMX: the AMX kernel's algorithm (amx_attention.cpp) with vectors in
// place of tiles. Flash-style: no score matrix
// beyond one 16 x 32 block, online softmax in float32 (online_softmax.h).
//
// A work unit is (request, kv head, 16 query rows), its rows the (new token, query head of the
// group) pairs in position order, so a GQA group shares every key and value it reads and a short
// extend still fills the vector lanes (20 tokens x 3 heads = 60 rows: 4 units). Keys are read in
// place from the pool; each (request, kv head)'s values are first packed per 32-key block, zero
// past the context. Per unit, its queries are transposed to Q^T ([D][16 rows]), and for each
// 32-key block:
//   S^T = K Q^T     one vector of 16 row scores per key;
//   softmax         across vectors (no horizontal reductions), float32, causal mask only on
//                   diagonal blocks, the reference maximum moved only by more than kRescaleMargin;
//   O^T += V^T P^T  one accumulator vector of 16 rows per dim.
//
// Two maths ("LongExtendMath"):
//   fma     every level, over the vector layer: the block's keys widened from the pool to float32,
//           values packed as float32 rows [32 keys][D], Q^T and P^T float32 (nothing rounded to
//           bf16), every product an FMA of a broadcast key / value element with 16 rows' lanes.
//           The only math over a float32 pool.
//   dpbf16  the avx512 build on a CPU with AVX512-BF16: vdpbf16ps on bf16 pairs (Q^T
//           [D/2][16 rows], V^T [D][16 key pairs], P^T [16 key pairs][16 rows]); q, K, V and the
//           weights enter the products as bfloat16, as in torch's bf16 SDPA and the AMX kernel.
// Where vdpbf16ps issues at half the FMA's rate (an Intel Xeon without AMX), fma is the faster
// math even so; long_extend_uses_fma() decides once by timing both.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dispatch/cpu_features.h"
#include "kernels/amx_attention.h"
#include "kernels/online_softmax.h"
#include "kernels/parallel.h"
#include "simd/math.h"

namespace radixlm {
namespace {

using namespace simd;

constexpr int64_t kBlock = kSoftmaxKeys;  // keys per block
constexpr int64_t kRows = kSoftmaxRows;    // query rows per unit: one vector lane each

// The fma math's register tiles, in vectors (a Vf is one of 32 zmm on AVX-512, two of 16 ymm on
// AVX2, four of 32 NEON q registers, four of 16 xmm in the generic build): the score pass keeps
// kScoreKeys score vectors and a Q^T vector live, the value pass kValueDims accumulators and a
// P^T vector. Both divide 16. AVX2 was timed with 2, 4, 8 and 16 of each (4 the fastest: 16
// spills, ~15% slower), generic likewise (2; wider passes are not kept in registers, 2-3x
// slower). NEON takes AVX2's (the same 8 Vf of registers; untimed).
#if defined(RADIXLM_SIMD_AVX512)
constexpr int kScoreKeys = 16, kValueDims = 16;
#elif defined(RADIXLM_SIMD_AVX2) || defined(RADIXLM_SIMD_NEON)
constexpr int kScoreKeys = 4, kValueDims = 4;
#else
constexpr int kScoreKeys = 2, kValueDims = 2;
#endif

struct Unit {
  int64_t request, kv_head, first;  // first: the unit's first row (token * group + head in group)
};

// V^T of keys [kb*32, kb*32 + 32) of kv head g as [D][32 keys] bfloat16 (word i of a dim's row
// is the pair of keys 2i, 2i + 1), zeros past seq_len: the dpbf16 math's values.
void pack_values(const ExtendRequest& r, int64_t g, int64_t kb, int64_t Hkv, int64_t D, const uint16_t* v_buf,
                 uint16_t* vt) {
  uint16_t* vtb = vt + kb * D * kBlock;
  for (int64_t k = 0; k < kBlock; ++k) {
    const int64_t key = kb * kBlock + k;
    if (key >= r.seq_len) {
      for (int64_t d = 0; d < D; ++d) vtb[d * kBlock + k] = 0;
      continue;
    }
    const uint16_t* v = v_buf + (static_cast<int64_t>(r.slots[key]) * Hkv + g) * D;
    for (int64_t d = 0; d < D; ++d) vtb[d * kBlock + k] = v[d];
  }
}

// The fma math's values: keys [kb*32, kb*32 + 32) of kv head g as float32 rows [32 keys][D],
// zeros past seq_len (P: the pool's element, bfloat16 bits or float).
template <typename P>
void pack_values(const ExtendRequest& r, int64_t g, int64_t kb, int64_t Hkv, int64_t D, const P* v_buf, float* vf) {
  float* block = vf + kb * D * kBlock;
  for (int64_t k = 0; k < kBlock; ++k) {
    const int64_t key = kb * kBlock + k;
    if (key >= r.seq_len) {
      std::fill(block + k * D, block + (k + 1) * D, 0.0f);
    } else {
      to_float(v_buf + (static_cast<int64_t>(r.slots[key]) * Hkv + g) * D, D, block + k * D);
    }
  }
}

// acc[d] *= alpha for the D accumulator vectors of O^T [D][16 rows].
template <int D>
inline void rescale(float* acc, Vf alpha) {
  for (int64_t d = 0; d < D; ++d) vstore(acc + d * kRows, vmul(vload(acc + d * kRows), alpha));
}

// The end of a unit: o [16][D] = O^T / l transposed back to rows, lse = m + log(l) per row.
template <int D>
inline void finish_rows(const float* acc, Vf m, Vf l, float* o, float* lse) {
  const Vf inv = vdiv(vset1(1.0f), l);  // l >= 1: a row's own key is visible
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    Vf v[16];
    for (int64_t i = 0; i < 16; ++i) v[i] = vmul(vload(acc + (d0 + i) * kRows), inv);
    transpose16(v);
    for (int64_t i = 0; i < 16; ++i) vstore(o + i * D + d0, v[i]);
  }
  alignas(64) float mf[kRows], lf[kRows];
  vstore(mf, m);
  vstore(lf, l);
  for (int64_t i = 0; i < kRows; ++i) lse[i] = mf[i] + std::log(lf[i]);
}

// Where row i (position pos[i]) sees keys first_key.. of a block: block_max's mask is needed
// only on blocks reaching past the smallest position.
inline bool is_diagonal(int64_t first_key, int64_t min_pos) { return first_key + kBlock - 1 > min_pos; }

#if defined(RADIXLM_SIMD_AVX512)
// The dpbf16 math (vdpbf16ps): compiled into the avx512 build only, run where cpu_has(kAvx512Bf16).

inline __m512i broadcast_pair(const uint16_t* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  return _mm512_set1_epi32(pair);
}

// S^T for 16 keys: s[k] (lanes: rows) = sum over dim pairs of key k's pair x Q^T's pair row.
template <int D>
__attribute__((target("avx512bf16"))) inline void scores16(const uint16_t* const* keys, const uint32_t* qt, Vf* s) {
  __m512 h[16];
  for (int k = 0; k < 16; ++k) h[k] = _mm512_setzero_ps();
  for (int64_t j = 0; j < D / 2; ++j) {
    const __m512bh qv = (__m512bh)_mm512_load_si512(qt + j * kRows);
    for (int k = 0; k < 16; ++k) h[k] = _mm512_dpbf16_ps(h[k], (__m512bh)broadcast_pair(keys[k] + 2 * j), qv);
  }
  for (int k = 0; k < 16; ++k) s[k].v = h[k];
}

// O^T += V^T P^T for one block: 16 dims in registers at a time, per key pair a vdpbf16ps of the
// broadcast (v[2i][d], v[2i+1][d]) with P^T's pair row.
template <int D>
__attribute__((target("avx512bf16"))) inline void values_dpbf16(const uint16_t* vblock, const uint32_t* pt, float* acc) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    __m512 a[16];
    for (int d = 0; d < 16; ++d) a[d] = _mm512_load_ps(acc + (d0 + d) * kRows);
    for (int64_t i = 0; i < kBlock / 2; ++i) {
      const __m512bh pv = (__m512bh)_mm512_load_si512(pt + i * kRows);
      for (int d = 0; d < 16; ++d) {
        a[d] = _mm512_dpbf16_ps(a[d], (__m512bh)broadcast_pair(vblock + (d0 + d) * kBlock + 2 * i), pv);
      }
    }
    for (int d = 0; d < 16; ++d) _mm512_store_ps(acc + (d0 + d) * kRows, a[d]);
  }
}

// The core: up to 16 query rows of one kv head over keys [0, num_keys) of `slots` (positions
// relative to slots[0]); row i sees the keys at positions <= pos[i] (< num_keys). Rows past n
// repeat row n - 1. Writes o [16][D] (normalized, float32) and lse [16] (log of the softmax's sum,
// in the units of the scaled scores), for the caller to store or merge.
template <int D, typename T>
__attribute__((target("avx512bf16"))) void attend_rows(const T* const* q_rows, const int32_t* pos,
                                                        const int32_t* slots, int64_t num_keys, int64_t kv_head,
                                                        int64_t Hkv, const uint16_t* k_buf, const uint16_t* vt,
                                                        const uint16_t* zero_row, float scale, float* o, float* lse) {
  alignas(64) uint32_t qt[D / 2 * kRows];
  alignas(64) uint32_t pt[kBlock / 2 * kRows];  // P^T bf16 pairs: [key pair][row]
  alignas(64) float acc[D * kRows];             // O^T: [dim][row]
  pack_query_pairs(q_rows, D, qt);
  std::fill(acc, acc + D * kRows, 0.0f);
  const Vi rpos = vload_i(pos);
  const int64_t min_pos = *std::min_element(pos, pos + kRows), max_pos = *std::max_element(pos, pos + kRows);
  const Vf vscale = vset1(scale);
  Vf m = vset1(-std::numeric_limits<float>::infinity()), l = vzero();
  const int64_t blocks = max_pos / kBlock + 1;
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const uint16_t* keys[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) {
      const int64_t key = kb * kBlock + k;
      keys[k] = key < num_keys ? k_buf + (static_cast<int64_t>(slots[key]) * Hkv + kv_head) * D : zero_row;
    }
    Vf s[kBlock];
    scores16<D>(keys, qt, s);
    scores16<D>(keys + 16, qt, s + 16);
    Mask keep[kBlock];
    const Vf mx = block_max(s, keep, kb * kBlock, is_diagonal(kb * kBlock, min_pos), rpos);
    Vf alpha;
    if (move_max(vmul(mx, vscale), m, l, alpha) && kb > 0) rescale<D>(acc, alpha);
    block_weights(s, keep, vscale, m, l);
    weights_to_pairs_bf16(s, pt);
    values_dpbf16<D>(vt + kb * D * kBlock, pt, acc);
  }
  finish_rows<D>(acc, m, l, o, lse);
}
#endif

// Q^T [D][16 rows] float32 of the rows q_rows (float32 or bfloat16 widened exactly).
template <int D, typename T>
inline void transpose_queries(const T* const* q_rows, float* qt) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    Vf w[16];
    for (int64_t r = 0; r < kRows; ++r) {
      alignas(64) float row[16];
      to_float(q_rows[r] + d0, 16, row);
      w[r] = vload(row);
    }
    transpose16(w);
    for (int64_t j = 0; j < 16; ++j) vstore(qt + (d0 + j) * kRows, w[j]);
  }
}

// S^T of kScoreKeys keys (rows [key][D] of kf) against Q^T [D][16 rows]: s[k] lanes = rows.
template <int D>
inline void scores_fma(const float* kf, const float* qt, Vf* s) {
  Vf h[kScoreKeys];
  for (int k = 0; k < kScoreKeys; ++k) h[k] = vzero();
  for (int64_t j = 0; j < D; ++j) {
    const Vf qv = vload(qt + j * kRows);
    for (int k = 0; k < kScoreKeys; ++k) h[k] = vfmadd(vset1(kf[k * D + j]), qv, h[k]);
  }
  for (int k = 0; k < kScoreKeys; ++k) s[k] = h[k];
}

// O^T [D][16 rows] += V^T P^T for one block: values vblock [32 keys][D], P^T pt [32 keys][16 rows].
template <int D>
inline void values_fma(const float* vblock, const float* pt, float* acc) {
  for (int64_t d0 = 0; d0 < D; d0 += kValueDims) {
    Vf a[kValueDims];
    for (int d = 0; d < kValueDims; ++d) a[d] = vload(acc + (d0 + d) * kRows);
    for (int64_t k = 0; k < kBlock; ++k) {
      const Vf pv = vload(pt + k * kRows);
      const float* v = vblock + k * D + d0;
      for (int d = 0; d < kValueDims; ++d) a[d] = vfmadd(vset1(v[d]), pv, a[d]);
    }
    for (int d = 0; d < kValueDims; ++d) vstore(acc + (d0 + d) * kRows, a[d]);
  }
}

// keys [kb*32, kb*32 + 32) of kv head g from a pool of P (float32, or bfloat16 bits widened
// exactly) as float32 rows kf [32][D] (zero past num_keys).
template <int D, typename P>
inline void load_keys(const int32_t* slots, int64_t kb, int64_t num_keys, int64_t kv_head, int64_t Hkv, const P* k_buf,
                      float* kf) {
  for (int64_t k = 0; k < kBlock; ++k) {
    const int64_t key = kb * kBlock + k;
    if (key < num_keys) {
      const P* src = k_buf + (static_cast<int64_t>(slots[key]) * Hkv + kv_head) * D;
      for (int64_t d = 0; d < D; d += 16) {
        if constexpr (std::is_same_v<P, float>) {
          vstore(kf + k * D + d, vload(src + d));
        } else {
          vstore(kf + k * D + d, vload_bf16(src + d));
        }
      }
    } else {
      std::fill(kf + k * D, kf + (k + 1) * D, 0.0f);
    }
  }
}

// attend_rows in float32 FMAs (see the file comment), at every level: q rows of type T, the
// block's keys read (widened from a bf16 pool) from a pool of P, values `vf` packed as float32
// rows (pack_values).
template <int D, typename T, typename P>
void attend_rows_fma(const T* const* q_rows, const int32_t* pos, const int32_t* slots, int64_t num_keys,
                     int64_t kv_head, int64_t Hkv, const P* k_buf, const float* vf, float scale, float* o,
                     float* lse) {
  alignas(64) float qt[D * kRows];       // Q^T: [dim][row]
  alignas(64) float kf[kBlock * D];      // the block's keys: [key][dim]
  alignas(64) float pt[kBlock * kRows];  // P^T: [key][row]
  alignas(64) float acc[D * kRows];      // O^T: [dim][row]
  transpose_queries<D>(q_rows, qt);
  std::fill(acc, acc + D * kRows, 0.0f);
  const Vi rpos = vload_i(pos);
  const int64_t min_pos = *std::min_element(pos, pos + kRows), max_pos = *std::max_element(pos, pos + kRows);
  const Vf vscale = vset1(scale);
  Vf m = vset1(-std::numeric_limits<float>::infinity()), l = vzero();
  const int64_t blocks = max_pos / kBlock + 1;
  for (int64_t kb = 0; kb < blocks; ++kb) {
    load_keys<D>(slots, kb, num_keys, kv_head, Hkv, k_buf, kf);
    Vf s[kBlock];
    for (int64_t k0 = 0; k0 < kBlock; k0 += kScoreKeys) scores_fma<D>(kf + k0 * D, qt, s + k0);
    Mask keep[kBlock];
    const Vf mx = block_max(s, keep, kb * kBlock, is_diagonal(kb * kBlock, min_pos), rpos);
    Vf alpha;
    if (move_max(vmul(mx, vscale), m, l, alpha) && kb > 0) rescale<D>(acc, alpha);
    block_weights(s, keep, vscale, m, l, pt);
    values_fma<D>(vf + kb * kBlock * D, pt, acc);
  }
  finish_rows<D>(acc, m, l, o, lse);
}

template <typename T>
inline void store_row(const float* src, int64_t D, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, D * sizeof(float));
  } else {
    from_float(src, D, dst);
  }
}

// One block of up to 16 rows being attended: their q rows, positions and output ids (q row *
// Hq + head), and the result of attend_rows.
template <typename T>
struct RowBlock {
  const T* q[kRows];
  alignas(64) int32_t pos[kRows];
  int64_t ids[kRows];
  int64_t n = 0;  // valid rows; the lanes past them repeat row n - 1
  std::vector<float> o;
  alignas(64) float lse[kRows];

  explicit RowBlock(int64_t D) : o(kRows * D) {}

  // values: the plan's packing of this (request, kv head): bf16 V^T, or float32 rows with `fma`
  template <typename P>
  void attend(bool fma, int64_t D, const int32_t* slots, int64_t num_keys, int64_t kv_head, int64_t Hkv,
              const P* k_buf, const void* values, const uint16_t* zero_row, float scale) {
    if (fma || !std::is_same_v<P, uint16_t>) {
      const auto* vf = static_cast<const float*>(values);
      if (D == 64) {
        attend_rows_fma<64>(q, pos, slots, num_keys, kv_head, Hkv, k_buf, vf, scale, o.data(), lse);
      } else {
        attend_rows_fma<128>(q, pos, slots, num_keys, kv_head, Hkv, k_buf, vf, scale, o.data(), lse);
      }
      return;
    }
#if defined(RADIXLM_SIMD_AVX512)
    if constexpr (std::is_same_v<P, uint16_t>) {
      const auto* vt = static_cast<const uint16_t*>(values);
      if (D == 64) {
        attend_rows<64>(q, pos, slots, num_keys, kv_head, Hkv, k_buf, vt, zero_row, scale, o.data(), lse);
      } else {
        attend_rows<128>(q, pos, slots, num_keys, kv_head, Hkv, k_buf, vt, zero_row, scale, o.data(), lse);
      }
    }
#else
    (void)zero_row;  // without the dpbf16 math every plan is fma (is_fma)
#endif
  }
};

// Packed values per (request, kv head) (bf16 V^T, or float32 rows for the fma math), and the
// units over each request's rows.
struct Plan {
  bool fma = false;
  std::vector<int64_t> offset;  // the values of request i's kv heads start at offset[i]
  std::vector<uint16_t> packed;
  std::vector<float> packed_f;
  std::vector<Unit> units;
  int64_t D = 0;
  const void* values(const std::vector<ExtendRequest>& requests, int64_t i, int64_t g) const {
    const int64_t span = (requests[i].seq_len + kBlock - 1) / kBlock * kBlock * D;  // one kv head's values
    if (fma) return packed_f.data() + offset[i] + g * span;
    return packed.data() + offset[i] + g * span;
  }
};

template <typename P>
Plan plan_requests(const std::vector<ExtendRequest>& requests, int64_t Hkv, int64_t D, int64_t group, const P* v_buf,
                   bool fma) {
  const int64_t R = static_cast<int64_t>(requests.size());
  Plan plan;
  plan.fma = fma;
  plan.D = D;
  plan.offset.assign(R + 1, 0);
  std::vector<std::array<int64_t, 3>> items;  // (request, kv head, key block) to pack
  for (int64_t i = 0; i < R; ++i) {
    const ExtendRequest& r = requests[i];
    const int64_t blocks = (r.seq_len + kBlock - 1) / kBlock;
    plan.offset[i + 1] = plan.offset[i] + Hkv * blocks * kBlock * D;
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t kb = 0; kb < blocks; ++kb) items.push_back({i, g, kb});
      for (int64_t first = 0; first < r.extend_len * group; first += kRows) plan.units.push_back(Unit{i, g, first});
    }
  }
  if (fma) {
    plan.packed_f.resize(plan.offset[R]);
  } else {
    plan.packed.resize(plan.offset[R]);
  }
  parallel_for(0, static_cast<int64_t>(items.size()), 16, [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const auto [i, g, kb] = items[it];
      void* values = const_cast<void*>(plan.values(requests, i, g));
      if constexpr (std::is_same_v<P, uint16_t>) {
        if (!fma) {
          pack_values(requests[i], g, kb, Hkv, D, v_buf, static_cast<uint16_t*>(values));
          continue;
        }
      }
      pack_values(requests[i], g, kb, Hkv, D, v_buf, static_cast<float*>(values));
    }
  });
  return plan;
}

// Every unit of `plan`; sink(row index (q row * Hq + head), o row, lse) for each valid row.
// Units interleaved from both ends (0, n-1, 1, n-2, ...): under a causal mask a request's late
// rows cost more, and parallel_for hands each thread one contiguous range.
template <typename T, typename P, typename Sink>
void run_units(const std::vector<ExtendRequest>& requests, const Plan& plan, const T* q, int64_t Hq, int64_t Hkv,
               int64_t D, const P* k_buf, float scale, const Sink& sink) {
  const int64_t n = static_cast<int64_t>(plan.units.size()), group = Hq / Hkv;
  const std::vector<uint16_t> zero_row(D, 0);
  parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    RowBlock<T> block(D);
    for (int64_t it = lo; it < hi; ++it) {
      const Unit& u = plan.units[it % 2 == 0 ? it / 2 : n - 1 - it / 2];
      const ExtendRequest& r = requests[u.request];
      block.n = std::min(kRows, r.extend_len * group - u.first);
      for (int64_t i = 0; i < kRows; ++i) {
        const int64_t row = u.first + std::min(i, block.n - 1), t = row / group, h = u.kv_head * group + row % group;
        block.ids[i] = (r.q_start + t) * Hq + h;
        block.q[i] = q + block.ids[i] * D;
        block.pos[i] = static_cast<int32_t>(r.seq_len - r.extend_len + t);
      }
      block.attend(plan.fma, D, r.slots, r.seq_len, u.kv_head, Hkv, k_buf, plan.values(requests, u.request, u.kv_head),
                   zero_row.data(), scale);
      for (int64_t i = 0; i < block.n; ++i) sink(block.ids[i], block.o.data() + i * D, block.lse[i]);
    }
  });
}

}  // namespace

bool flash_attention_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

namespace {

std::atomic<int> long_extend_math_{-1};  // -1: not decided yet; else a LongExtendMath

// Whether the dpbf16 math runs here: built at this level (avx512) and the CPU has AVX512-BF16.
bool dpbf16_runs() {
#if defined(RADIXLM_SIMD_AVX512)
  return cpu_has(kAvx512Bf16);
#else
  return false;
#endif
}

#if defined(RADIXLM_SIMD_AVX512)
// The best of kRepeats runs of one 16-row unit over 512 keys (D 64) with each math, on
// this thread: what vdpbf16ps and the FMAs cost per product here, including their data movement.
bool fma_is_faster() {
  constexpr int64_t kKeys = 512, kD = 64, kRepeats = 7;
  std::vector<uint16_t> pool(kKeys * kD);
  for (int64_t i = 0; i < kKeys * kD; ++i) pool[i] = float_to_bf16(static_cast<float>((i * 37) % 101) / 101.0f - 0.5f);
  std::vector<int32_t> slots(kKeys);
  for (int64_t i = 0; i < kKeys; ++i) slots[i] = static_cast<int32_t>(i);
  std::vector<float> qv(kRows * kD, 0.25f), o(kRows * kD);
  const float* q_rows[kRows];
  alignas(64) int32_t pos[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    q_rows[r] = qv.data() + r * kD;
    pos[r] = static_cast<int32_t>(kKeys - 1);
  }
  const std::vector<ExtendRequest> one{ExtendRequest{slots.data(), kKeys, 0, 0}};
  const Plan bf16_plan = plan_requests(one, 1, kD, 1, pool.data(), false);
  const Plan fma_plan = plan_requests(one, 1, kD, 1, pool.data(), true);
  const std::vector<uint16_t> zero_row(kD, 0);
  alignas(64) float lse[kRows];
  double best[2] = {1e30, 1e30};
  for (int64_t rep = 0; rep < kRepeats; ++rep) {
    for (int math = 0; math < 2; ++math) {
      const auto start = std::chrono::steady_clock::now();
      if (math == 0) {
        attend_rows<64>(q_rows, pos, slots.data(), kKeys, 0, 1, pool.data(),
                        static_cast<const uint16_t*>(bf16_plan.values(one, 0, 0)), zero_row.data(), 0.125f, o.data(), lse);
      } else {
        attend_rows_fma<64>(q_rows, pos, slots.data(), kKeys, 0, 1, pool.data(),
                            static_cast<const float*>(fma_plan.values(one, 0, 0)), 0.125f, o.data(), lse);
      }
      best[math] = std::min(best[math], std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return best[1] < best[0];
}
#else
bool fma_is_faster() { return true; }
#endif

}  // namespace

bool long_extend_uses_fma() {
  int math = long_extend_math_.load(std::memory_order_relaxed);
  if (math < 0) {
    math = static_cast<int>(!dpbf16_runs() || fma_is_faster() ? LongExtendMath::kFma : LongExtendMath::kDpbf16);
    long_extend_math_.store(math, std::memory_order_relaxed);
  }
  return math == static_cast<int>(LongExtendMath::kFma);
}

void set_long_extend_math(int64_t math) {
  if (math < -1 || math > static_cast<int64_t>(LongExtendMath::kFma)) {
    throw std::runtime_error("unknown long-extend math " + std::to_string(math));
  }
  if (math == static_cast<int64_t>(LongExtendMath::kDpbf16) && !dpbf16_runs()) {
    throw std::runtime_error("this CPU lacks AVX512-BF16 (vdpbf16ps), or this build (" RADIXLM_SIMD_NAME
                             ") does not use it");
  }
  long_extend_math_.store(static_cast<int>(math), std::memory_order_relaxed);
}

namespace {

// A float32 pool always takes the FMAs; a bf16 one the math long_extend_uses_fma() picks.
template <typename P>
bool is_fma() {
  return !std::is_same_v<P, uint16_t> || long_extend_uses_fma();
}

}  // namespace

template <typename T, typename P>
void flash_extend_attention(const std::vector<ExtendRequest>& requests, const T* q, T* out, int64_t Hq, int64_t Hkv,
                           int64_t D, const P* k_buf, const P* v_buf, float scale) {
  const Plan plan = plan_requests(requests, Hkv, D, Hq / Hkv, v_buf, is_fma<P>());
  run_units(requests, plan, q, Hq, Hkv, D, k_buf, scale,
            [&](int64_t id, const float* o, float) { store_row(o, D, out + id * D); });
}

template <typename T, typename P>
void flash_cascade_attention(const std::vector<ExtendRequest>& requests, int64_t shared_len, const T* q, T* out,
                            int64_t Hq, int64_t Hkv, int64_t D, const P* k_buf, const P* v_buf, float scale) {
  const int64_t R = static_cast<int64_t>(requests.size()), group = Hq / Hkv;
  const bool fma = is_fma<P>();
  int64_t T_rows = 0;  // q rows covered (the requests' new tokens are q rows [q_start, q_start + extend_len))
  for (const ExtendRequest& r : requests) T_rows = std::max(T_rows, r.q_start + r.extend_len);
  // 1. every row of every request over the shared keys [0, shared_len): the shared V^T is packed
  // once (a request of no new tokens of its own: its units are the rows of all requests, below)
  std::vector<float> o1(T_rows * Hq * D), lse1(T_rows * Hq), o2(T_rows * Hq * D), lse2(T_rows * Hq);
  {
    const std::vector<ExtendRequest> shared{ExtendRequest{requests[0].slots, shared_len, 0, 0}};
    const Plan plan = plan_requests(shared, Hkv, D, group, v_buf, fma);
    // rows of the shared pass: (request, token, head in group) listed per kv head
    std::vector<std::array<int64_t, 2>> rows;  // (q row, head in group) in request order
    for (const ExtendRequest& r : requests) {
      for (int64_t t = 0; t < r.extend_len; ++t) {
        for (int64_t h = 0; h < group; ++h) rows.push_back({r.q_start + t, h});
      }
    }
    const int64_t per_head = static_cast<int64_t>(rows.size());
    const int64_t units = (per_head + kRows - 1) / kRows;
    const std::vector<uint16_t> zero_row(D, 0);
    parallel_for(0, Hkv * units, 1, [&](int64_t lo, int64_t hi) {
      RowBlock<T> block(D);
      for (int64_t it = lo; it < hi; ++it) {
        const int64_t g = it / units, first = (it % units) * kRows;
        block.n = std::min(kRows, per_head - first);
        for (int64_t i = 0; i < kRows; ++i) {
          const auto [q_row, h] = rows[first + std::min(i, block.n - 1)];
          block.ids[i] = q_row * Hq + g * group + h;
          block.q[i] = q + block.ids[i] * D;
          block.pos[i] = static_cast<int32_t>(shared_len - 1);
        }
        block.attend(plan.fma, D, shared[0].slots, shared_len, g, Hkv, k_buf, plan.values(shared, 0, g), zero_row.data(),
                     scale);
        for (int64_t i = 0; i < block.n; ++i) {
          std::memcpy(o1.data() + block.ids[i] * D, block.o.data() + i * D, D * sizeof(float));
          lse1[block.ids[i]] = block.lse[i];
        }
      }
    });
  }
  // 2. each request's own keys [shared_len, seq_len), positions counted from shared_len
  std::vector<ExtendRequest> own(R);
  for (int64_t i = 0; i < R; ++i) {
    const ExtendRequest& r = requests[i];
    own[i] = ExtendRequest{r.slots + shared_len, r.seq_len - shared_len, r.extend_len, r.q_start};
  }
  const Plan plan = plan_requests(own, Hkv, D, group, v_buf, fma);
  run_units(own, plan, q, Hq, Hkv, D, k_buf, scale, [&](int64_t id, const float* o, float lse) {
    std::memcpy(o2.data() + id * D, o, D * sizeof(float));
    lse2[id] = lse;
  });
  // 3. merge the two partial softmaxes of every row (the requests' new tokens tile q's rows)
  parallel_for(0, T_rows * Hq, 64, [&](int64_t lo, int64_t hi) {
    std::vector<float> row(D);
    for (int64_t id = lo; id < hi; ++id) {
      const float mx = std::max(lse1[id], lse2[id]);
      const float w1 = std::exp(lse1[id] - mx), w2 = std::exp(lse2[id] - mx), inv = 1.0f / (w1 + w2);
      for (int64_t d = 0; d < D; ++d) row[d] = (o1[id * D + d] * w1 + o2[id * D + d] * w2) * inv;
      store_row(row.data(), D, out + id * D);
    }
  });
}

template void flash_extend_attention<float, uint16_t>(const std::vector<ExtendRequest>&, const float*, float*, int64_t,
                                                     int64_t, int64_t, const uint16_t*, const uint16_t*, float);
template void flash_extend_attention<uint16_t, uint16_t>(const std::vector<ExtendRequest>&, const uint16_t*, uint16_t*,
                                                        int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, float);
template void flash_extend_attention<float, float>(const std::vector<ExtendRequest>&, const float*, float*, int64_t,
                                                  int64_t, int64_t, const float*, const float*, float);
template void flash_cascade_attention<float, uint16_t>(const std::vector<ExtendRequest>&, int64_t, const float*, float*,
                                                      int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, float);
template void flash_cascade_attention<uint16_t, uint16_t>(const std::vector<ExtendRequest>&, int64_t, const uint16_t*,
                                                         uint16_t*, int64_t, int64_t, int64_t, const uint16_t*,
                                                         const uint16_t*, float);
template void flash_cascade_attention<float, float>(const std::vector<ExtendRequest>&, int64_t, const float*, float*,
                                                   int64_t, int64_t, int64_t, const float*, const float*, float);

}  // namespace radixlm
