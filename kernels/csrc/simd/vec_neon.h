// The vector layer on aarch64 NEON: four 4-lane registers per vector, v[q] holding lanes
// 4q..4q+3 (see vec.h; vec_generic.h defines every op, and this file gives the same bits, but
// for the order of vreduce_add's sum, the single rounding of vfmadd / vfnmadd / vfmsub, and
// vcvt_i out of range, which saturates here). NEON's own max / min differ from the x86
// semantics vec_generic.h defines on NaN, so vmax / vmin compare and select instead.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace radixlm::simd {

struct Vf {
  float32x4_t v[4];
};
struct Vi {
  int32x4_t v[4];
};

namespace neon {

inline int clamp16(int64_t n) { return n <= 0 ? 0 : n >= 16 ? 16 : static_cast<int>(n); }
// f applied to each quarter (written out: the four calls stay in registers)
template <typename R, typename F>
inline R map4(F f) { return {{f(0), f(1), f(2), f(3)}}; }
// all ones in lane i of quarter q where bit 4q + i of m is set
inline uint32x4_t mask_q(Mask m, int q) {
  static constexpr uint32_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  return vtstq_u32(vdupq_n_u32(m), vld1q_u32(kBits + 4 * q));
}
// bit 4q + i set where lane i of quarter q is all ones
inline Mask to_mask(uint32x4_t m0, uint32x4_t m1, uint32x4_t m2, uint32x4_t m3) {
  static constexpr uint32_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  const uint32x4_t s = vorrq_u32(vorrq_u32(vandq_u32(m0, vld1q_u32(kBits)), vandq_u32(m1, vld1q_u32(kBits + 4))),
                                 vorrq_u32(vandq_u32(m2, vld1q_u32(kBits + 8)), vandq_u32(m3, vld1q_u32(kBits + 12))));
  return static_cast<Mask>(vaddvq_u32(s));
}
inline uint32x4_t is_nan(float32x4_t x) { return vmvnq_u32(vceqq_f32(x, x)); }
// per lane: hi > lo ? hi : lo (see vreduce_max)
inline float32x4_t first_max(float32x4_t hi, float32x4_t lo) { return vbslq_f32(vcgtq_f32(hi, lo), hi, lo); }
// 4 x 4 transpose of quarters: a[j] lane d -> out[d] lane j
inline void transpose4(const float32x4_t a[4], float32x4_t out[4]) {
  const float32x4_t t0 = vtrn1q_f32(a[0], a[1]), t1 = vtrn2q_f32(a[0], a[1]);
  const float32x4_t t2 = vtrn1q_f32(a[2], a[3]), t3 = vtrn2q_f32(a[2], a[3]);
  out[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
  out[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
  out[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
  out[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

}  // namespace neon

// --- float32 lanes ---
inline Vf vzero() { return neon::map4<Vf>([](int) { return vdupq_n_f32(0.0f); }); }
inline Vf vset1(float x) { const float32x4_t v = vdupq_n_f32(x); return {{v, v, v, v}}; }
inline Vf vload(const float* p) { return neon::map4<Vf>([&](int q) { return vld1q_f32(p + 4 * q); }); }
inline void vstore(float* p, Vf a) {  // four stores written out: a loop here is not unrolled at -O2
  vst1q_f32(p, a.v[0]);
  vst1q_f32(p + 4, a.v[1]);
  vst1q_f32(p + 8, a.v[2]);
  vst1q_f32(p + 12, a.v[3]);
}
// through a copy on the stack: reads / writes exactly p[0, n)
inline Vf vload_n(const float* p, int64_t n) {
  float t[16] = {};
  std::memcpy(t, p, sizeof(float) * neon::clamp16(n));
  return vload(t);
}
inline void vstore_n(float* p, Vf a, int64_t n) {
  float t[16];
  vstore(t, a);
  std::memcpy(p, t, sizeof(float) * neon::clamp16(n));
}
inline Vf vadd(Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vaddq_f32(a.v[q], b.v[q]); }); }
inline Vf vsub(Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vsubq_f32(a.v[q], b.v[q]); }); }
inline Vf vmul(Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vmulq_f32(a.v[q], b.v[q]); }); }
inline Vf vdiv(Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vdivq_f32(a.v[q], b.v[q]); }); }
// a > b ? a : b (b on NaN and on +0 / -0), as x86's maxps; not vmaxq_f32 (NaN if either is)
inline Vf vmax(Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vbslq_f32(vcgtq_f32(a.v[q], b.v[q]), a.v[q], b.v[q]); }); }
inline Vf vmin(Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vbslq_f32(vcltq_f32(a.v[q], b.v[q]), a.v[q], b.v[q]); }); }
inline Vf vabs(Vf a) { return neon::map4<Vf>([&](int q) { return vabsq_f32(a.v[q]); }); }
inline Vf vfmadd(Vf a, Vf b, Vf c) { return neon::map4<Vf>([&](int q) { return vfmaq_f32(c.v[q], a.v[q], b.v[q]); }); }
inline Vf vfnmadd(Vf a, Vf b, Vf c) { return neon::map4<Vf>([&](int q) { return vfmsq_f32(c.v[q], a.v[q], b.v[q]); }); }
// a*b + (-c): an exact zero is +0, as x86's vfmsub (not -(c - a*b))
inline Vf vfmsub(Vf a, Vf b, Vf c) { return neon::map4<Vf>([&](int q) { return vfmaq_f32(vnegq_f32(c.v[q]), a.v[q], b.v[q]); }); }
inline float vreduce_add(Vf a) { return vaddvq_f32(vaddq_f32(vaddq_f32(a.v[0], a.v[1]), vaddq_f32(a.v[2], a.v[3]))); }
// The sequential definition's result exactly: NaN lanes but lane 0 can never win (made -inf), and
// a tree whose every step keeps the lower-indexed side on ties and NaN (neon::first_max), over
// runs of consecutive lanes: pairs 2i / 2i+1, then groups of 4, 8, 16.
inline float vreduce_max(Vf a) {
  const float32x4_t ninf = vdupq_n_f32(-__builtin_inff());
  static constexpr uint32_t kNotLane0[4] = {0, ~0u, ~0u, ~0u};
  const float32x4_t x[4] = {vbslq_f32(vandq_u32(neon::is_nan(a.v[0]), vld1q_u32(kNotLane0)), ninf, a.v[0]),
                            vbslq_f32(neon::is_nan(a.v[1]), ninf, a.v[1]), vbslq_f32(neon::is_nan(a.v[2]), ninf, a.v[2]),
                            vbslq_f32(neon::is_nan(a.v[3]), ninf, a.v[3])};
  // [0-1 2-3 4-5 6-7] and [8-9 10-11 12-13 14-15]
  const float32x4_t p0 = neon::first_max(vuzp2q_f32(x[0], x[1]), vuzp1q_f32(x[0], x[1]));
  const float32x4_t p1 = neon::first_max(vuzp2q_f32(x[2], x[3]), vuzp1q_f32(x[2], x[3]));
  const float32x4_t g = neon::first_max(vuzp2q_f32(p0, p1), vuzp1q_f32(p0, p1));  // [0-3 4-7 8-11 12-15]
  const float32x4_t h = neon::first_max(vuzp2q_f32(g, g), vuzp1q_f32(g, g));    // [0-7 8-15 . .]
  return vgetq_lane_f32(neon::first_max(vdupq_laneq_f32(h, 1), h), 0);
}
inline Vf vround(Vf a) { return neon::map4<Vf>([&](int q) { return vrndnq_f32(a.v[q]); }); }
// as vec_generic.h: k = n clamped to [-126, 127], p * 2^(n - k) (exact) * 2^k (the one rounding)
inline Vf vscale2(Vf p, Vf n) {
  return neon::map4<Vf>([&](int q) {
    const int32x4_t k = vcvtq_s32_f32(n.v[q]), k2 = vminq_s32(vmaxq_s32(k, vdupq_n_s32(-126)), vdupq_n_s32(127));
    const float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(k, k2), vdupq_n_s32(127)), 23));
    const float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p.v[q], f1), f2);
  });
}

