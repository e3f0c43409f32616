// Int8 dot products over 16 lanes, one variant per ISA feature, all giving the same int32 sums.
//
// The product (vpdpbusd's): 64 weight bytes w[4c + j] (lane c, j = 0..3) against four int8 x[j]
// broadcast to every lane:  acc lane c += sum_j u(c, j) * x[j],  where u is
//   WBits::k8   the byte itself, u in [0, 255] (a value stored as q + 128, q = u - 128 signed)
//   WBits::k4   the low or the high nibble of the byte, u in [0, 15]
//   WBits::k6   Q6_K's 6-bit value u in [0, 63], given in registers (from_u6), as the signed
//               q = u - 32: lane c += sum_j q(c, j) * x[j] on every variant
// Contracts, kept by every variant and relied on for exactness:
//   - x in [-127, 127] (never -128: the sign tricks negate x);
//   - an accumulator takes at most 8 dot() calls (one 32-k block) between zero() and sums(), k6
//     at most 4 (one 16-k scale span): some variants hold k4 and k6 sums in int16 lanes meanwhile
//     (8 * 2 * 15 * 127 and 4 * 2 * 32 * 127 < 2^15), generic in float32 lanes (32 * 128 * 127 < 2^24).
// So every sum is exact, and every variant's sums() are the same integers: a kernel's output
// does not depend on the variant it ran (the float code after the sums is the build's own).
//
// A variant is a class template over WBits:
//   D<B>::kName            its name ("avx512_vnni", ...), the same for both WBits
//   D<B>::runs()           whether this CPU (capped at the loaded level) runs it
//   D<B>::run(f)           calls f() in code compiled for the variant's target: the kernel body
//                          using the variant goes in f (flatten inlines it, and the ops, there)
//   D<B>::kTaken           what sums() already took off per unit of sum_j x[j] (k8: 0 or 128;
//                          k4, k6: 0): the caller subtracts the rest of its offset itself
//   D<B>::W   load(p, high)  the 64 bytes at p as weights (k4: their high nibbles if high; not k6)
//   D<B>::W   from_u6(u)     k6: the 64 bytes of the vector layer's u as weights (byte j of lane c
//                          = u(c, j) in [0, 63])
//   D<B>::Acc zero(), dot(acc, w, x4), sums(acc) -> simd::Vi: lane c the sum over the dots of
//   sum_j (u(c, j) - kTaken) * x[j], where x4 holds the four x bytes (x[j] = byte j).
// The variants of this build, fastest first, are the type list Int8Variants; a variant needing
// a feature beyond the build's level is compiled with that target and runs only where cpu_has().
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dispatch/cpu_features.h"
#include "simd/vec.h"

#if defined(RADIXLM_SIMD_NEON)
#include <arm_neon.h>
#endif

