// The vector layer in plain C++ (see vec.h): the definition of every op, and the level every
// CPU runs (the compiler vectorizes these loops for the baseline ISA, SSE2 or NEON).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace radixlm::simd {

struct Vf {
  float v[16];
};
struct Vi {
  int32_t v[16];
};

#define RADIXLM_LANES(i) for (int i = 0; i < 16; ++i)

// --- float32 lanes ---
inline Vf vzero() { Vf r; RADIXLM_LANES(i) r.v[i] = 0.0f; return r; }
inline Vf vset1(float x) { Vf r; RADIXLM_LANES(i) r.v[i] = x; return r; }
inline Vf vload(const float* p) { Vf r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline void vstore(float* p, Vf a) { std::memcpy(p, a.v, sizeof a.v); }
// lanes [0, n) from p, the others 0 (reads nothing past p + n)
inline Vf vload_n(const float* p, int64_t n) { Vf r = vzero(); for (int64_t i = 0; i < n && i < 16; ++i) r.v[i] = p[i]; return r; }
// lanes [0, n) to p (writes nothing past p + n)
inline void vstore_n(float* p, Vf a, int64_t n) { for (int64_t i = 0; i < n && i < 16; ++i) p[i] = a.v[i]; }
inline Vf vadd(Vf a, Vf b) { RADIXLM_LANES(i) a.v[i] += b.v[i]; return a; }
inline Vf vsub(Vf a, Vf b) { RADIXLM_LANES(i) a.v[i] -= b.v[i]; return a; }
inline Vf vmul(Vf a, Vf b) { RADIXLM_LANES(i) a.v[i] *= b.v[i]; return a; }
inline Vf vdiv(Vf a, Vf b) { RADIXLM_LANES(i) a.v[i] /= b.v[i]; return a; }
// max / min as x86's maxps / minps: the second operand where either is NaN
inline Vf vmax(Vf a, Vf b) { RADIXLM_LANES(i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
inline Vf vmin(Vf a, Vf b) { RADIXLM_LANES(i) a.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i]; return a; }
inline Vf vabs(Vf a) { RADIXLM_LANES(i) a.v[i] = std::fabs(a.v[i]); return a; }
inline Vf vfmadd(Vf a, Vf b, Vf c) { RADIXLM_LANES(i) c.v[i] = a.v[i] * b.v[i] + c.v[i]; return c; }   // a*b + c
inline Vf vfnmadd(Vf a, Vf b, Vf c) { RADIXLM_LANES(i) c.v[i] = c.v[i] - a.v[i] * b.v[i]; return c; }  // c - a*b
inline Vf vfmsub(Vf a, Vf b, Vf c) { RADIXLM_LANES(i) c.v[i] = a.v[i] * b.v[i] - c.v[i]; return c; }   // a*b - c
inline float vreduce_add(Vf a) {
  float s = 0.0f;
  RADIXLM_LANES(i) s += a.v[i];
  return s;
}
// the largest lane, by this sequential scan: a NaN in lane 0 is the result, a NaN in another lane is
// skipped, and of equal lanes (+0, -0) the first is kept
inline float vreduce_max(Vf a) {
  float m = a.v[0];
  for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
// to the nearest integer, ties to even
inline Vf vround(Vf a) { RADIXLM_LANES(i) a.v[i] = std::nearbyint(a.v[i]); return a; }
// p * 2^n rounded once, for integral n in [-150, 128] and every p (AVX-512's scalef on that
// range): p * 2^(n - k) * 2^k with k = n clamped to [-126, 127], two normal power-of-two factors
// built from their bits. The first product is exact (2^(n - k) >= 2^-24, so it is normal unless
// the whole result is below 2^-252, i.e. +-0 either way): only the second rounds.
inline Vf vscale2(Vf p, Vf n) {
  RADIXLM_LANES(i) {
    const int32_t k = static_cast<int32_t>(n.v[i]), k2 = k < -126 ? -126 : k > 127 ? 127 : k, k1 = k - k2;
    const uint32_t b1 = static_cast<uint32_t>(k1 + 127) << 23, b2 = static_cast<uint32_t>(k2 + 127) << 23;
    float f1, f2;
    std::memcpy(&f1, &b1, 4);
    std::memcpy(&f2, &b2, 4);
    p.v[i] = p.v[i] * f1 * f2;
  }
  return p;
}

// --- lane masks ---
inline Mask vcmp_gt(Vf a, Vf b) { Mask m = 0; RADIXLM_LANES(i) m |= static_cast<Mask>((a.v[i] > b.v[i]) << i); return m; }
// lanes where a is NaN
inline Mask vcmp_nan(Vf a) { Mask m = 0; RADIXLM_LANES(i) m |= static_cast<Mask>(std::isnan(a.v[i]) << i); return m; }
// a where m, else b
inline Vf vselect(Mask m, Vf a, Vf b) { RADIXLM_LANES(i) b.v[i] = (m >> i) & 1 ? a.v[i] : b.v[i]; return b; }
inline Vf vmaskz(Mask m, Vf a) { RADIXLM_LANES(i) a.v[i] = (m >> i) & 1 ? a.v[i] : 0.0f; return a; }
// max(a, b) where m, else src
inline Vf vmask_max(Vf src, Mask m, Vf a, Vf b) { return vselect(m, vmax(a, b), src); }

// --- int32 lanes ---
inline Vi vzero_i() { Vi r; RADIXLM_LANES(i) r.v[i] = 0; return r; }
inline Vi vset1_i(int32_t x) { Vi r; RADIXLM_LANES(i) r.v[i] = x; return r; }
inline Vi vload_i(const void* p) { Vi r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline void vstore_i(void* p, Vi a) { std::memcpy(p, a.v, sizeof a.v); }
inline Vi vadd_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) + static_cast<uint32_t>(b.v[i])); return a; }
inline Vi vsub_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) - static_cast<uint32_t>(b.v[i])); return a; }
inline Vi vand_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] &= b.v[i]; return a; }
inline Vi vor_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] |= b.v[i]; return a; }
inline Vi vxor_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] ^= b.v[i]; return a; }
template <int N> inline Vi vshl_i(Vi a) { RADIXLM_LANES(i) a.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) << N); return a; }
template <int N> inline Vi vshr_i(Vi a) { RADIXLM_LANES(i) a.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) >> N); return a; }  // logical
template <int N> inline Vi vsra_i(Vi a) { RADIXLM_LANES(i) a.v[i] >>= N; return a; }  // arithmetic
inline Vi vmin_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i]; return a; }
inline Vi vmax_i(Vi a, Vi b) { RADIXLM_LANES(i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
inline Mask vcmp_le_i(Vi a, Vi b) { Mask m = 0; RADIXLM_LANES(i) m |= static_cast<Mask>((a.v[i] <= b.v[i]) << i); return m; }
inline int32_t vreduce_add_i(Vi a) {
  uint32_t s = 0;
  RADIXLM_LANES(i) s += static_cast<uint32_t>(a.v[i]);
  return static_cast<int32_t>(s);
}
// the same 32 bits read as the other type
inline Vf vcast_f(Vi a) { Vf r; std::memcpy(r.v, a.v, sizeof r.v); return r; }
inline Vi vcast_i(Vf a) { Vi r; std::memcpy(r.v, a.v, sizeof r.v); return r; }
// int32 -> float32 (rounded to nearest even); float32 -> int32 rounded to nearest even. Out of
// range (rounded beyond int32) and NaN give an unspecified int32: x86 gives INT32_MIN (as here), NEON
// saturates; kernels only convert values in range.
inline Vf vcvt_f(Vi a) { Vf r; RADIXLM_LANES(i) r.v[i] = static_cast<float>(a.v[i]); return r; }
inline Vi vcvt_i(Vf a) {
  Vi r;
  RADIXLM_LANES(i) {
    const float x = std::nearbyint(a.v[i]);
    r.v[i] = x >= -2147483648.0f && x < 2147483648.0f ? static_cast<int32_t>(x) : INT32_MIN;
  }
  return r;
}
// 16 bytes widened: signed / unsigned; 16 uint16 widened
inline Vi vload_i8(const int8_t* p) { Vi r; RADIXLM_LANES(i) r.v[i] = p[i]; return r; }
inline Vi vload_u8(const uint8_t* p) { Vi r; RADIXLM_LANES(i) r.v[i] = p[i]; return r; }
inline Vi vload_u16(const uint16_t* p) { Vi r; RADIXLM_LANES(i) r.v[i] = p[i]; return r; }
// 16 int32 narrowed to int8 with saturation
inline void vstore_i8_sat(int8_t* p, Vi a) {
  RADIXLM_LANES(i) p[i] = static_cast<int8_t>(a.v[i] < -128 ? -128 : a.v[i] > 127 ? 127 : a.v[i]);
}

// --- bfloat16 / float16 ---
// bf16 bits in the low 16 of each lane -> float (exact)
inline Vf vbf16_low(Vi a) { return vcast_f(vshl_i<16>(a)); }
// bf16 bits in the high 16 of each lane -> float (exact)
inline Vf vbf16_high(Vi a) { return vcast_f(vand_i(a, vset1_i(static_cast<int32_t>(0xFFFF0000u)))); }
// float -> bf16 bits in the low 16 of each lane (high 16 zero): round to nearest even, NaN -> 0x7FC0
inline Vi vto_bf16_bits(Vf a) {
  const Vi bits = vcast_i(a);
  const Vi lsb = vand_i(vshr_i<16>(bits), vset1_i(1));
  const Vi r = vshr_i<16>(vadd_i(bits, vadd_i(lsb, vset1_i(0x7FFF))));
  const Mask nan = vcmp_nan(a);
  Vi out;
  RADIXLM_LANES(i) out.v[i] = (nan >> i) & 1 ? 0x7FC0 : r.v[i];
  return out;
}
inline Vf vload_bf16(const uint16_t* p) { return vbf16_low(vload_u16(p)); }
inline Vf vload_bf16_n(const uint16_t* p, int64_t n) {
  uint16_t t[16] = {};
  for (int64_t i = 0; i < n && i < 16; ++i) t[i] = p[i];
  return vload_bf16(t);
}
inline void vstore_bf16(uint16_t* p, Vf a) { const Vi r = vto_bf16_bits(a); RADIXLM_LANES(i) p[i] = static_cast<uint16_t>(r.v[i]); }
inline void vstore_bf16_n(uint16_t* p, Vf a, int64_t n) {
  const Vi r = vto_bf16_bits(a);
  for (int64_t i = 0; i < n && i < 16; ++i) p[i] = static_cast<uint16_t>(r.v[i]);
}
// word i = bf16(lo[i]) | bf16(hi[i]) << 16: a bf16 pair per lane (both rounded as vto_bf16_bits)
inline Vi vpack_bf16_pairs(Vf lo, Vf hi) { return vor_i(vto_bf16_bits(lo), vshl_i<16>(vto_bf16_bits(hi))); }
// 16 IEEE half floats -> float (exact; a signaling NaN quieted, as F16C's and NEON's conversions)
inline Vf vload_f16(const uint16_t* p) {
  Vf r;
  RADIXLM_LANES(i) {
    const uint32_t h = p[i], sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
      bits = sign | 0x7F800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u);
    } else if (exp != 0) {
      bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
      bits = sign;
    } else {  // subnormal half: man * 2^-24, exact in float
      float f = static_cast<float>(man) * 5.9604644775390625e-08f;
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
    std::memcpy(&r.v[i], &bits, 4);
  }
  return r;
}

// In place: r[j] lane d -> r[d] lane j, a 16 x 16 float tile held in 16 vectors.
inline void transpose16(Vf r[16]) {
  for (int i = 0; i < 16; ++i) {
    for (int j = i + 1; j < 16; ++j) {
      const float t = r[i].v[j];
      r[i].v[j] = r[j].v[i];
      r[j].v[i] = t;
    }
  }
}

#undef RADIXLM_LANES

}  // namespace radixlm::simd
