// q_gemm / q_columns (kernels/quant_gemm.h) at the level this file is compiled for, without torch
// (-DRADIXLM_NO_TORCH -fopenmp), on every int8 dot variant the level runs on this CPU:
//   - q_columns against a scalar decode of the packed bytes, bit for bit;
//   - the weight-only mode against a float64 product of those dequantized weights (within 1e-5
//     of each output's sum of |terms|);
//   - the int8 modes against a float64 product of the activations rounded as the kernel rounds
//     them (within 2e-6), and every variant's output the same bits as the first's, also on
//     weights at the ends of their ranges (Q8_0 bytes 0 and 255 against x at +-127, Q4 nibbles
//     15), where a saturating int16 pair sum would show;
//   - the same bits on 1, 2 and 3 threads.
// Formats Q8_0 / Q4_0 / Q4_1, K 32..576, 2..12 groups, 1..33 rows, residual and bias; and the
// K-quants Q4_K / Q5_K / Q6_K (random bytes of their packed layout, decoded here from the layout's
// definition: q_columns bit for bit, the products within 1e-5; Q4_K's and Q6_K's int8 modes as the
// others', also Q6_K's values at both ends; Q5_K's int8 output the same bits as its weight-only
// mode's), K 256 and 768. Built and run
// by tests/kernels/test_quant_gemm.py for the aarch64 levels under qemu (the x86 levels run the
// torch module there):
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_quant_gemm.cpp kernels/csrc/kernels/quant_gemm.cpp
//       kernels/csrc/kernels/kquant_gemm.cpp -o t && ./t
// Exit 0 with "quant_gemm <level>: N checks passed (variants ...)"; else the first mismatches and
// exit 1.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "driver_util.h"
#include "kernels/quant_gemm.h"

namespace {

using driver::check;
using driver::QuantFormat;
using driver::Rng;
using radixlm::QFormat;
using radixlm::QMode;

// x rounded as the int8 modes round it (per 32-block or per row scale max|x| / 127), as float64.
std::vector<double> rounded(const std::vector<float>& x, int64_t M, int64_t K, QMode mode) {
  std::vector<double> xr(M * K);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x.data() + m * K;
    float row_max = 0.0f;
    for (int64_t k = 0; k < K; ++k) row_max = std::max(row_max, std::fabs(row[k]));
    for (int64_t b = 0; b < K / 32; ++b) {
      float d = row_max / 127.0f;
      if (mode == QMode::kInt8Block) {
        float block_max = 0.0f;
        for (int k = 0; k < 32; ++k) block_max = std::max(block_max, std::fabs(row[b * 32 + k]));
        d = block_max / 127.0f;
      }
      const float inv = d > 0.0f ? 1.0f / d : 0.0f;
      for (int k = 0; k < 32; ++k) xr[m * K + b * 32 + k] = static_cast<double>(std::nearbyint(row[b * 32 + k] * inv)) * d;
    }
  }
  return xr;
}

std::vector<float> run(const QuantFormat& fmt, const std::vector<float>& x, int64_t M, int64_t K, const std::vector<uint8_t>& w,
                       int64_t groups, QMode mode, const std::vector<float>& res, const std::vector<float>& bias) {
  const int64_t N = groups * 16;
  std::vector<float> out(M * N);
  radixlm::q_gemm(x.data(), M, K, w.data(), groups, fmt.f, mode, out.data(), N, res.empty() ? nullptr : res.data(), N,
                  bias.empty() ? nullptr : bias.data());
  return out;
}