namespace radixlm::dot8 {

enum class WBits { k8, k4, k6 };

template <template <WBits> class... D>
struct VariantList {};

// --- generic: over the vector layer's float lanes, at every level ---
// The products and their sums are integers below 2^24 in magnitude (a block: 32 * 128 * 127), so
// float32 holds them exactly: w(c, j) as floats times x[j] broadcast, one FMA per j, and the sums
// converted back. The level's vector code, where integer lanes would have no multiply.
template <WBits B>
struct Generic {
  static constexpr const char* kName = "generic";
  static constexpr int32_t kTaken = B == WBits::k8 ? 128 : 0;
  struct Acc { simd::Vf v; };
  struct W { simd::Vf v[4]; };  // v[j] lane c = u(c, j) - kTaken
  static bool runs() { return true; }
  template <class Fn>
  __attribute__((flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() { return {simd::vzero()}; }
  static W from_u6(const simd::Vi& u) {
    using namespace simd;
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    const Vi low = vset1_i(0xFF), offset = vset1_i(32);
    return {{vcvt_f(vsub_i(vand_i(u, low), offset)), vcvt_f(vsub_i(vand_i(vshr_i<8>(u), low), offset)),
             vcvt_f(vsub_i(vand_i(vshr_i<16>(u), low), offset)), vcvt_f(vsub_i(vand_i(vshr_i<24>(u), low), offset))}};
  }
  static W load(const uint8_t* p, bool high) {
    using namespace simd;
    static_assert(B != WBits::k6, "k6 weights come from from_u6");
    Vi u = vload_i(p);
    if constexpr (B == WBits::k4) u = vand_i(high ? vshr_i<4>(u) : u, vset1_i(0x0F0F0F0F));
    const Vi low = vset1_i(0xFF), taken = vset1_i(kTaken);
    return {{vcvt_f(vsub_i(vand_i(u, low), taken)), vcvt_f(vsub_i(vand_i(vshr_i<8>(u), low), taken)),
             vcvt_f(vsub_i(vand_i(vshr_i<16>(u), low), taken)), vcvt_f(vsub_i(vshr_i<24>(u), taken))}};
  }
  static Acc dot(Acc acc, const W& w, int32_t x4) {
    int8_t x[4];
    std::memcpy(x, &x4, 4);
    for (int j = 0; j < 4; ++j) acc.v = simd::vfmadd(w.v[j], simd::vset1(static_cast<float>(x[j])), acc.v);
    return acc;
  }
  static simd::Vi sums(const Acc& acc) { return simd::vcvt_i(acc.v); }
};

#if defined(RADIXLM_X86) && (defined(RADIXLM_SIMD_AVX2) || defined(RADIXLM_SIMD_AVX512))
// Two ymm halves (lanes 0-7, 8-15) of 16 int32 lanes as the vector layer's Vi.
inline simd::Vi vi_from_halves(__m256i lo, __m256i hi) {
#if defined(RADIXLM_SIMD_AVX512)
  return {_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)};
#else
  return {lo, hi};  // vec_avx2.h: lanes 0-7 in lo, 8-15 in hi
#endif
}

// 32 bytes at p as weight bytes (k4: the low or high nibbles).
template <WBits B>
inline __m256i load_ymm(const uint8_t* p, bool high) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (B == WBits::k8) return raw;
  const __m256i low = _mm256_set1_epi8(0x0F);
  return high ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), low) : _mm256_and_si256(raw, low);
}
#endif

#if defined(RADIXLM_SIMD_AVX2)
// k6 (AVX2, AVX-VNNI): the vector layer's u bytes as q = u - 32 and |q|, per ymm half.
inline void signed_u6(const simd::Vi& u, __m256i (&q)[2], __m256i (&magnitude)[2]) {
  q[0] = _mm256_sub_epi8(u.lo, _mm256_set1_epi8(32));
  q[1] = _mm256_sub_epi8(u.hi, _mm256_set1_epi8(32));
  for (int h = 0; h < 2; ++h) magnitude[h] = _mm256_abs_epi8(q[h]);
}

