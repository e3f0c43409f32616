// The K-quants' scale words (kquant_gemm.h's header layout) and Q6_K's 6-bit values unpacked in
// registers: shared by the weight-only kernels (kquant_gemm.cpp) and the Q4_K / Q6_K int8 ones
// (quant_gemm.cpp, kquant_gemm.cpp's one-row Q4_K). Internal.
#pragma once

#include <cstdint>
#include <utility>

#include "simd/vec.h"

namespace radixlm::kscales {

using namespace simd;

inline Vi word(const uint8_t* super, int w) { return vload_i(super + 64 * w); }
inline Vi bits(Vi v, int32_t mask) { return vand_i(v, vset1_i(mask)); }

// Q4_K / Q5_K: sub-block S's 6-bit scale and min of each lane (GGUF's 12-byte packing: bytes
// 0-3 hold sc[0..3] and the top bits of sc[4..7], bytes 4-7 the same for the mins, bytes 8-11
// the low nibbles of sc[4..7] and m[4..7]).
template <int S>
inline void scale_min(const uint8_t* super, Vi& sc, Vi& m) {
  const Vi w0 = word(super, 0), w1 = word(super, 1);
  if constexpr (S < 4) {
    sc = bits(vshr_i<8 * S>(w0), 0x3F);
    m = bits(vshr_i<8 * S>(w1), 0x3F);
  } else {
    constexpr int I = S - 4;
    const Vi w2 = word(super, 2);
    sc = vor_i(bits(vshr_i<8 * I>(w2), 0x0F), vshl_i<4>(bits(vshr_i<8 * I + 6>(w0), 0x03)));
    m = vor_i(bits(vshr_i<8 * I + 4>(w2), 0x0F), vshl_i<4>(bits(vshr_i<8 * I + 6>(w1), 0x03)));
  }
}

// Q4_K's step d * sc and shift -dmin * m of sub-block S of a group's super-block (w = step * u + shift).
template <int S>
inline void q4k_step_shift(const uint8_t* super, Vf& step, Vf& shift) {
  Vi sc, m;
  scale_min<S>(super, sc, m);
  step = vmul(vload_f16(reinterpret_cast<const uint16_t*>(super + 192)), vcvt_f(sc));
  shift = vsub(vzero(), vmul(vload_f16(reinterpret_cast<const uint16_t*>(super + 224)), vcvt_f(m)));
}

// The steps and shifts of Q4_K sub-blocks S... of a group's super-block.
template <int... S>
inline void q4k_steps_shifts(const uint8_t* super, Vf (&step)[8], Vf (&shift)[8], std::integer_sequence<int, S...>) {
  (q4k_step_shift<S>(super, step[S], shift[S]), ...);
}

// By N bits, right for a negative N.
template <int N>
inline Vi shift_left(Vi v) {
  if constexpr (N > 0) return vshl_i<N>(v);
  if constexpr (N < 0) return vshr_i<-N>(v);
  return v;
}

// Q6_K: the int8 scale I (of 16) of each lane, sign-extended.
template <int I>
inline Vi scale6(const uint8_t* super) { return vsra_i<24>(vshl_i<24 - 8 * (I % 4)>(word(super, I / 4))); }

// Q6_K's step d * sc of scale span I (16 k) of a group's super-block (w = step * (u - 32)).
template <int I>
inline Vf q6k_step(const uint8_t* super) {
  return vmul(vload_f16(reinterpret_cast<const uint16_t*>(super + 256)), vcvt_f(scale6<I>(super)));
}

// Quad T of a Q6_K sub-block's 16 columns (sub: its 384 bytes): byte j of lane c = column c's
// 6-bit u at k = 4T + j, the low nibble from the 256 value bytes and bits 2i, 2i + 1 (i = T % 4)
// of the 128 high-bit bytes as bits 4-5.
template <int T>
inline Vi q6k_quad(const uint8_t* sub) {
  const Vi raw = vload_i(sub + (T / 2) * 64);
  const Vi low = bits(T % 2 ? vshr_i<4>(raw) : raw, 0x0F0F0F0F);
  return vor_i(low, bits(shift_left<4 - 2 * (T % 4)>(vload_i(sub + 256 + (T / 4) * 64)), 0x30303030));
}

}  // namespace radixlm::kscales
