// The online softmax of one block of 32 keys in the transposed layout of the extend kernels
// (amx_attention.cpp, flash_attention.cpp): one vector per key holding the scores of 16 query
// rows, so every reduction runs across vectors, never within one. Per block:
//   mx = block_max(...)              the largest visible score of each row (causal mask on
//                                    diagonal blocks only);
//   if (move_max(mx * scale, m, l, alpha)) rescale the accumulator by alpha;
//   block_weights(...)               e^(s * scale - m), summed into l: as P^T float32 rows, or
//   weights_to_pairs[_bf16](...)     in place and then as P^T bf16 pairs.
// Also the bf16 kernels' Q^T in bf16 pairs (pack_query_pairs). Written over the vector layer
// (every level), but for weights_to_pairs_bf16: the same words with AVX512-BF16's
// vcvtne2ps2bf16, for kernels that only run where the CPU has it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "simd/math.h"

namespace radixlm {

constexpr int64_t kSoftmaxKeys = 32;  // keys per block
constexpr int64_t kSoftmaxRows = 16;  // query rows: one vector lane each

constexpr int64_t kMaxPairDim = 256;  // pack_query_pairs' largest head dim

// Q^T of 16 rows (q rows of T: float32, or bfloat16 bits) in bf16 pairs: word [j][r] =
// (q_r[2j], q_r[2j + 1]) as bfloat16, float32 rounded to nearest even. D a multiple of 32, at
// most kMaxPairDim.
template <typename T>
void pack_query_pairs(const T* const* rows, int64_t D, uint32_t* qt) {
  // float32 rows are rounded whole first: a vector loaded from the two halves just stored would
  // wait for them to leave the store buffer
  alignas(64) uint16_t rounded[std::is_same_v<T, float> ? kSoftmaxRows : 1][kMaxPairDim];
  const uint16_t* src[kSoftmaxRows];
  for (int64_t r = 0; r < kSoftmaxRows; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      from_float(rows[r], D, rounded[r]);
      src[r] = rounded[r];
    } else {
      src[r] = rows[r];
    }
  }
  for (int64_t c = 0; c < D / 32; ++c) {  // 16 words (32 dims) of every row at a time
    Vf w[16];
    for (int64_t r = 0; r < kSoftmaxRows; ++r) w[r] = simd::vcast_f(simd::vload_i(src[r] + c * 32));
    transpose16(w);
    for (int64_t j = 0; j < 16; ++j) simd::vstore(reinterpret_cast<float*>(qt + (c * 16 + j) * kSoftmaxRows), w[j]);
  }
}

// A row's reference maximum moves only when a block's maximum exceeds it by more than this
// (e^8 ~ 3000 keeps every weight and sum far inside float32 and bfloat16 range), so the
// accumulator is rescaled a few times per unit instead of at every block.
constexpr float kRescaleMargin = 8.0f;

// keep[k]: the rows that see key first_key + k (row positions in row_pos); the visible maximum.
inline Vf block_max(const Vf* s, Mask* keep, int64_t first_key, bool diagonal, Vi row_pos) {
  using namespace simd;
  Vf mx = vset1(-__builtin_inff());
  for (int64_t k = 0; k < kSoftmaxKeys; ++k) {
    keep[k] = diagonal ? vcmp_le_i(vset1_i(static_cast<int32_t>(first_key + k)), row_pos) : Mask(0xFFFF);
    mx = vmask_max(mx, keep[k], mx, s[k]);
  }
  return mx;
}

// Moves the reference maximum m where the block's scaled maximum passes it by kRescaleMargin:
// l is rescaled here, and the caller rescales its accumulator by alpha (0 on a row's first
// block, m = -inf). False when nothing moved.
inline bool move_max(Vf scaled_max, Vf& m, Vf& l, Vf& alpha) {
  using namespace simd;
  if (!vcmp_gt(scaled_max, vadd(m, vset1(kRescaleMargin)))) return false;
  const Vf m_new = vmax(m, scaled_max);
  alpha = exp16(vsub(m, m_new));
  m = m_new;
  l = vmul(l, alpha);
  return true;
}

// In place: s[k] = e^(s[k] * scale - m), 0 where a row does not see key k; each added into l.
inline void block_weights(Vf* s, const Mask* keep, Vf scale, Vf m, Vf& l) {
  using namespace simd;
  for (int64_t k = 0; k < kSoftmaxKeys; ++k) {
    s[k] = vmaskz(keep[k], exp16_coarse(vfmsub(s[k], scale, m)));
    l = vadd(l, s[k]);
  }
}

// block_weights into P^T float32 rows pt [32 keys][16 rows] (the weights stored as they are
// made, not held in 32 vectors for a second pass).
inline void block_weights(const Vf* s, const Mask* keep, Vf scale, Vf m, Vf& l, float* pt) {
  using namespace simd;
  for (int64_t k = 0; k < kSoftmaxKeys; ++k) {
    const Vf p = vmaskz(keep[k], exp16_coarse(vfmsub(s[k], scale, m)));
    l = vadd(l, p);
    vstore(pt + k * kSoftmaxRows, p);
  }
}

// The weights p (block_weights) as P^T bf16 pairs: word [key pair i][row r] = bf16(p[2i][r]) in
// the low half, bf16(p[2i + 1][r]) in the high half (rounded to nearest even).
inline void weights_to_pairs(const Vf* p, uint32_t* pt) {
  for (int64_t i = 0; i < kSoftmaxKeys / 2; ++i) simd::vstore_i(pt + i * kSoftmaxRows, simd::vpack_bf16_pairs(p[2 * i], p[2 * i + 1]));
}

#if defined(RADIXLM_SIMD_AVX512)
// weights_to_pairs with vcvtne2ps2bf16 (the same words for the weights' range: it flushes
// subnormals, whose products vanish in float32 sums anyway); only where cpu_has(kAvx512Bf16).
__attribute__((target("avx512bf16"))) inline void weights_to_pairs_bf16(const Vf* p, uint32_t* pt) {
  // word 2r of a P^T row <- row r of the even key, word 2r + 1 <- row r of the odd key
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t i = 0; i < kSoftmaxKeys / 2; ++i) {
    const __m512bh pair = _mm512_cvtne2ps_pbh(p[2 * i + 1].v, p[2 * i].v);
    _mm512_storeu_si512(pt + i * kSoftmaxRows, _mm512_permutexvar_epi16(interleave, reinterpret_cast<__m512i>(pair)));
  }
}
#endif

}  // namespace radixlm
