// The vector layer on AVX-512 (F + BW): one register per vector (see vec.h; vec_generic.h
// defines every op).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace radixlm::simd {

struct Vf {
  __m512 v;
};
struct Vi {
  __m512i v;
};

// --- float32 lanes ---
inline Vf vzero() { return {_mm512_setzero_ps()}; }
inline Vf vset1(float x) { return {_mm512_set1_ps(x)}; }
inline Vf vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, Vf a) { _mm512_storeu_ps(p, a.v); }
inline Vf vload_n(const float* p, int64_t n) { return {_mm512_maskz_loadu_ps(vtail(n), p)}; }
inline void vstore_n(float* p, Vf a, int64_t n) { _mm512_mask_storeu_ps(p, vtail(n), a.v); }
inline Vf vadd(Vf a, Vf b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vf vsub(Vf a, Vf b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vf vmul(Vf a, Vf b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vf vdiv(Vf a, Vf b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vf vmax(Vf a, Vf b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Vf vmin(Vf a, Vf b) { return {_mm512_min_ps(a.v, b.v)}; }
inline Vf vabs(Vf a) { return {_mm512_abs_ps(a.v)}; }
inline Vf vfmadd(Vf a, Vf b, Vf c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf vfnmadd(Vf a, Vf b, Vf c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline Vf vfmsub(Vf a, Vf b, Vf c) { return {_mm512_fmsub_ps(a.v, b.v, c.v)}; }
inline float vreduce_add(Vf a) { return _mm512_reduce_add_ps(a.v); }
// The sequential definition's result exactly (_mm512_reduce_max_ps is not: its tree can drop a
// NaN lane's neighbours and pick either of +0 / -0): NaN lanes but lane 0 made -inf, then a tree
// that keeps the lower-indexed side on ties and NaN, over runs of consecutive lanes (2, 4, 8, 16).
inline float vreduce_max(Vf a) {
  const auto first_max = [](__m512 hi, __m512 lo) { return _mm512_mask_mov_ps(lo, _mm512_cmp_ps_mask(hi, lo, _CMP_GT_OQ), hi); };
  __m512 x = _mm512_mask_mov_ps(a.v, _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q) & 0xFFFE, _mm512_set1_ps(-__builtin_inff()));
  x = first_max(_mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)), x);  // lane 2i: lanes 2i, 2i+1
  x = first_max(_mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)), x);  // lane 4i: lanes 4i..4i+3
  x = first_max(_mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)), x);  // lane 8i: lanes 8i..8i+7
  x = first_max(_mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)), x);
  return _mm512_cvtss_f32(x);
}
inline Vf vround(Vf a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline Vf vscale2(Vf p, Vf n) { return {_mm512_scalef_ps(p.v, n.v)}; }

// --- lane masks ---
inline Mask vcmp_gt(Vf a, Vf b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ); }
inline Mask vcmp_nan(Vf a) { return _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q); }
inline Vf vselect(Mask m, Vf a, Vf b) { return {_mm512_mask_mov_ps(b.v, m, a.v)}; }
inline Vf vmaskz(Mask m, Vf a) { return {_mm512_maskz_mov_ps(m, a.v)}; }
inline Vf vmask_max(Vf src, Mask m, Vf a, Vf b) { return {_mm512_mask_max_ps(src.v, m, a.v, b.v)}; }

