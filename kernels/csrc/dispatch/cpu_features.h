// What this CPU (and its OS) can execute, detected in one place: cpuid + XCR0 on x86 (with the
// Linux permission request AMX needs), HWCAP on aarch64. The probe (cpu_probe.cpp, built for the
// baseline ISA and read by kernels/isa.py) reports these bits; Python caps them at the ISA level
// it chose (RADIXLM_CPU_ISA) and hands the result to the extension built for that level
// (set_cpu_features), whose kernels read it through cpu(). A program without Python (the aarch64
// test driver under qemu) gets the detected bits.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace radixlm {

// One bit each; names (kCpuFeatureNames) in the same order. Never renumber: Python reads them by name.
enum CpuFeature : int {
  kAvx2, kFma, kF16c, kAvx512f, kAvx512bw, kAvx512vl, kAvx512dq, kAvx512Bf16, kAvx512Vnni, kAvxVnni,
  kAmxTile, kAmxBf16, kAmxInt8, kNeon, kDotprod, kI8mm, kSve, kArmBf16, kNumCpuFeatures,
};
inline constexpr const char* kCpuFeatureNames[kNumCpuFeatures] = {
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8", "neon", "dotprod", "i8mm", "sve", "arm_bf16",
};

inline uint64_t bit(CpuFeature f) { return uint64_t{1} << f; }

// The features this process can execute now (AMX: once Linux granted its tile state).
inline uint64_t detect_cpu_features() {
  uint64_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xE0) == 0xE0, tiles = (xcr0 & 0x60000) == 0x60000;
  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7) && __get_cpuid_count(7, 1, &a71, &b, &c, &d)) {
    if (ymm && avx) {
      if (b7 & (1u << 5)) f |= bit(kAvx2);
      if (fma) f |= bit(kFma);
      if (f16c) f |= bit(kF16c);
      if (a71 & (1u << 4)) f |= bit(kAvxVnni);
    }
    if (zmm && (b7 & (1u << 16))) {
      f |= bit(kAvx512f);
      if (b7 & (1u << 30)) f |= bit(kAvx512bw);
      if (b7 & (1u << 31)) f |= bit(kAvx512vl);
      if (b7 & (1u << 17)) f |= bit(kAvx512dq);
      if (c7 & (1u << 11)) f |= bit(kAvx512Vnni);
      if (a71 & (1u << 5)) f |= bit(kAvx512Bf16);
    }
#if defined(__linux__) && defined(__x86_64__)
    // AMX tile data is off for a process until it asks (ARCH_REQ_XCOMP_PERM, XTILEDATA)
    if (tiles && (d7 & (1u << 24)) && syscall(SYS_arch_prctl, 0x1023, 18) == 0) {
      f |= bit(kAmxTile);
      if (d7 & (1u << 22)) f |= bit(kAmxBf16);
      if (d7 & (1u << 25)) f |= bit(kAmxInt8);
    }
#endif
  }
#elif defined(__aarch64__) && defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  if (hw & (1ul << 1)) f |= bit(kNeon);       // HWCAP_ASIMD
  if (hw & (1ul << 20)) f |= bit(kDotprod);   // HWCAP_ASIMDDP
  if (hw & (1ul << 22)) f |= bit(kSve);       // HWCAP_SVE
  if (hw2 & (1ul << 13)) f |= bit(kI8mm);     // HWCAP2_I8MM
  if (hw2 & (1ul << 14)) f |= bit(kArmBf16);  // HWCAP2_BF16
#elif defined(__aarch64__)
  f |= bit(kNeon);
#endif
  return f;
}

// The features the kernels may use: set once by the loader (capped at the chosen level), else
// what the CPU has.
inline uint64_t& cpu_feature_bits() {
  static uint64_t bits = detect_cpu_features();
  return bits;
}
inline void set_cpu_features(uint64_t bits) { cpu_feature_bits() = bits; }
inline bool cpu_has(CpuFeature f) { return (cpu_feature_bits() & bit(f)) != 0; }

}  // namespace radixlm