// --- lane masks ---
inline Mask vcmp_gt(Vf a, Vf b) {
  return neon::to_mask(vcgtq_f32(a.v[0], b.v[0]), vcgtq_f32(a.v[1], b.v[1]), vcgtq_f32(a.v[2], b.v[2]), vcgtq_f32(a.v[3], b.v[3]));
}
inline Mask vcmp_nan(Vf a) { return neon::to_mask(neon::is_nan(a.v[0]), neon::is_nan(a.v[1]), neon::is_nan(a.v[2]), neon::is_nan(a.v[3])); }
inline Vf vselect(Mask m, Vf a, Vf b) { return neon::map4<Vf>([&](int q) { return vbslq_f32(neon::mask_q(m, q), a.v[q], b.v[q]); }); }
inline Vf vmaskz(Mask m, Vf a) {
  return neon::map4<Vf>([&](int q) { return vreinterpretq_f32_u32(vandq_u32(neon::mask_q(m, q), vreinterpretq_u32_f32(a.v[q]))); });
}
inline Vf vmask_max(Vf src, Mask m, Vf a, Vf b) { return vselect(m, vmax(a, b), src); }

// --- int32 lanes ---
inline Vi vzero_i() { return neon::map4<Vi>([](int) { return vdupq_n_s32(0); }); }
inline Vi vset1_i(int32_t x) { const int32x4_t v = vdupq_n_s32(x); return {{v, v, v, v}}; }
inline Vi vload_i(const void* p) { return neon::map4<Vi>([&](int q) { return vld1q_s32(static_cast<const int32_t*>(p) + 4 * q); }); }
inline void vstore_i(void* p, Vi a) {
  int32_t* q = static_cast<int32_t*>(p);
  vst1q_s32(q, a.v[0]);
  vst1q_s32(q + 4, a.v[1]);
  vst1q_s32(q + 8, a.v[2]);
  vst1q_s32(q + 12, a.v[3]);
}
inline Vi vadd_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return vaddq_s32(a.v[q], b.v[q]); }); }
inline Vi vsub_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return vsubq_s32(a.v[q], b.v[q]); }); }
inline Vi vand_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return vandq_s32(a.v[q], b.v[q]); }); }
inline Vi vor_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return vorrq_s32(a.v[q], b.v[q]); }); }
inline Vi vxor_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return veorq_s32(a.v[q], b.v[q]); }); }
// N in [0, 31] (NEON's immediate shifts take [0, 31] left, [1, 32] right)
template <int N> inline Vi vshl_i(Vi a) { return neon::map4<Vi>([&](int q) { return vshlq_n_s32(a.v[q], N); }); }
template <int N> inline Vi vshr_i(Vi a) {
  if constexpr (N == 0) return a;
  else return neon::map4<Vi>([&](int q) { return vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a.v[q]), N)); });
}
template <int N> inline Vi vsra_i(Vi a) {
  if constexpr (N == 0) return a;
  else return neon::map4<Vi>([&](int q) { return vshrq_n_s32(a.v[q], N); });
}
inline Vi vmin_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return vminq_s32(a.v[q], b.v[q]); }); }
inline Vi vmax_i(Vi a, Vi b) { return neon::map4<Vi>([&](int q) { return vmaxq_s32(a.v[q], b.v[q]); }); }
inline Mask vcmp_le_i(Vi a, Vi b) {
  return neon::to_mask(vcleq_s32(a.v[0], b.v[0]), vcleq_s32(a.v[1], b.v[1]), vcleq_s32(a.v[2], b.v[2]), vcleq_s32(a.v[3], b.v[3]));
}
inline int32_t vreduce_add_i(Vi a) { return vaddvq_s32(vaddq_s32(vaddq_s32(a.v[0], a.v[1]), vaddq_s32(a.v[2], a.v[3]))); }
inline Vf vcast_f(Vi a) { return neon::map4<Vf>([&](int q) { return vreinterpretq_f32_s32(a.v[q]); }); }
inline Vi vcast_i(Vf a) { return neon::map4<Vi>([&](int q) { return vreinterpretq_s32_f32(a.v[q]); }); }
inline Vf vcvt_f(Vi a) { return neon::map4<Vf>([&](int q) { return vcvtq_f32_s32(a.v[q]); }); }
// to nearest, ties to even; out of range saturates (unspecified by vec_generic.h)
inline Vi vcvt_i(Vf a) { return neon::map4<Vi>([&](int q) { return vcvtnq_s32_f32(a.v[q]); }); }
inline Vi vload_i8(const int8_t* p) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t l = vmovl_s8(vget_low_s8(b)), h = vmovl_high_s8(b);
  return {{vmovl_s16(vget_low_s16(l)), vmovl_high_s16(l), vmovl_s16(vget_low_s16(h)), vmovl_high_s16(h)}};
}
inline Vi vload_u8(const uint8_t* p) {
  const uint8x16_t b = vld1q_u8(p);
  const uint16x8_t l = vmovl_u8(vget_low_u8(b)), h = vmovl_high_u8(b);
  return {{vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(l))), vreinterpretq_s32_u32(vmovl_high_u16(l)),
           vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))), vreinterpretq_s32_u32(vmovl_high_u16(h))}};
}
inline Vi vload_u16(const uint16_t* p) {
  const uint16x8_t l = vld1q_u16(p), h = vld1q_u16(p + 8);
  return {{vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(l))), vreinterpretq_s32_u32(vmovl_high_u16(l)),
           vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))), vreinterpretq_s32_u32(vmovl_high_u16(h))}};
}
// saturate to int16, then to int8 (the same as saturating to int8 at once)
inline void vstore_i8_sat(int8_t* p, Vi a) {
  const int16x8_t l = vqmovn_high_s32(vqmovn_s32(a.v[0]), a.v[1]), h = vqmovn_high_s32(vqmovn_s32(a.v[2]), a.v[3]);
  vst1q_s8(p, vqmovn_high_s16(vqmovn_s16(l), h));
}