// --- AVX2: vpmaddubsw + vpmaddwd on ymm halves ---
// k4: u * x pairs into int16 (exact: 2 * 15 * 127), summed in int16 over the block, widened by
// vpmaddwd in sums(). k8: vpmaddubsw's pairs of u * x would saturate (2 * 255 * 127), so it
// multiplies |q| (unsigned, <= 128) by x with q's sign (|x| <= 127): pairs <= 32512, then
// vpmaddwd into int32 on every step; the sums are sum q x (kTaken 128). k6: |q| (<= 32) by x with
// q's sign, pairs <= 8128 summed in int16 over the span, widened in sums().
template <WBits B>
struct Avx2 {
  static constexpr const char* kName = "avx2";
  static constexpr int32_t kTaken = B == WBits::k8 ? 128 : 0;
  struct Acc { __m256i h[2]; };
  struct W { __m256i u[2], q[2]; };  // k8, k6: u = |q|, q the signed values; k4: u the nibbles
  static bool runs() { return true; }
  template <class Fn>
  __attribute__((flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
  static W from_u6(const simd::Vi& u) {
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    W w;
    signed_u6(u, w.q, w.u);
    return w;
  }
  static W load(const uint8_t* p, bool high) {
    static_assert(B != WBits::k6, "k6 weights come from from_u6");
    W w;
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load_ymm<B>(p + 32 * h, high);
      if constexpr (B == WBits::k8) {
        w.q[h] = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
        w.u[h] = _mm256_abs_epi8(w.q[h]);
      } else {
        w.u[h] = v;
        w.q[h] = _mm256_setzero_si256();  // unused
      }
    }
    return w;
  }
  static Acc dot(Acc acc, const W& w, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    for (int h = 0; h < 2; ++h) {
      if constexpr (B == WBits::k8) {
        const __m256i pairs = _mm256_maddubs_epi16(w.u[h], _mm256_sign_epi8(x, w.q[h]));
        acc.h[h] = _mm256_add_epi32(acc.h[h], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
      } else if constexpr (B == WBits::k6) {
        acc.h[h] = _mm256_add_epi16(acc.h[h], _mm256_maddubs_epi16(w.u[h], _mm256_sign_epi8(x, w.q[h])));
      } else {
        acc.h[h] = _mm256_add_epi16(acc.h[h], _mm256_maddubs_epi16(w.u[h], x));
      }
    }
    return acc;
  }
  static simd::Vi sums(const Acc& acc) {
    if constexpr (B == WBits::k8) return vi_from_halves(acc.h[0], acc.h[1]);
    const __m256i one = _mm256_set1_epi16(1);
    return vi_from_halves(_mm256_madd_epi16(acc.h[0], one), _mm256_madd_epi16(acc.h[1], one));
  }
};

// --- AVX-VNNI: vpdpbusd on ymm halves (cpu_has(kAvxVnni)) ---
template <WBits B>
struct AvxVnni {
  static constexpr const char* kName = "avx_vnni";
  static constexpr int32_t kTaken = 0;
  struct Acc { __m256i h[2]; };
  struct W { __m256i h[2], q[2]; };  // k6: h = |q|, q the signed values (vpdpbusd multiplies unsigned by signed)
  static bool runs() { return cpu_has(kAvxVnni); }
  template <class Fn>
  __attribute__((target("avxvnni"), flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
  static W from_u6(const simd::Vi& u) {
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    W w;
    signed_u6(u, w.q, w.h);
    return w;
  }
  static W load(const uint8_t* p, bool high) {
    static_assert(B != WBits::k6, "k6 weights come from from_u6");
    return {{load_ymm<B>(p, high), load_ymm<B>(p + 32, high)}, {_mm256_setzero_si256(), _mm256_setzero_si256()}};
  }
  __attribute__((target("avxvnni"))) static Acc dot(Acc acc, const W& w, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    for (int h = 0; h < 2; ++h) {
      const __m256i xs = B == WBits::k6 ? _mm256_sign_epi8(x, w.q[h]) : x;
      acc.h[h] = _mm256_dpbusd_avx_epi32(acc.h[h], w.h[h], xs);
    }
    return acc;
  }
  static simd::Vi sums(const Acc& acc) { return vi_from_halves(acc.h[0], acc.h[1]); }
};

using Int8Variants = VariantList<AvxVnni, Avx2, Generic>;
#endif  // RADIXLM_SIMD_AVX2

#if defined(RADIXLM_SIMD_AVX512)
// 64 bytes at p as weight bytes (k4: the low or high nibbles).
template <WBits B>
inline __m512i load_zmm(const uint8_t* p, bool high) {
  const __m512i raw = _mm512_loadu_si512(p);
  if constexpr (B == WBits::k8) return raw;
  const __m512i low = _mm512_set1_epi8(0x0F);
  return high ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), low) : _mm512_and_si512(raw, low);
}

// k6 (AVX-512BW, AVX512-VNNI): the vector layer's u bytes as q = u - 32.
inline __m512i signed_u6(const simd::Vi& u) { return _mm512_sub_epi8(u.v, _mm512_set1_epi8(32)); }

// --- AVX-512BW: vpmaddubsw + vpmaddwd, as the AVX2 variant on zmm; k8's sign moves onto x by a
// masked negation (AVX-512 has no vpsignb) ---
template <WBits B>
struct Avx512Bw {
  static constexpr const char* kName = "avx512bw";
  static constexpr int32_t kTaken = B == WBits::k8 ? 128 : 0;
  struct Acc { __m512i v; };
  struct W { __m512i u; __mmask64 neg; };  // k8, k6: u = |q|, neg the lanes where q < 0
  static bool runs() { return true; }
  template <class Fn>
  __attribute__((flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() { return {_mm512_setzero_si512()}; }
  static W from_u6(const simd::Vi& u) {
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    const __m512i q = signed_u6(u);
    return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)};
  }
  static W load(const uint8_t* p, bool high) {
    static_assert(B != WBits::k6, "k6 weights come from from_u6");
    const __m512i v = load_zmm<B>(p, high);
    if constexpr (B == WBits::k8) {
      const __m512i q = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
      return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)};
    }
    return {v, 0};
  }
  static Acc dot(Acc acc, const W& w, int32_t x4) {
    const __m512i x = _mm512_set1_epi32(x4);
    if constexpr (B == WBits::k8) {
      const __m512i sx = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);
      return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(_mm512_maddubs_epi16(w.u, sx), _mm512_set1_epi16(1)))};
    }
    if constexpr (B == WBits::k6) {
      const __m512i sx = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);
      return {_mm512_add_epi16(acc.v, _mm512_maddubs_epi16(w.u, sx))};
    }
    return {_mm512_add_epi16(acc.v, _mm512_maddubs_epi16(w.u, x))};
  }
  static simd::Vi sums(const Acc& acc) {
    if constexpr (B == WBits::k8) return {acc.v};
    return {_mm512_madd_epi16(acc.v, _mm512_set1_epi16(1))};
  }
};

