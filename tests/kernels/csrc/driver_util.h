// What the torch-free kernel drivers of this folder share: deterministic inputs (Rng), the count
// of checks and the closing line (check, finish), scalar bfloat16 / float16 conversions written
// from their definitions (not the kernels' own), and weights packed as the kernels read them
// (float32 panels, bfloat16 pair panels, quant groups) with their plain [K][N] values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/quant_gemm.h"
#include "simd/vec.h"  // RADIXLM_SIMD_NAME: the level the driver is built for

namespace driver {

// bfloat16: the high half of a float32, rounded to nearest even (NaN kept a quiet NaN).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

struct Rng {  // splitmix64: the same inputs on every run and machine
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t u32() { return static_cast<uint32_t>(next() >> 32); }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  float uniform() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1p-52 - 1.0); }  // [-1, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1p-53; }
  float bf16_exact(float scale) { return round_bf16(uniform() * scale); }  // in [-scale, scale], bfloat16-exact
};

// A value of T (float, or uint16_t holding a bfloat16) from a float, and back.
template <typename T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_bf16(x);
  }
}
template <typename T>
float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return from_bf16(x);
  }
}
template <typename T>
std::vector<T> from_floats(const std::vector<float>& src) {
  std::vector<T> out(src.size());
  for (size_t i = 0; i < src.size(); ++i) out[i] = from_float<T>(src[i]);
  return out;
}

inline long g_checks = 0, g_failures = 0;

// One check; the first 10 failures are printed.
inline void check(bool ok, const std::string& what) {
  ++g_checks;
  if (ok) return;
  if (++g_failures <= 10) std::printf("MISMATCH %s\n", what.c_str());
}

// The closing line, "<name> <level>: N checks passed<suffix>" and 0, or the failures' count and 1.
inline int finish(const char* name, const std::string& suffix = "") {
  if (g_failures > 0) {
    std::printf("%s %s: %ld of %ld checks FAILED\n", name, RADIXLM_SIMD_NAME, g_failures, g_checks);
    return 1;
  }
  std::printf("%s %s: %ld checks passed%s\n", name, RADIXLM_SIMD_NAME, g_checks, suffix.c_str());
  return 0;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  const uint32_t bits = sign | ((exp == 0x1F ? 0xFFu : exp + 112) << 23) | (man << 13);
  std::memcpy(&f, &bits, 4);
  return f;
}

// `call()` must throw std::runtime_error whose message contains `needle`.
template <typename F>
void refused(const std::string& what, const std::string& needle, F&& call) {
  try {
    call();
    check(false, what + ": accepted");
  } catch (const std::runtime_error& e) {
    check(std::string(e.what()).find(needle) != std::string::npos, what + ": refused as " + e.what());
  }
}

// float64 attention of one query row `qr` [D] over positions 0..pos of its request, whose keys and
// values are the rows `slots[j] * Hkv + kv_head` of k and v ([slots][Hkv][D]); the output into o [D]
// (zeroed by the caller).
inline void reference_attention_row(const float* qr, const float* k, const float* v, const int32_t* slots, int64_t pos,
                                    int64_t Hkv, int64_t kv_head, int64_t D, double scale, double* o) {
  std::vector<double> s(pos + 1);
  double mx = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j <= pos; ++j) {
    const float* kr = k + (static_cast<int64_t>(slots[j]) * Hkv + kv_head) * D;
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
    s[j] = dot * scale;
    mx = std::max(mx, s[j]);
  }
  for (int64_t j = 0; j <= pos; ++j) {
    const double w = std::exp(s[j] - mx);
    sum += w;
    const float* vr = v + (static_cast<int64_t>(slots[j]) * Hkv + kv_head) * D;
    for (int64_t d = 0; d < D; ++d) o[d] += w * vr[d];
  }
  for (int64_t d = 0; d < D; ++d) o[d] /= sum;
}

