// Math over the vector layer (vec.h) shared by the kernels: a vector e^x, software read-ahead of
// weight streams, and float32 <-> bfloat16 conversions (bf16 widened exactly; narrowed with
// round-to-nearest-even, as torch does).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simd/vec.h"

namespace radixlm {

using simd::Mask;
using simd::Vf;
using simd::Vi;

// e^x for 16 floats: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to `Degree`, times
// 2^n. Degree 7: truncation error below 6e-9 relative (under float32 rounding); degree 5: ~3e-6,
// for softmax weights rounded to bfloat16 (8 bits) before they are used.
template <int Degree>
inline Vf exp16_series(Vf x) {
  using namespace simd;
  constexpr float kFactorial[] = {1, 1, 2, 6, 24, 120, 720, 5040};
  static_assert(Degree >= 1 && Degree <= 7);
  x = vmin(vmax(x, vset1(-103.0f)), vset1(88.7f));
  const Vf n = vround(vmul(x, vset1(1.44269504088896341f)));
  Vf r = vfnmadd(n, vset1(0.693145751953125f), x);  // ln2, high bits
  r = vfnmadd(n, vset1(1.428606765330187e-06f), r);  // ln2, the rest
  Vf p = vset1(1.0f / kFactorial[Degree]);
  for (int k = Degree - 1; k >= 0; --k) p = vfmadd(p, r, vset1(1.0f / kFactorial[k]));
  return vscale2(p, n);
}

inline Vf exp16(Vf x) { return exp16_series<7>(x); }
inline Vf exp16_coarse(Vf x) { return exp16_series<5>(x); }

// Weight streams are read ahead in software: the hardware prefetcher alone keeps too few lines
// in flight for one core to reach the memory's speed (a bf16 decode step's weights: ~25 GB/s on 2
// cores without, ~31 with this distance). Past the end of a stream the hint reads the next panel,
// which the same thread usually reads next; a hint never faults.
constexpr int64_t kPrefetchBytes = 4096;

// Hint the line kPrefetchBytes past p (and, for Lines > 1, the lines after it) into L1.
template <int Lines = 1>
inline void prefetch_ahead(const void* p) {
  for (int i = 0; i < Lines; ++i) simd::prefetch_l1(static_cast<const char*>(p) + kPrefetchBytes + 64 * i);
}

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, as torch's float -> bfloat16 conversion does.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return 0x7FC0;
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
inline void to_float(const T* src, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) simd::vstore(dst + i, simd::vload_bf16(reinterpret_cast<const uint16_t*>(src + i)));
    for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
}

template <typename T>
inline void from_float(const float* src, int64_t n, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) simd::vstore_bf16(reinterpret_cast<uint16_t*>(dst + i), simd::vload(src + i));
    for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
  }
}

using simd::transpose16;

}  // namespace radixlm
