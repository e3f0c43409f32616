// The vector layer on AVX2 + FMA + F16C: two 8-lane registers per vector, lanes 0-7 in `lo`,
// lanes 8-15 in `hi` (see vec.h; vec_generic.h defines every op, and this file gives the same
// bits, but for the order of vreduce_add's sum and the single rounding of vfmadd / vfnmadd /
// vfmsub). The level of Zen 2 / Zen 3 and of Intel client chips: every op is inline and the hot
// ones (loads, stores, arithmetic, conversions, shifts) stay in registers.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace radixlm::simd {

struct Vf {
  __m256 lo, hi;
};
struct Vi {
  __m256i lo, hi;
};

namespace avx2 {

// n clamped to [0, 16]
inline int clamp16(int64_t n) { return n <= 0 ? 0 : n >= 16 ? 16 : static_cast<int>(n); }
// all ones in the lanes i of an 8-lane half where i < n (any int n)
inline __m256i lanes_below(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
// all ones in lane i where bit i of m is set: lanes 0-7 (lo) / 8-15 (hi)
inline __m256 mask_lo(Mask m) {
  const __m256i b = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), b), b));
}
inline __m256 mask_hi(Mask m) {
  const __m256i b = _mm256_setr_epi32(256, 512, 1024, 2048, 4096, 8192, 16384, 32768);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), b), b));
}
inline Mask to_mask(__m256 lo, __m256 hi) { return static_cast<Mask>(_mm256_movemask_ps(lo) | (_mm256_movemask_ps(hi) << 8)); }
// per lane: hi > lo ? hi : lo. In vreduce_max, `lo` always holds the lower lane indices, so ties
// (+0 / -0) keep the first lane and a NaN in `lo` stays, as the sequential definition does.
inline __m256 first_max(__m256 hi, __m256 lo) { return _mm256_blendv_ps(lo, hi, _mm256_cmp_ps(hi, lo, _CMP_GT_OQ)); }
inline __m128 first_max(__m128 hi, __m128 lo) { return _mm_blendv_ps(lo, hi, _mm_cmp_ps(hi, lo, _CMP_GT_OQ)); }
// 8 x 8 transpose: r[j] lane d -> r[d] lane j
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  // u_k per 128-bit half h: column 4h + k of rows 0-3 (u0-u3) / rows 4-7 (u4-u7)
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

}  // namespace avx2

// --- float32 lanes ---
inline Vf vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vf vset1(float x) { const __m256 v = _mm256_set1_ps(x); return {v, v}; }
inline Vf vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, Vf a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
// masked lanes are neither read nor written, so nothing past p + n is touched (nor can fault)
inline Vf vload_n(const float* p, int64_t n) {
  const int k = avx2::clamp16(n);
  return {_mm256_maskload_ps(p, avx2::lanes_below(k)), _mm256_maskload_ps(p + 8, avx2::lanes_below(k - 8))};
}
inline void vstore_n(float* p, Vf a, int64_t n) {
  const int k = avx2::clamp16(n);
  _mm256_maskstore_ps(p, avx2::lanes_below(k), a.lo);
  _mm256_maskstore_ps(p + 8, avx2::lanes_below(k - 8), a.hi);
}
inline Vf vadd(Vf a, Vf b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Vf vsub(Vf a, Vf b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline Vf vmul(Vf a, Vf b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Vf vdiv(Vf a, Vf b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
// maxps / minps: a > b ? a : b (the second operand on NaN and on +0 / -0), as vec_generic.h
inline Vf vmax(Vf a, Vf b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline Vf vmin(Vf a, Vf b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline Vf vabs(Vf a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
inline Vf vfmadd(Vf a, Vf b, Vf c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline Vf vfnmadd(Vf a, Vf b, Vf c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline Vf vfmsub(Vf a, Vf b, Vf c) { return {_mm256_fmsub_ps(a.lo, b.lo, c.lo), _mm256_fmsub_ps(a.hi, b.hi, c.hi)}; }
inline float vreduce_add(Vf a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// The sequential definition's result exactly: NaN lanes but lane 0 can never win (made -inf), and
// a tree whose every step keeps the lower-indexed side on ties and NaN (avx2::first_max): lanes
// paired 2i / 2i+1, then groups of 4, 8, 16, each always a run of consecutive lanes.
inline float vreduce_max(Vf a) {
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  __m256 lo = _mm256_blendv_ps(a.lo, ninf, _mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q));
  lo = _mm256_blend_ps(lo, a.lo, 0x01);  // lane 0 as it is
  const __m256 hi = _mm256_blendv_ps(a.hi, ninf, _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q));
  // even lanes [0 2 8 10 | 4 6 12 14] against odd lanes [1 3 9 11 | 5 7 13 15]
  __m256 m = avx2::first_max(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)), _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
  // slots 0 and 2 of each half against slots 1 and 3: [0-3 . 8-11 . | 4-7 . 12-15 .]
  m = avx2::first_max(_mm256_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)), m);
  __m128 r = avx2::first_max(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));  // [0-7 . 8-15 .]
  r = avx2::first_max(_mm_movehl_ps(r, r), r);
  return _mm_cvtss_f32(r);
}
inline Vf vround(Vf a) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, kMode), _mm256_round_ps(a.hi, kMode)};
}
// as vec_generic.h: k = n clamped to [-126, 127], p * 2^(n - k) (exact) * 2^k (the one rounding);
// both factors are built from their exponent bits
inline Vf vscale2(Vf p, Vf n) {
  const __m256i lo_k = _mm256_set1_epi32(-126), hi_k = _mm256_set1_epi32(127), bias = _mm256_set1_epi32(127);
  const auto half = [&](__m256 x, __m256 e) {
    const __m256i k = _mm256_cvttps_epi32(e), k2 = _mm256_min_epi32(_mm256_max_epi32(k, lo_k), hi_k);
    const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, k2), bias), 23));
    const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(x, f1), f2);
  };
  return {half(p.lo, n.lo), half(p.hi, n.hi)};
}