// One product on every variant (int8 modes) or once (float): against the float64 reference, the
// variants' bits equal, and the bits equal on 1, 2 and 3 threads.
void check_product(const QuantFormat& fmt, const std::vector<float>& x, int64_t M, int64_t K, const std::vector<uint8_t>& w,
                   const std::vector<float>& W, int64_t groups, QMode mode, const std::vector<float>& res,
                   const std::vector<float>& bias, const std::string& what) {
  const int64_t N = groups * 16;
  const std::vector<double> xr =
      mode == QMode::kFloat ? std::vector<double>(x.begin(), x.end()) : rounded(x, M, K, mode);
  const double bound = mode == QMode::kFloat ? 1e-5 : 2e-6;
  std::vector<float> first;
  std::string first_name;
  const std::vector<std::string> variants =
      mode == QMode::kFloat ? std::vector<std::string>{""} : radixlm::int8_variants();
  for (const std::string& v : variants) {
    radixlm::set_int8_variant(v);
    const std::vector<float> out = run(fmt, x, M, K, w, groups, mode, res, bias);
    if (first.empty()) {
      first = out;
      first_name = v;
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0.0, mag = 0.0;
          if (!res.empty()) sum += res[m * N + n], mag += std::fabs(res[m * N + n]);
          if (!bias.empty()) sum += bias[n], mag += std::fabs(bias[n]);
          for (int64_t k = 0; k < K; ++k) {
            const double t = xr[m * K + k] * W[n * K + k];
            sum += t;
            mag += std::fabs(t);
          }
          const double err = std::fabs(sum - out[m * N + n]);
          char buf[160];
          std::snprintf(buf, sizeof buf, " row %ld col %ld: %.9g vs %.9g", static_cast<long>(m), static_cast<long>(n),
                        out[m * N + n], sum);
          check(err <= bound * mag + 1e-30, what + " " + v + buf);
        }
      }
    } else {
      check(std::memcmp(first.data(), out.data(), sizeof(float) * out.size()) == 0,
            what + ": variant " + v + " differs from " + first_name);
    }
  }
  radixlm::set_int8_variant("");
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const std::vector<float> out = run(fmt, x, M, K, w, groups, mode, res, bias);
    check(std::memcmp(first.data(), out.data(), sizeof(float) * out.size()) == 0,
          what + ": differs on " + std::to_string(threads) + " threads");
  }
  omp_set_num_threads(2);
}

const char* mode_name(QMode mode) { return mode == QMode::kFloat ? "float" : mode == QMode::kInt8Block ? "int8" : "int8_row"; }

void random_products(Rng& rng) {
  for (const QuantFormat& fmt : driver::kQuantFormats) {
    for (int64_t K : {32, 96, 576}) {
      for (int64_t groups : {2, 4, 12}) {
        const int64_t nb = K / 32, N = groups * 16;
        const std::vector<uint8_t> w = driver::make_quant(fmt, groups, nb, rng, [&] { return static_cast<uint8_t>(rng.next()); });
        const std::vector<float> W = driver::decode_quant(fmt, w, groups, nb);
        // q_columns: every column, bit for bit, in a shuffled order with repeats
        std::vector<int64_t> cols;
        for (int64_t n = 0; n < N; ++n) cols.push_back((n * 7 + 3) % N);
        cols.push_back(0);
        std::vector<float> got(cols.size() * K);
        radixlm::q_columns(w.data(), groups, nb, fmt.f, cols.data(), static_cast<int64_t>(cols.size()), got.data());
        for (size_t t = 0; t < cols.size(); ++t) {
          check(std::memcmp(got.data() + t * K, W.data() + cols[t] * K, sizeof(float) * K) == 0,
                std::string("q_columns ") + fmt.name + " column " + std::to_string(cols[t]));
        }
        for (int64_t M : {1, 3, 7, 16, 33}) {
          std::vector<float> x(M * K), res(M * N), bias(N);
          for (float& v : x) v = rng.uniform() * 2.0f;
          for (float& v : res) v = rng.uniform();
          for (float& v : bias) v = rng.uniform();
          if (M > 1) std::fill(x.begin() + K, x.begin() + K + 32, 0.0f);  // an all-zero block: scale 0
          for (QMode mode : {QMode::kFloat, QMode::kInt8Block, QMode::kInt8Row}) {
            const std::string what = std::string(fmt.name) + " " + mode_name(mode) + " K " + std::to_string(K) +
                                     " N " + std::to_string(N) + " M " + std::to_string(M);
            const bool extras = M % 2 == 1;  // residual and bias on odd row counts
            check_product(fmt, x, M, K, w, W, groups, mode, extras ? res : std::vector<float>{},
                          extras ? bias : std::vector<float>{}, what);
          }
        }
      }
    }
  }
}