inline int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// W [K][N] as float32 panels [Np/64][K][64] (packed_gemm.h), zero columns past N.
inline std::vector<float> pack_panels(const std::vector<float>& W, int64_t K, int64_t N) {
  const int64_t Np = round_up(N, 64);
  std::vector<float> p(Np * K, 0.0f);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) p[((n / 64) * K + k) * 64 + n % 64] = W[k * N + n];
  }
  return p;
}

// W [K][N] as bfloat16 pair panels [Np/32][Kp/2][32][2] (bf16_gemm.h: Np a multiple of 64, Kp of
// 32, zeros past N and K), each value rounded to bfloat16.
inline std::vector<uint16_t> pack_pairs(const std::vector<float>& W, int64_t K, int64_t N) {
  const int64_t Np = round_up(N, 64), Kp = round_up(K, 32);
  std::vector<uint16_t> p(Np * Kp, 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) p[(((n / 32) * (Kp / 2) + k / 2) * 32 + n % 32) * 2 + k % 2] = to_bf16(W[k * N + n]);
  }
  return p;
}

struct QuantFormat {
  radixlm::QFormat f;
  const char* name;
  int64_t block_bytes, value_bytes, offset;
};
inline const QuantFormat kQuantFormats[] = {{radixlm::QFormat::kQ8_0, "q8_0", 544, 512, 128},
                                            {radixlm::QFormat::kQ4_0, "q4_0", 288, 256, 8},
                                            {radixlm::QFormat::kQ4_1, "q4_1", 320, 256, 0}};

// Quant groups [groups][nb][block bytes] (quant_gemm.h): value bytes from `byte()`, scales d in
// [0.001, 0.009] (and m in +-0.01), signs mixed; columns from `live` on (padding) get d = m = 0.
template <typename ByteFn>
std::vector<uint8_t> make_quant(const QuantFormat& fmt, int64_t groups, int64_t nb, Rng& rng, ByteFn byte,
                                int64_t live = -1) {
  std::vector<uint8_t> w(groups * nb * fmt.block_bytes);
  for (int64_t blk = 0; blk < groups * nb; ++blk) {
    uint8_t* p = w.data() + blk * fmt.block_bytes;
    for (int64_t i = 0; i < fmt.value_bytes; ++i) p[i] = byte();
    for (int64_t i = fmt.value_bytes; i < fmt.block_bytes; i += 2) {
      uint16_t h = static_cast<uint16_t>(0x1418 + rng.next() % 0x0C00) | static_cast<uint16_t>((rng.next() & 1) << 15);
      const int64_t column = (blk / nb) * 16 + ((i - fmt.value_bytes) / 2) % 16;
      if (live >= 0 && column >= live) h = 0;
      std::memcpy(p + i, &h, 2);
    }
  }
  return w;
}

// W [N][K] decoded from quant groups, as GGUF's dequantizer: d * (u - offset) (+ m).
inline std::vector<float> decode_quant(const QuantFormat& fmt, const std::vector<uint8_t>& w, int64_t groups, int64_t nb) {
  const int64_t N = groups * 16, K = nb * 32;
  std::vector<float> W(N * K);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = n % 16;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t* blk = w.data() + ((n / 16) * nb + k / 32) * fmt.block_bytes;
      const int64_t t = (k % 32) / 4, j = k % 4;
      int32_t u;
      if (fmt.f == radixlm::QFormat::kQ8_0) {
        u = blk[t * 64 + 4 * c + j];
      } else {
        const uint8_t b = blk[(t / 2) * 64 + 4 * c + j];
        u = t % 2 ? b >> 4 : b & 0x0F;
      }
      uint16_t dh, mh;
      std::memcpy(&dh, blk + fmt.value_bytes + 2 * c, 2);
      std::memcpy(&mh, blk + fmt.value_bytes + 32 + 2 * c, 2);
      float v = half_to_float(dh) * static_cast<float>(u - fmt.offset);
      if (fmt.f == radixlm::QFormat::kQ4_1) v = v + half_to_float(mh);
      W[n * K + k] = v;
    }
  }
  return W;
}

}  // namespace driver
