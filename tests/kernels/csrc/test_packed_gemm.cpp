// packed_gemm (kernels/packed_gemm.h) at the level this file is compiled for, without torch
// (-DRADIXLM_NO_TORCH -fopenmp: kernels/parallel.h runs OpenMP), against a float64 product:
//   out[m, n] = residual[m, n] + bias[n] + sum_k x[m, k] * W[k, n],  W[k, 64 b + j] = w[b][k][j]
// for M in 1..13, K from 1 to 300, 1..10 panels, with and without residual and bias, out rows
// wider than N (the columns past N untouched) and out aliasing residual. Each output is within
// 1e-5 of the sum of its terms' magnitudes; and the bits are the same on 1, 2 and 3 threads
// (packed_gemm.h's promise). Built and run by tests/kernels/test_vec_layer.py, per level:
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_packed_gemm.cpp -o test_packed_gemm && ./test_packed_gemm
// Exit 0 with "packed_gemm <level>: N checks passed"; else the first mismatches and exit 1.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "driver_util.h"
#include "kernels/packed_gemm.h"

namespace {

using driver::g_checks;
using driver::g_failures;
using driver::Rng;

bool report(const char* what) {
  ++g_failures;
  if (g_failures > 10) return false;
  std::printf("MISMATCH %s", what);
  return true;
}

// One shape: every thread count gives the same bits, within tolerance of the float64 product.
void check_shape(Rng& g, int64_t M, int64_t K, int64_t panels, bool with_residual, bool with_bias, bool alias) {
  const int64_t N = panels * radixlm::kPanel, ld_out = N + 3, ld_res = with_residual ? N + 5 : 0;
  std::vector<float> x(M * K), w(panels * K * radixlm::kPanel), bias(with_bias ? N : 0), residual(with_residual ? M * ld_res : 0);
  for (float& v : x) v = g.uniform();
  for (float& v : w) v = g.uniform();
  for (float& v : bias) v = g.uniform();
  for (float& v : residual) v = 4 * g.uniform();
  // float64 reference and the scale of each output's terms
  std::vector<double> want(M * N), scale(M * N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t b = n / radixlm::kPanel, j = n % radixlm::kPanel;
      double s = 0, a = 0;
      if (with_residual) s += residual[m * ld_res + n], a += std::fabs(residual[m * ld_res + n]);
      if (with_bias) s += bias[n], a += std::fabs(bias[n]);
      for (int64_t k = 0; k < K; ++k) {
        const double t = double(x[m * K + k]) * w[(b * K + k) * radixlm::kPanel + j];
        s += t, a += std::fabs(t);
      }
      want[m * N + n] = s, scale[m * N + n] = a;
    }
  }
  const float kGuard = -12345.5f;
  std::vector<float> first;
  for (int threads = 1; threads <= 3; ++threads) {
    omp_set_num_threads(threads);
    // out aliasing residual: residual's rows laid out as out's (ld_out apart) in out itself
    std::vector<float> out(M * ld_out, kGuard);
    const float* res = nullptr;
    int64_t ld = ld_res;
    if (with_residual && alias) {
      for (int64_t m = 0; m < M; ++m) std::memcpy(&out[m * ld_out], &residual[m * ld_res], N * sizeof(float));
      res = out.data(), ld = ld_out;
    } else if (with_residual) {
      res = residual.data();
    }
    radixlm::packed_gemm(x.data(), M, K, w.data(), panels, out.data(), ld_out, res, ld, with_bias ? bias.data() : nullptr);
    char what[160];
    std::snprintf(what, sizeof what, "M=%lld K=%lld panels=%lld residual=%d bias=%d alias=%d threads=%d", (long long)M,
                  (long long)K, (long long)panels, with_residual, with_bias, alias, threads);
    ++g_checks;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = N; n < ld_out; ++n) {
        if (out[m * ld_out + n] != kGuard && report(what)) std::printf(": wrote column %lld (past N) of row %lld\n", (long long)n, (long long)m);
      }
      for (int64_t n = 0; n < N; ++n) {
        const double got = out[m * ld_out + n], err = std::fabs(got - want[m * N + n]);
        if (err <= 1e-5 * scale[m * N + n] + 1e-30) continue;
        if (report(what)) std::printf(": [%lld, %lld] got %.9g want %.9g\n", (long long)m, (long long)n, got, want[m * N + n]);
        m = M;
        break;
      }
    }
    // the same bits on every thread count
    std::vector<float> rows(M * N);
    for (int64_t m = 0; m < M; ++m) std::memcpy(&rows[m * N], &out[m * ld_out], N * sizeof(float));
    ++g_checks;
    if (threads == 1) first = rows;
    else if (std::memcmp(first.data(), rows.data(), rows.size() * sizeof(float)) != 0 && report(what)) std::printf(": bits differ from 1 thread\n");
  }
}

}  // namespace

int main() {
  Rng g{7};
  const int64_t Ks[] = {1, 2, 3, 16, 17, 64, 100, 300};
  const int64_t panel_counts[] = {1, 2, 3, 5, 10};
  for (int64_t M = 1; M <= 13; ++M) {
    for (const int64_t K : Ks) {
      for (const int64_t panels : panel_counts) {
        const int variant = static_cast<int>((M + K + panels) % 4);  // a different mix on each shape, all four often
        check_shape(g, M, K, panels, variant & 1, variant & 2, false);
        if (K == 17 || K == 300) check_shape(g, M, K, panels, true, (variant & 2) != 0, true);
        if (K == 64) check_shape(g, M, K, panels, (variant & 1) == 0, (variant & 2) == 0, false);
      }
    }
  }
  return driver::finish("packed_gemm");
}