// --- bfloat16 / float16 ---
inline Vf vbf16_low(Vi a) { return vcast_f(vshl_i<16>(a)); }
inline Vf vbf16_high(Vi a) { return vcast_f(vand_i(a, vset1_i(static_cast<int32_t>(0xFFFF0000u)))); }
inline Vi vto_bf16_bits(Vf a) {
  return neon::map4<Vi>([&](int q) {
    const uint32x4_t bits = vreinterpretq_u32_f32(a.v[q]);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(bits, vaddq_u32(lsb, vdupq_n_u32(0x7FFF))), 16);
    return vreinterpretq_s32_u32(vbslq_u32(neon::is_nan(a.v[q]), vdupq_n_u32(0x7FC0), r));
  });
}
inline Vf vload_bf16(const uint16_t* p) {
  const uint16x8_t l = vld1q_u16(p), h = vld1q_u16(p + 8), z = vdupq_n_u16(0);
  // (0, x) pairs of 16-bit lanes: x in the high half of each 32-bit lane
  return {{vreinterpretq_f32_u16(vzip1q_u16(z, l)), vreinterpretq_f32_u16(vzip2q_u16(z, l)),
           vreinterpretq_f32_u16(vzip1q_u16(z, h)), vreinterpretq_f32_u16(vzip2q_u16(z, h))}};
}
// through a zeroed copy of the n values on the stack: reads exactly p[0, n)
inline Vf vload_bf16_n(const uint16_t* p, int64_t n) {
  uint16_t t[16] = {};
  std::memcpy(t, p, sizeof(uint16_t) * neon::clamp16(n));
  return vload_bf16(t);
}
namespace neon {
// the bf16 of lanes 0-7 / 8-15 (each < 2^16, so narrowing keeps it)
inline uint16x8_t bf16_words(const Vi& r, int half) {
  return vmovn_high_u32(vmovn_u32(vreinterpretq_u32_s32(r.v[2 * half])), vreinterpretq_u32_s32(r.v[2 * half + 1]));
}
}  // namespace neon
inline void vstore_bf16(uint16_t* p, Vf a) {
  const Vi r = vto_bf16_bits(a);
  vst1q_u16(p, neon::bf16_words(r, 0));
  vst1q_u16(p + 8, neon::bf16_words(r, 1));
}
// through a copy on the stack: writes exactly p[0, n)
inline void vstore_bf16_n(uint16_t* p, Vf a, int64_t n) {
  uint16_t t[16];
  vstore_bf16(t, a);
  std::memcpy(p, t, sizeof(uint16_t) * neon::clamp16(n));
}
inline Vi vpack_bf16_pairs(Vf lo, Vf hi) { return vor_i(vto_bf16_bits(lo), vshl_i<16>(vto_bf16_bits(hi))); }
inline Vf vload_f16(const uint16_t* p) {
  const float16x8_t l = vreinterpretq_f16_u16(vld1q_u16(p)), h = vreinterpretq_f16_u16(vld1q_u16(p + 8));
  return {{vcvt_f32_f16(vget_low_f16(l)), vcvt_high_f32_f16(l), vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)}};
}

// In place: r[j] lane d -> r[d] lane j, a 16 x 16 float tile held in 16 vectors: each 4 x 4 block
// (rows 4i.., quarter q) transposes into rows 4q.., quarter i.
inline void transpose16(Vf r[16]) {
  Vf out[16];
  for (int i = 0; i < 4; ++i) {
    for (int q = 0; q < 4; ++q) {
      const float32x4_t blk[4] = {r[4 * i].v[q], r[4 * i + 1].v[q], r[4 * i + 2].v[q], r[4 * i + 3].v[q]};
      float32x4_t t[4];
      neon::transpose4(blk, t);
      for (int j = 0; j < 4; ++j) out[4 * q + j].v[i] = t[j];
    }
  }
  for (int j = 0; j < 16; ++j) r[j] = out[j];
}

}  // namespace radixlm::simd