// --- AVX512-VNNI: vpdpbusd on zmm (cpu_has(kAvx512Vnni)) ---
template <WBits B>
struct Avx512Vnni {
  static constexpr const char* kName = "avx512_vnni";
  static constexpr int32_t kTaken = 0;
  struct Acc { __m512i v; };
  struct W { __m512i v; __mmask64 neg; };  // k6: v = |q|, neg the lanes where q < 0
  static bool runs() { return cpu_has(kAvx512Vnni); }
  template <class Fn>
  __attribute__((target("avx512vnni"), flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() { return {_mm512_setzero_si512()}; }
  static W from_u6(const simd::Vi& u) {
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    const __m512i q = signed_u6(u);
    return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)};
  }
  static W load(const uint8_t* p, bool high) {
    static_assert(B != WBits::k6, "k6 weights come from from_u6");
    return {load_zmm<B>(p, high), 0};
  }
  __attribute__((target("avx512vnni"))) static Acc dot(Acc acc, const W& w, int32_t x4) {
    __m512i x = _mm512_set1_epi32(x4);
    if constexpr (B == WBits::k6) x = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);
    return {_mm512_dpbusd_epi32(acc.v, w.v, x)};
  }
  static simd::Vi sums(const Acc& acc) { return {acc.v}; }
};

using Int8Variants = VariantList<Avx512Vnni, Avx512Bw, Generic>;
#endif  // RADIXLM_SIMD_AVX512

#if defined(RADIXLM_SIMD_NEON)
// Four int8x16 (lanes 4i..4i+3 of the 16) as weight values: k8 the signed q = u - 128, k4 the
// nibbles (fit int8).
template <WBits B>
inline int8x16_t load_q(const uint8_t* p, bool high) {
  static_assert(B != WBits::k6, "k6 weights come from from_u6");
  const uint8x16_t raw = vld1q_u8(p);
  if constexpr (B == WBits::k8) return vreinterpretq_s8_u8(veorq_u8(raw, vdupq_n_u8(0x80)));
  return vreinterpretq_s8_u8(high ? vshrq_n_u8(raw, 4) : vandq_u8(raw, vdupq_n_u8(0x0F)));
}

// vec_neon.h: lanes 4q..4q+3 in quarter q
inline simd::Vi vi_from_quarters(const int32x4_t (&s)[4]) { return {{s[0], s[1], s[2], s[3]}}; }

// k6: the vector layer's u bytes as the signed q = u - 32, quarter i to v[i].
inline void q6_quarters(const simd::Vi& u, int8x16_t (&v)[4]) {
  for (int i = 0; i < 4; ++i) v[i] = vsubq_s8(vreinterpretq_s8_s32(u.v[i]), vdupq_n_s8(32));
}

