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
// Formats Q8_0 / Q4_0 / Q4_1, K 32..576, 2..12 groups, 1..33 rows, residual and bias. Built and run
// by tests/kernels/test_quant_gemm.py for the aarch64 levels under qemu (the x86 levels run the
// torch module there):
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_quant_gemm.cpp kernels/csrc/kernels/quant_gemm.cpp -o t && ./t
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

}  // namespace

int main() {
  Rng rng{0x5EED};
  omp_set_num_threads(2);
  random_products(rng);
  extreme_products(rng);
  std::string variants;
  for (const std::string& v : radixlm::int8_variants()) variants += (variants.empty() ? "" : " ") + v;
  return driver::finish("quant_gemm", " (int8 variants: " + variants + ")");
}
