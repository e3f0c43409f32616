// Small AVX-512 helpers shared by the kernels: a vector e^x, and float32 <-> bfloat16
// conversions (bf16 widened exactly; narrowed with round-to-nearest-even, as torch does).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace radixlm {

// e^x for 16 floats: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to `Degree`, times
// 2^n. Degree 7: truncation error below 6e-9 relative (under float32 rounding); degree 5: ~3e-6,
// for softmax weights rounded to bfloat16 (8 bits) before they are used.
template <int Degree>
inline __m512 exp16_series(__m512 x) {
  constexpr float kFactorial[] = {1, 1, 2, 6, 24, 120, 720, 5040};
  static_assert(Degree >= 1 && Degree <= 7);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.0f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2, high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);     // ln2, the rest
  __m512 p = _mm512_set1_ps(1.0f / kFactorial[Degree]);
  for (int k = Degree - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / kFactorial[k]));
  return _mm512_scalef_ps(p, n);
}

inline __m512 exp16(__m512 x) { return exp16_series<7>(x); }
inline __m512 exp16_coarse(__m512 x) { return exp16_series<5>(x); }

// Weight streams are read ahead in software: the hardware prefetcher alone keeps too few lines
// in flight for one core to reach the memory's speed (a bf16 decode step's weights: ~25 GB/s on 2
// cores without, ~31 with this distance). Past the end of a stream the hint reads the next panel,
// which the same thread usually reads next; a hint never faults.
constexpr int64_t kPrefetchBytes = 4096;

// Hint the line kPrefetchBytes past p (and, for Lines > 1, the lines after it) into L1.
template <int Lines = 1>
inline void prefetch_ahead(const void* p) {
  for (int i = 0; i < Lines; ++i) _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes + 64 * i, _MM_HINT_T0);
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
    for (; i + 16 <= n; i += 16) {
      __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16)));
    }
    for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
}

template <typename T>
inline void from_float(const float* src, int64_t n, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
  }
}

// In place: r[j][d] -> r[d][j] for a 16 x 16 float tile held in 16 vectors.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane L: [r2i[4L], r2i+1[4L], r2i[4L+1], r2i+1[4L+1]] / +2, +3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + k] lane L: column 4L + k of rows 4i..4i+3
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {  // a 4 x 4 transpose of 128-bit lanes, for each k
    const __m512 p = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44), q = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44);
    const __m512 u = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xEE), w = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xEE);
    t[k] = _mm512_shuffle_f32x4(p, q, 0x88);
    t[4 + k] = _mm512_shuffle_f32x4(p, q, 0xDD);
    t[8 + k] = _mm512_shuffle_f32x4(u, w, 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(u, w, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

}  // namespace radixlm
