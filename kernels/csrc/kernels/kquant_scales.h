// The K-quants' scale words (kquant_gemm.h's header layout) unpacked in registers: shared by the
// weight-only kernels (kquant_gemm.cpp) and Q4_K's int8 one (quant_gemm.cpp). Internal.
#pragma once

#include <cstdint>

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

}  // namespace radixlm::kscales