// --- lane masks ---
inline Mask vcmp_gt(Vf a, Vf b) { return avx2::to_mask(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)); }
inline Mask vcmp_nan(Vf a) { return avx2::to_mask(_mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q), _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q)); }
inline Vf vselect(Mask m, Vf a, Vf b) { return {_mm256_blendv_ps(b.lo, a.lo, avx2::mask_lo(m)), _mm256_blendv_ps(b.hi, a.hi, avx2::mask_hi(m))}; }
inline Vf vmaskz(Mask m, Vf a) { return {_mm256_and_ps(a.lo, avx2::mask_lo(m)), _mm256_and_ps(a.hi, avx2::mask_hi(m))}; }
inline Vf vmask_max(Vf src, Mask m, Vf a, Vf b) { return vselect(m, vmax(a, b), src); }

// --- int32 lanes ---
inline Vi vzero_i() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Vi vset1_i(int32_t x) { const __m256i v = _mm256_set1_epi32(x); return {v, v}; }
inline Vi vload_i(const void* p) {
  const __m256i* q = static_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
inline void vstore_i(void* p, Vi a) {
  __m256i* q = static_cast<__m256i*>(p);
  _mm256_storeu_si256(q, a.lo);
  _mm256_storeu_si256(q + 1, a.hi);
}
inline Vi vadd_i(Vi a, Vi b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline Vi vsub_i(Vi a, Vi b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
inline Vi vand_i(Vi a, Vi b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
inline Vi vor_i(Vi a, Vi b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
inline Vi vxor_i(Vi a, Vi b) { return {_mm256_xor_si256(a.lo, b.lo), _mm256_xor_si256(a.hi, b.hi)}; }
template <int N> inline Vi vshl_i(Vi a) { return {_mm256_slli_epi32(a.lo, N), _mm256_slli_epi32(a.hi, N)}; }
template <int N> inline Vi vshr_i(Vi a) { return {_mm256_srli_epi32(a.lo, N), _mm256_srli_epi32(a.hi, N)}; }
template <int N> inline Vi vsra_i(Vi a) { return {_mm256_srai_epi32(a.lo, N), _mm256_srai_epi32(a.hi, N)}; }
inline Vi vmin_i(Vi a, Vi b) { return {_mm256_min_epi32(a.lo, b.lo), _mm256_min_epi32(a.hi, b.hi)}; }
inline Vi vmax_i(Vi a, Vi b) { return {_mm256_max_epi32(a.lo, b.lo), _mm256_max_epi32(a.hi, b.hi)}; }
// a <= b is not a > b
inline Mask vcmp_le_i(Vi a, Vi b) {
  return static_cast<Mask>(~avx2::to_mask(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a.lo, b.lo)), _mm256_castsi256_ps(_mm256_cmpgt_epi32(a.hi, b.hi))));
}
inline int32_t vreduce_add_i(Vi a) {
  const __m256i s8 = _mm256_add_epi32(a.lo, a.hi);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}
inline Vf vcast_f(Vi a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline Vi vcast_i(Vf a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
inline Vf vcvt_f(Vi a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline Vi vcvt_i(Vf a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline Vi vload_i8(const int8_t* p) {
  return {_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline Vi vload_u8(const uint8_t* p) {
  return {_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline Vi vload_u16(const uint16_t* p) {
  return {_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
// saturate to int16, then to int8 (the same as saturating to int8 at once)
inline void vstore_i8_sat(int8_t* p, Vi a) {
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), _MM_SHUFFLE(3, 1, 2, 0));  // lanes 0-15 in order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

// --- bfloat16 / float16 ---
inline Vf vbf16_low(Vi a) { return vcast_f(vshl_i<16>(a)); }
inline Vf vbf16_high(Vi a) { return vcast_f(vand_i(a, vset1_i(static_cast<int32_t>(0xFFFF0000u)))); }
inline Vi vto_bf16_bits(Vf a) {
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF), qnan = _mm256_set1_epi32(0x7FC0);
  const auto round = [&](__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, half)), 16);
    return _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  };
  return {round(a.lo), round(a.hi)};
}
inline Vf vload_bf16(const uint16_t* p) { return vbf16_low(vload_u16(p)); }
// through a zeroed copy of the n values on the stack: reads exactly p[0, n)
inline Vf vload_bf16_n(const uint16_t* p, int64_t n) {
  uint16_t t[16] = {};
  std::memcpy(t, p, sizeof(uint16_t) * avx2::clamp16(n));
  return vload_bf16(t);
}
namespace avx2 {
// the 16 bf16 of a, in lane order
inline __m256i bf16_words(Vf a) {
  const Vi r = vto_bf16_bits(a);  // each < 2^16, so the unsigned saturation keeps it
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(r.lo, r.hi), _MM_SHUFFLE(3, 1, 2, 0));
}
}  // namespace avx2
inline void vstore_bf16(uint16_t* p, Vf a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), avx2::bf16_words(a)); }
// through a copy on the stack: writes exactly p[0, n)
inline void vstore_bf16_n(uint16_t* p, Vf a, int64_t n) {
  uint16_t t[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(t), avx2::bf16_words(a));
  std::memcpy(p, t, sizeof(uint16_t) * avx2::clamp16(n));
}
inline Vi vpack_bf16_pairs(Vf lo, Vf hi) { return vor_i(vto_bf16_bits(lo), vshl_i<16>(vto_bf16_bits(hi))); }
inline Vf vload_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}

// In place: r[j] lane d -> r[d] lane j, a 16 x 16 float tile held in 16 vectors. The four 8 x 8
// quadrants transpose each in place, and the two off the diagonal trade places.
inline void transpose16(Vf r[16]) {
  __m256 q[8];
  for (int i = 0; i < 8; ++i) q[i] = r[i].lo;  // rows 0-7, columns 0-7
  avx2::transpose8(q);
  for (int i = 0; i < 8; ++i) r[i].lo = q[i];
  for (int i = 0; i < 8; ++i) q[i] = r[8 + i].hi;  // rows 8-15, columns 8-15
  avx2::transpose8(q);
  for (int i = 0; i < 8; ++i) r[8 + i].hi = q[i];
  __m256 s[8];
  for (int i = 0; i < 8; ++i) q[i] = r[i].hi, s[i] = r[8 + i].lo;  // rows 0-7, columns 8-15 / rows 8-15, columns 0-7
  avx2::transpose8(q);
  avx2::transpose8(s);
  for (int i = 0; i < 8; ++i) r[i].hi = s[i], r[8 + i].lo = q[i];
}

}  // namespace radixlm::simd