// Values at the ends of their ranges against activations at +-127 (each block at its max |x|).
void extreme_products(Rng& rng) {
  const int64_t K = 96, groups = 4, nb = K / 32, M = 5;
  std::vector<float> x(M * K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      const float sign = m == 0 ? 1.0f : m == 1 ? -1.0f : (rng.next() & 1 ? 1.0f : -1.0f);
      x[m * K + k] = sign * (0.5f + 0.25f * static_cast<float>(m));
    }
  }
  for (const QuantFormat& fmt : driver::kQuantFormats) {
    const uint8_t ends[] = {0, 1, 255};
    for (uint8_t fill : {uint8_t{0}, uint8_t{255}}) {
      const std::vector<uint8_t> w = driver::make_quant(fmt, groups, nb, rng, [&]() -> uint8_t {
        if (fmt.f != QFormat::kQ8_0) return 0xFF;  // nibbles 15
        return rng.next() % 4 ? fill : ends[rng.next() % 3];
      });
      const std::vector<float> W = driver::decode_quant(fmt, w, groups, nb);
      for (QMode mode : {QMode::kInt8Block, QMode::kInt8Row}) {
        check_product(fmt, x, M, K, w, W, groups, mode, {}, {},
                      std::string("extreme ") + fmt.name + " fill " + std::to_string(fill) + " " + mode_name(mode));
      }
    }
  }
}

// --- the K-quants (kernels/kquant_gemm.h): random bytes in the packed layout, decoded here ---

const QuantFormat kKQuantFormats[] = {{QFormat::kQ4_K, "q4_k", 2304, 0, 0},
                                      {QFormat::kQ5_K, "q5_k", 2816, 0, 0},
                                      {QFormat::kQ6_K, "q6_k", 3360, 0, 0}};

float half_to_float(const uint8_t* p) {
  const uint32_t h = p[0] | (p[1] << 8), sign = (h >> 15) << 31, exp = (h >> 10) & 31, mant = h & 0x3FF;
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -24) : std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

// W [N, K] of K-quant groups w [groups][supers][bytes], from the layout's definition (kquant_gemm.h).
std::vector<float> decode_kquant(const QuantFormat& fmt, const std::vector<uint8_t>& w, int64_t groups, int64_t supers) {
  const bool q6 = fmt.f == QFormat::kQ6_K;
  const int64_t K = supers * 256, header = q6 ? 288 : 256, sub_bytes = fmt.f == QFormat::kQ4_K ? 256 : fmt.f == QFormat::kQ5_K ? 320 : 384;
  const int words = q6 ? 4 : 3;
  std::vector<float> W(groups * 16 * K);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* sb = w.data() + (g * supers + s) * fmt.block_bytes;
      for (int c = 0; c < 16; ++c) {
        uint8_t scale[16];
        for (int i = 0; i < 4 * words; ++i) scale[i] = sb[64 * (i / 4) + 4 * c + i % 4];
        const float d = half_to_float(sb + 64 * words + 2 * c), dmin = q6 ? 0.0f : half_to_float(sb + 64 * words + 32 + 2 * c);
        for (int k = 0; k < 256; ++k) {
          const int sub = k / 32, t = (k % 32) / 4, j = k % 4;
          const uint8_t* v = sb + header + sub * sub_bytes;
          int u = (v[64 * (t / 2) + 4 * c + j] >> (4 * (t % 2))) & 15;
          float value;
          if (q6) {
            u |= ((v[256 + 64 * (t / 4) + 4 * c + j] >> (2 * (t % 4))) & 3) << 4;
            value = (d * static_cast<float>(static_cast<int8_t>(scale[k / 16]))) * static_cast<float>(u - 32);
          } else {
            if (fmt.f == QFormat::kQ5_K) u |= ((v[256 + 4 * c + j] >> t) & 1) << 4;
            const int sc = sub < 4 ? scale[sub] & 63 : (scale[sub + 4] & 15) | ((scale[sub - 4] >> 6) << 4);
            const int m = sub < 4 ? scale[sub + 4] & 63 : (scale[sub + 4] >> 4) | ((scale[sub] >> 6) << 4);
            value = (d * static_cast<float>(sc)) * static_cast<float>(u) - dmin * static_cast<float>(m);
          }
          W[(g * 16 + c) * K + s * 256 + k] = value;
        }
      }
    }
  }
  return W;
}

