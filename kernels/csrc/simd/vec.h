// The vector layer every kernel is written over: 16 lanes at every ISA level, so a kernel body
// (its tiles, panels and loops) is the same text on each, and only this layer differs.
//
//   Vf    16 float32 lanes      Vi    16 int32 lanes (also the raw bits of a Vf)
//   Mask  one bit per lane (bit i: lane i), as AVX-512's __mmask16
//
// The level is chosen at compile time, once per build of the extension (kernels/cpu_linear.py
// builds one module per level and loads the one the CPU runs):
//   RADIXLM_ISA_GENERIC defined        plain C++ arrays the compiler vectorizes (vec_generic.h)
//   __AVX512F__ && __AVX512BW__        one __m512 per vector (vec_avx512.h)
//   __AVX2__ && __FMA__ && __F16C__    two __m256 per vector (vec_avx2.h)
//   __ARM_NEON (aarch64)               four float32x4_t per vector (vec_neon.h)
// Every backend gives the same results bit for bit as vec_generic.h, except: the order of
// vreduce_add's sum (the last bits may differ), and vfmadd / vfnmadd / vfmsub, which round once
// on every level but generic (where the compiler decides; x86-64's baseline has no FMA).
//
// Kernels may also use instructions of a feature the CPU reports at run time beyond the level
// (AVX512-BF16, AVX512-VNNI, AMX, AVX-VNNI, ARM dotprod / i8mm): inside functions compiled with
// that target and chosen through dispatch/cpu_features.h, with a vector-layer twin beside them.
#pragma once

#include <cstdint>

#if defined(RADIXLM_ISA_GENERIC)
#define RADIXLM_SIMD_GENERIC 1
#define RADIXLM_SIMD_NAME "generic"
#elif defined(__AVX512F__) && defined(__AVX512BW__)
#define RADIXLM_SIMD_AVX512 1
#define RADIXLM_SIMD_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RADIXLM_SIMD_AVX2 1
#define RADIXLM_SIMD_NAME "avx2"
#elif defined(__ARM_NEON) && defined(__aarch64__)
#define RADIXLM_SIMD_NEON 1
#define RADIXLM_SIMD_NAME "neon"
#else
#define RADIXLM_SIMD_GENERIC 1
#define RADIXLM_SIMD_NAME "generic"
#endif

#if defined(__x86_64__) || defined(__i386__)
#define RADIXLM_X86 1
#include <immintrin.h>
#endif

namespace radixlm::simd {

constexpr int kLanes = 16;
using Mask = uint16_t;

// The lanes [0, n) (n clamped to [0, 16]).
inline Mask vtail(int64_t n) { return n >= kLanes ? Mask(0xFFFF) : n <= 0 ? Mask(0) : Mask((1u << n) - 1u); }

// A hint that the cache line at p will be read soon (into L1); never faults.
inline void prefetch_l1(const void* p) {
#if defined(RADIXLM_X86)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

}  // namespace radixlm::simd

#if defined(RADIXLM_SIMD_AVX512)
#include "simd/vec_avx512.h"
#elif defined(RADIXLM_SIMD_AVX2)
#include "simd/vec_avx2.h"
#elif defined(RADIXLM_SIMD_NEON)
#include "simd/vec_neon.h"
#else
#include "simd/vec_generic.h"
#endif
