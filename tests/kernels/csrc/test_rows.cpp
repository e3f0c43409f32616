// The row-wise kernels (kernels/rows.h: rms_norm_rows, silu_mul_rows) at the level this file is
// compiled for, without torch (-DRADIXLM_NO_TORCH -fopenmp), against float64 written here:
//   - float32 rows within 2e-6 of each output's magnitude (RMSNorm; SiLU x up within 1e-5: exp16);
//   - bfloat16 rows (bfloat16-exact inputs) within one bfloat16 rounding (2^-8) of it;
//   - widths below, at and past whole vectors (1, 13, 16, 47, 64, 100, 576: the partial-vector
//     tails), 1 to 40 rows (split between threads), input rows strided, RMSNorm with and without
//     its weight, inputs up to +-8 (SiLU's exp on both sides);
//   - nothing written past the output; the same bits on 1, 2 and 3 threads.
// Built and run by tests/kernels/test_rows.py per x86 build and, under qemu, aarch64:
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_rows.cpp kernels/csrc/kernels/rows.cpp -o t && ./t
// Exit 0 with "rows <level>: N checks passed"; else the first mismatches and exit 1.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "driver_util.h"
#include "kernels/rows.h"

namespace {

using driver::check;
using driver::from_float;
using driver::Rng;

constexpr float kGuard = -12345.5f;

// The reference's double of a float or bfloat16 value (exact).
template <typename T>
double to_d(T x) {
  return driver::to_float(x);
}

// Runs `kernel(y)` on 1, 2, 3 threads into y [rows * n] + a guard vector: every run the same
// bits, nothing past the output written; gives the single-thread output.
template <typename T, typename F>
std::vector<T> run(int64_t rows, int64_t n, const F& kernel, const std::string& what) {
  std::vector<T> first;
  for (int threads = 1; threads <= 3; ++threads) {
    omp_set_num_threads(threads);
    std::vector<T> y(rows * n + 16, from_float<T>(kGuard));
    kernel(y.data());
    bool guarded = true;
    for (int64_t i = rows * n; i < rows * n + 16; ++i) guarded = guarded && to_d(y[i]) == to_d(from_float<T>(kGuard));
    check(guarded, what + ": wrote past the output on " + std::to_string(threads) + " threads");
    y.resize(rows * n);
    if (threads == 1) {
      first = y;
    } else {
      check(std::memcmp(first.data(), y.data(), y.size() * sizeof(T)) == 0,
            what + ": other bits on " + std::to_string(threads) + " threads");
    }
  }
  return first;
}

// The largest |got - want| / (tolerance * |want| + floor) over the rows: at most 1 passes.
template <typename T>
void check_close(const std::vector<T>& got, const std::vector<double>& want, double rel, double floor,
                 const std::string& what) {
  double worst = 0.0;
  int64_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(to_d(got[i]) - want[i]) / (rel * std::fabs(want[i]) + floor);
    if (!(r <= worst)) worst = r, at = static_cast<int64_t>(i);
  }
  check(worst <= 1.0, what + ": element " + std::to_string(at) + " off by " + std::to_string(worst) + " tolerances");
}

template <typename T>
void check_rms_norm(Rng& rng, int64_t rows, int64_t n, bool weighted) {
  const int64_t ld = n + 5;
  std::vector<T> x(rows * ld);
  for (T& v : x) v = from_float<T>(driver::round_bf16(rng.uniform() * 3.0f));
  std::vector<float> w(n);
  for (float& v : w) v = rng.uniform() + 1.0f;
  const float eps = 1e-5f;
  const std::string what = std::string("rms_norm ") + (std::is_same_v<T, float> ? "float32" : "bf16") + " rows " +
                           std::to_string(rows) + " width " + std::to_string(n) + (weighted ? " weighted" : "");
  const std::vector<T> y = run<T>(rows, n, [&](T* out) {
    radixlm::rms_norm_rows(x.data(), rows, n, ld, weighted ? w.data() : nullptr, eps, out);
  }, what);
  std::vector<double> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += to_d(x[r * ld + i]) * to_d(x[r * ld + i]);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) want[r * n + i] = to_d(x[r * ld + i]) * inv * (weighted ? w[i] : 1.0);
  }
  const bool bf16 = std::is_same_v<T, uint16_t>;
  check_close(y, want, bf16 ? 0x1p-8 + 1e-6 : 2e-6, 1e-30, what);
}

template <typename T>
void check_silu_mul(Rng& rng, int64_t rows, int64_t n) {
  const int64_t ld = 2 * n + 3;
  std::vector<T> gu(rows * ld);
  for (T& v : gu) v = from_float<T>(driver::round_bf16(rng.uniform() * 8.0f));
  const std::string what = std::string("silu_mul ") + (std::is_same_v<T, float> ? "float32" : "bf16") + " rows " +
                           std::to_string(rows) + " width " + std::to_string(n);
  const std::vector<T> y = run<T>(rows, n, [&](T* out) { radixlm::silu_mul_rows(gu.data(), rows, n, ld, out); }, what);
  std::vector<double> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const double g = to_d(gu[r * ld + i]), u = to_d(gu[r * ld + n + i]);
      want[r * n + i] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  const bool bf16 = std::is_same_v<T, uint16_t>;
  check_close(y, want, bf16 ? 0x1p-8 + 1e-5 : 1e-5, 1e-30, what);
}

}  // namespace

int main() {
  Rng rng{42};
  for (const int64_t n : {1, 13, 16, 47, 64, 100, 576}) {
    for (const int64_t rows : {1, 3, 17, 40}) {
      for (const bool weighted : {false, true}) {
        check_rms_norm<float>(rng, rows, n, weighted);
        check_rms_norm<uint16_t>(rng, rows, n, weighted);
      }
      check_silu_mul<float>(rng, rows, n);
      check_silu_mul<uint16_t>(rng, rows, n);
    }
  }
  return driver::finish("rows");
}