// --- NEON without dotprod: vmull_s8 (exact int16 products) ---
// k4, k6: products summed in int16 per (lane, j) over the block (8 * 15 * 127) or span
// (4 * 32 * 127), pairwise-widened in sums(). k8: |q x| <= 16384, so each step's products go pairwise into int32 (vpadalq_s16) as
// (lane, j 0-1) and (lane, j 2-3) halves, added in sums().
template <WBits B>
struct Neon {
  static constexpr const char* kName = "neon";
  static constexpr int32_t kTaken = B == WBits::k8 ? 128 : 0;
  // per 16 bytes i: [2i] its low 8 bytes' sums (lanes 4i, 4i+1), [2i+1] its high 8 (4i+2, 4i+3)
  using Part = std::conditional_t<B == WBits::k8, int32x4_t, int16x8_t>;
  struct Acc { Part p[8]; };
  struct W { int8x16_t v[4]; };
  static bool runs() { return true; }
  template <class Fn>
  __attribute__((flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() {
    Acc a;
    for (int i = 0; i < 8; ++i) {
      if constexpr (B == WBits::k8) a.p[i] = vdupq_n_s32(0); else a.p[i] = vdupq_n_s16(0);
    }
    return a;
  }
  static W from_u6(const simd::Vi& u) {
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    W w;
    q6_quarters(u, w.v);
    return w;
  }
  static W load(const uint8_t* p, bool high) {
    W w;
    for (int i = 0; i < 4; ++i) w.v[i] = load_q<B>(p + 16 * i, high);
    return w;
  }
  static Acc dot(Acc acc, const W& w, int32_t x4) {
    const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
    for (int i = 0; i < 4; ++i) {
      if constexpr (B == WBits::k8) {
        acc.p[2 * i] = vpadalq_s16(acc.p[2 * i], vmull_s8(vget_low_s8(w.v[i]), vget_low_s8(x)));
        acc.p[2 * i + 1] = vpadalq_s16(acc.p[2 * i + 1], vmull_high_s8(w.v[i], x));
      } else {
        acc.p[2 * i] = vmlal_s8(acc.p[2 * i], vget_low_s8(w.v[i]), vget_low_s8(x));
        acc.p[2 * i + 1] = vmlal_high_s8(acc.p[2 * i + 1], w.v[i], x);
      }
    }
    return acc;
  }
  static simd::Vi sums(const Acc& acc) {
    int32x4_t s[4];
    for (int i = 0; i < 4; ++i) {
      if constexpr (B == WBits::k8) {
        s[i] = vpaddq_s32(acc.p[2 * i], acc.p[2 * i + 1]);
      } else {
        s[i] = vpaddq_s32(vpaddlq_s16(acc.p[2 * i]), vpaddlq_s16(acc.p[2 * i + 1]));
      }
    }
    return vi_from_quarters(s);
  }
};

// --- NEON dotprod: sdot (vdotq_s32) on signed values (cpu_has(kDotprod)) ---
template <WBits B>
struct NeonDotprod {
  static constexpr const char* kName = "neon_dotprod";
  static constexpr int32_t kTaken = B == WBits::k8 ? 128 : 0;
  struct Acc { int32x4_t v[4]; };
  struct W { int8x16_t v[4]; };
  static bool runs() { return cpu_has(kDotprod); }
  template <class Fn>
  __attribute__((target("arch=armv8.2-a+dotprod"), flatten)) static void run(const Fn& f) { f(); }
  static Acc zero() { return {{vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}}; }
  static W from_u6(const simd::Vi& u) {
    static_assert(B == WBits::k6, "from_u6 gives k6 weights");
    W w;
    q6_quarters(u, w.v);
    return w;
  }
  static W load(const uint8_t* p, bool high) {
    W w;
    for (int i = 0; i < 4; ++i) w.v[i] = load_q<B>(p + 16 * i, high);
    return w;
  }
  __attribute__((target("arch=armv8.2-a+dotprod"))) static Acc dot(Acc acc, const W& w, int32_t x4) {
    const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
    for (int i = 0; i < 4; ++i) acc.v[i] = vdotq_s32(acc.v[i], w.v[i], x);
    return acc;
  }
  static simd::Vi sums(const Acc& acc) { return vi_from_quarters(acc.v); }
};

using Int8Variants = VariantList<NeonDotprod, Neon, Generic>;
#endif  // RADIXLM_SIMD_NEON

#if defined(RADIXLM_SIMD_GENERIC)
using Int8Variants = VariantList<Generic>;
#endif

}  // namespace radixlm::dot8
