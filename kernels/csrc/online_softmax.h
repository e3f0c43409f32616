// The online softmax of one block of 32 keys in the transposed layout of the extend kernels
// (amx_attention.cpp, vnni_attention.cpp): one vector per key holding the scores of 16 query
// rows, so every reduction runs across vectors, never within one. Per block:
//   mx = block_max(...)              the largest visible score of each row (causal mask on
//                                    diagonal blocks only);
//   if (move_max(mx * scale, m, l, alpha)) rescale the accumulator by alpha;
//   weights_to_pairs(...)            e^(s * scale - m) into l, and P^T as bf16 VNNI pairs.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "simd_math.h"

namespace radixlm {

constexpr int64_t kSoftmaxKeys = 32;  // keys per block
constexpr int64_t kSoftmaxRows = 16;  // query rows: one vector lane each

// A row's reference maximum moves only when a block's maximum exceeds it by more than this
// (e^8 ~ 3000 keeps every weight and sum far inside float32 and bfloat16 range), so the
// accumulator is rescaled a few times per unit instead of at every block.
constexpr float kRescaleMargin = 8.0f;

// keep[k]: the rows that see key first_key + k (row positions in row_pos); the visible maximum.
inline __m512 block_max(const __m512* s, __mmask16* keep, int64_t first_key, bool diagonal, __m512i row_pos) {
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  for (int64_t k = 0; k < kSoftmaxKeys; ++k) {
    keep[k] = diagonal ? _mm512_cmple_epi32_mask(_mm512_set1_epi32(static_cast<int>(first_key + k)), row_pos)
                       : static_cast<__mmask16>(0xFFFF);
    mx = _mm512_mask_max_ps(mx, keep[k], mx, s[k]);
  }
  return mx;
}

// Moves the reference maximum m where the block's scaled maximum passes it by kRescaleMargin:
// l is rescaled here, and the caller rescales its accumulator by alpha (0 on a row's first
// block, m = -inf). False when nothing moved.
inline bool move_max(__m512 scaled_max, __m512& m, __m512& l, __m512& alpha) {
  if (!_mm512_cmp_ps_mask(scaled_max, _mm512_add_ps(m, _mm512_set1_ps(kRescaleMargin)), _CMP_GT_OQ)) return false;
  const __m512 m_new = _mm512_max_ps(m, scaled_max);
  alpha = exp16(_mm512_sub_ps(m, m_new));
  m = m_new;
  l = _mm512_mul_ps(l, alpha);
  return true;
}

// The block's weights e^(s * scale - m) (0 where a row does not see the key) added into l, and
// written as P^T VNNI pairs: word [key pair i][row r] = (p[2i][r], p[2i+1][r]) in bfloat16.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void weights_to_pairs(
    __m512* s, const __mmask16* keep, __m512 scale, __m512 m, __m512& l, uint32_t* pt) {
  // word 2i of a P^T row <- row i of the even key, word 2i + 1 <- row i of the odd key
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t k = 0; k < kSoftmaxKeys; ++k) {
    s[k] = _mm512_maskz_mov_ps(keep[k], exp16_coarse(_mm512_fmsub_ps(s[k], scale, m)));
    l = _mm512_add_ps(l, s[k]);
  }
  for (int64_t k = 0; k < kSoftmaxKeys / 2; ++k) {
    const __m512bh pair = _mm512_cvtne2ps_pbh(s[2 * k + 1], s[2 * k]);
    _mm512_store_si512(pt + k * kSoftmaxRows, _mm512_permutexvar_epi16(interleave, reinterpret_cast<__m512i>(pair)));
  }
}

}  // namespace radixlm