void kquant_products(Rng& rng) {
  for (const QuantFormat& fmt : kKQuantFormats) {
    for (int64_t supers : {1, 3}) {
      for (int64_t groups : {2, 6}) {
        const int64_t K = supers * 256, N = groups * 16, halves = fmt.f == QFormat::kQ6_K ? 1 : 2;
        std::vector<uint8_t> w(groups * supers * fmt.block_bytes);
        for (uint8_t& b : w) b = static_cast<uint8_t>(rng.next());
        for (int64_t blk = 0; blk < groups * supers; ++blk) {  // finite float16 scales: |d| < 2
          uint8_t* f16 = w.data() + blk * fmt.block_bytes + (fmt.f == QFormat::kQ6_K ? 256 : 192);
          for (int i = 0; i < 16 * halves; ++i) f16[2 * i + 1] &= 0x3B;
        }
        const std::vector<float> W = decode_kquant(fmt, w, groups, supers);
        std::vector<int64_t> cols;
        for (int64_t n = 0; n < N; ++n) cols.push_back((n * 5 + 1) % N);
        std::vector<float> got(cols.size() * K);
        radixlm::q_columns(w.data(), groups, supers, fmt.f, cols.data(), static_cast<int64_t>(cols.size()), got.data());
        for (size_t t = 0; t < cols.size(); ++t) {
          check(std::memcmp(got.data() + t * K, W.data() + cols[t] * K, sizeof(float) * K) == 0,
                std::string("q_columns ") + fmt.name + " column " + std::to_string(cols[t]));
        }
        for (int64_t M : {1, 7, 13}) {
          std::vector<float> x(M * K), res(M * N), bias(N);
          for (float& v : x) v = rng.uniform() * 2.0f;
          for (float& v : res) v = rng.uniform();
          for (float& v : bias) v = rng.uniform();
          const std::string what = std::string(fmt.name) + " K " + std::to_string(K) + " N " + std::to_string(N) +
                                   " M " + std::to_string(M);
          const bool extras = M % 2 == 1;
          const std::vector<float> r = extras ? res : std::vector<float>{}, b = extras ? bias : std::vector<float>{};
          check_product(fmt, x, M, K, w, W, groups, QMode::kFloat, r, b, what);
          if (fmt.f != QFormat::kQ5_K) {  // int8 x int8 on every variant
            for (QMode mode : {QMode::kInt8Block, QMode::kInt8Row}) {
              check_product(fmt, x, M, K, w, W, groups, mode, r, b, what + " " + mode_name(mode));
            }
          } else {  // the int8 modes run the weight-only kernel: the same bits
            const std::vector<float> plain = run(fmt, x, M, K, w, groups, QMode::kFloat, r, b);
            const std::vector<float> out = run(fmt, x, M, K, w, groups, QMode::kInt8Block, r, b);
            check(std::memcmp(plain.data(), out.data(), sizeof(float) * out.size()) == 0,
                  what + " int8 differs from the weight-only product");
          }
        }
      }
    }
  }
}

// Q6_K at the ends of its range: every value u = 0 (q = -32) or 63 (q = 31) against x at +-127
// (rows of +-1: each 32-block's scale 1/127), where a 16-k span's int16 sums reach 4 * 2 * 32 *
// 127 = 32512 (a saturating or overflowing pair sum would show).
void q6k_extremes() {
  const QuantFormat& fmt = kKQuantFormats[2];
  const int64_t groups = 2, supers = 2, K = supers * 256, M = 3;
  for (const uint8_t fill : {uint8_t{0x00}, uint8_t{0xFF}}) {
    std::vector<uint8_t> w(groups * supers * fmt.block_bytes);
    for (int64_t blk = 0; blk < groups * supers; ++blk) {
      uint8_t* sb = w.data() + blk * fmt.block_bytes;
      for (int i = 0; i < 256; ++i) sb[i] = static_cast<uint8_t>(i % 3 == 0 ? 127 : 0x81 + i % 7);  // int8 scales of both signs
      for (int i = 0; i < 16; ++i) sb[256 + 2 * i] = 0, sb[256 + 2 * i + 1] = 0x14;  // d = 2^-10
      std::memset(sb + 288, fill, 8 * 384);
    }
    const std::vector<float> W = decode_kquant(fmt, w, groups, supers);
    std::vector<float> x(M * K);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) x[m * K + k] = m == 0 ? 1.0f : m == 1 ? -1.0f : (k % 2 ? 1.0f : -1.0f);
    }
    for (QMode mode : {QMode::kInt8Block, QMode::kInt8Row}) {
      check_product(fmt, x, M, K, w, W, groups, mode, {}, {},
                    std::string("q6_k extremes u ") + (fill ? "63" : "0") + " " + mode_name(mode));
    }
  }
}

}  // namespace

int main() {
  Rng rng{0x5EED};
  omp_set_num_threads(2);
  random_products(rng);
  extreme_products(rng);
  kquant_products(rng);
  q6k_extremes();
  std::string variants;
  for (const std::string& v : radixlm::int8_variants()) variants += (variants.empty() ? "" : " ") + v;
  return driver::finish("quant_gemm", " (int8 variants: " + variants + ")");
}