// --- int32 lanes ---
inline Vi vzero_i() { return {_mm512_setzero_si512()}; }
inline Vi vset1_i(int32_t x) { return {_mm512_set1_epi32(x)}; }
inline Vi vload_i(const void* p) { return {_mm512_loadu_si512(p)}; }
inline void vstore_i(void* p, Vi a) { _mm512_storeu_si512(p, a.v); }
inline Vi vadd_i(Vi a, Vi b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline Vi vsub_i(Vi a, Vi b) { return {_mm512_sub_epi32(a.v, b.v)}; }
inline Vi vand_i(Vi a, Vi b) { return {_mm512_and_si512(a.v, b.v)}; }
inline Vi vor_i(Vi a, Vi b) { return {_mm512_or_si512(a.v, b.v)}; }
inline Vi vxor_i(Vi a, Vi b) { return {_mm512_xor_si512(a.v, b.v)}; }
template <int N> inline Vi vshl_i(Vi a) { return {_mm512_slli_epi32(a.v, N)}; }
template <int N> inline Vi vshr_i(Vi a) { return {_mm512_srli_epi32(a.v, N)}; }
template <int N> inline Vi vsra_i(Vi a) { return {_mm512_srai_epi32(a.v, N)}; }
inline Vi vmin_i(Vi a, Vi b) { return {_mm512_min_epi32(a.v, b.v)}; }
inline Vi vmax_i(Vi a, Vi b) { return {_mm512_max_epi32(a.v, b.v)}; }
inline Mask vcmp_le_i(Vi a, Vi b) { return _mm512_cmple_epi32_mask(a.v, b.v); }
inline int32_t vreduce_add_i(Vi a) { return _mm512_reduce_add_epi32(a.v); }
inline Vf vcast_f(Vi a) { return {_mm512_castsi512_ps(a.v)}; }
inline Vi vcast_i(Vf a) { return {_mm512_castps_si512(a.v)}; }
inline Vf vcvt_f(Vi a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline Vi vcvt_i(Vf a) { return {_mm512_cvtps_epi32(a.v)}; }
inline Vi vload_i8(const int8_t* p) { return {_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))}; }
inline Vi vload_u8(const uint8_t* p) { return {_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))}; }
inline Vi vload_u16(const uint16_t* p) { return {_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline void vstore_i8_sat(int8_t* p, Vi a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(a.v)); }

// --- bfloat16 / float16 ---
inline Vf vbf16_low(Vi a) { return vcast_f(vshl_i<16>(a)); }
inline Vf vbf16_high(Vi a) { return vcast_f(vand_i(a, vset1_i(static_cast<int32_t>(0xFFFF0000u)))); }
inline Vi vto_bf16_bits(Vf a) {
  const Vi bits = vcast_i(a);
  const Vi lsb = vand_i(vshr_i<16>(bits), vset1_i(1));
  const Vi r = vshr_i<16>(vadd_i(bits, vadd_i(lsb, vset1_i(0x7FFF))));
  return {_mm512_mask_mov_epi32(r.v, vcmp_nan(a), _mm512_set1_epi32(0x7FC0))};
}
inline Vf vload_bf16(const uint16_t* p) { return vbf16_low(vload_u16(p)); }
inline Vf vload_bf16_n(const uint16_t* p, int64_t n) {
  const __m256i half = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(static_cast<__mmask32>(vtail(n)), p));
  return vbf16_low({_mm512_cvtepu16_epi32(half)});
}
inline void vstore_bf16(uint16_t* p, Vf a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(vto_bf16_bits(a).v));
}
inline void vstore_bf16_n(uint16_t* p, Vf a, int64_t n) {
  _mm512_mask_storeu_epi16(p, static_cast<__mmask32>(vtail(n)), _mm512_castsi256_si512(_mm512_cvtepi32_epi16(vto_bf16_bits(a).v)));
}
inline Vi vpack_bf16_pairs(Vf lo, Vf hi) { return vor_i(vto_bf16_bits(lo), vshl_i<16>(vto_bf16_bits(hi))); }
inline Vf vload_f16(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }

// In place: r[j] lane d -> r[d] lane j, a 16 x 16 float tile held in 16 vectors.
inline void transpose16(Vf r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane L: [r2i[4L], r2i+1[4L], r2i[4L+1], r2i+1[4L+1]] / +2, +3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  __m512 u[16];
  for (int i = 0; i < 4; ++i) {  // u[4i + k] lane L: column 4L + k of rows 4i..4i+3
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {  // a 4 x 4 transpose of 128-bit lanes, for each k
    const __m512 p = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), q = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44);
    const __m512 s = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE), w = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
    r[k].v = _mm512_shuffle_f32x4(p, q, 0x88);
    r[4 + k].v = _mm512_shuffle_f32x4(p, q, 0xDD);
    r[8 + k].v = _mm512_shuffle_f32x4(s, w, 0x88);
    r[12 + k].v = _mm512_shuffle_f32x4(s, w, 0xDD);
  }
}

}  // namespace radixlm::simd
