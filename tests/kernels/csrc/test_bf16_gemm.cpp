// bf16_gemm (kernels/bf16_gemm.h) at the level this file is compiled for, without torch
// (-DRADIXLM_NO_TORCH -fopenmp), on every path the build runs on this CPU (the emulated one at
// every level; vdpbf16ps and AMX tiles in the avx512 build where the CPU has them):
//   - the vector paths bit for bit against a scalar model of vdpbf16ps written here (per column,
//     from residual + bias, each k-pair's odd product added, then the even one, each addition
//     rounded once; x rounded to bfloat16 first), every path within 1e-5 of each output's sum of
//     |terms| of a float64 product on the bfloat16-rounded inputs;
//   - M 1..7, 11, 16, 17, 33 and 130 (several row chunks), K 1..576 (tails of the 32-deep pairs),
//     2..18 panels (a lone panel at the end of a thread's run), residual and bias, out rows wider
//     than N (nothing written past N) and out aliasing the residual;
//   - the same bits on 1, 2 and 3 threads; a path the CPU does not run, an unknown path and an odd
//     panel count refused (std::runtime_error).
// Built and run by tests/kernels/test_bf16_gemm.py per x86 build and, under qemu, aarch64:
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_bf16_gemm.cpp kernels/csrc/kernels/bf16_gemm.cpp -o t && ./t
// Exit 0 with "bf16_gemm <level>: N checks passed (paths ...)"; else the first mismatches, exit 1.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "driver_util.h"
#include "kernels/bf16_gemm.h"

namespace {

using driver::check;
using driver::refused;
using driver::round_bf16;
using driver::Rng;
using radixlm::Bf16Path;

const char* path_name(Bf16Path p) {
  return p == Bf16Path::kEmulated ? "emulated" : p == Bf16Path::kAvx512Bf16 ? "avx512bf16" : "amx";
}

struct Shape {
  int64_t M, K, panels;
  bool residual, bias, alias;
};

// One shape on one path: the model's bits (vector paths), the float64 tolerance, 1-3 threads.
void check_shape(Rng& rng, const Shape& s, Bf16Path path) {
  const int64_t M = s.M, K = s.K, N = s.panels * radixlm::kPairPanel, ld_out = N + 3, ld_res = N + 5;
  std::vector<float> x(M * K), W(K * N), bias(N), residual(M * ld_res);
  for (float& v : x) v = rng.uniform() * 2.0f;
  for (float& v : W) v = rng.uniform() * 0.1f;
  for (float& v : bias) v = rng.uniform();
  for (float& v : residual) v = rng.uniform() * 4.0f;
  const std::vector<uint16_t> w = driver::pack_pairs(W, K, N);
  // the model of vdpbf16ps, and float64 with the magnitude of each output's terms
  std::vector<float> model(M * N);
  std::vector<double> want(M * N), scale(M * N);
  const int64_t Kp = radixlm::pair_k(K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = s.residual ? residual[m * ld_res + n] : 0.0f;
      if (s.bias) acc = acc + bias[n];
      double sum = acc, mag = (s.residual ? std::fabs(residual[m * ld_res + n]) : 0.0) + (s.bias ? std::fabs(bias[n]) : 0.0);
      for (int64_t p = 0; p < Kp / 2; ++p) {
        for (const int64_t k : {2 * p + 1, 2 * p}) {
          const float xk = k < K ? round_bf16(x[m * K + k]) : 0.0f, wk = k < K ? round_bf16(W[k * N + n]) : 0.0f;
          acc = acc + xk * wk;  // the product of two bf16 values is exact in float32
          sum += static_cast<double>(xk) * wk;
          mag += std::fabs(static_cast<double>(xk) * wk);
        }
      }
      model[m * N + n] = acc, want[m * N + n] = sum, scale[m * N + n] = mag;
    }
  }
  char what[200];
  std::snprintf(what, sizeof what, "%s M %lld K %lld N %lld residual %d bias %d alias %d", path_name(path),
                static_cast<long long>(M), static_cast<long long>(K), static_cast<long long>(N), s.residual, s.bias,
                s.alias);
  const float kGuard = -12345.5f;
  std::vector<float> first;
  for (int threads = 1; threads <= 3; ++threads) {
    omp_set_num_threads(threads);
    std::vector<float> out(M * ld_out, kGuard);
    const float* res = s.residual ? residual.data() : nullptr;
    int64_t ld = ld_res;
    if (s.residual && s.alias) {  // the residual's rows in out itself
      for (int64_t m = 0; m < M; ++m) std::memcpy(&out[m * ld_out], &residual[m * ld_res], N * sizeof(float));
      res = out.data(), ld = ld_out;
    }
    radixlm::bf16_gemm(x.data(), M, K, w.data(), s.panels, out.data(), ld_out, res, ld, s.bias ? bias.data() : nullptr,
                       path);
    bool guarded = true, exact = true, close = true;
    std::vector<float> rows(M * N);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = N; n < ld_out; ++n) guarded = guarded && out[m * ld_out + n] == kGuard;
      std::memcpy(&rows[m * N], &out[m * ld_out], N * sizeof(float));
    }
    for (int64_t i = 0; i < M * N; ++i) {
      exact = exact && std::memcmp(&rows[i], &model[i], sizeof(float)) == 0;
      close = close && std::fabs(rows[i] - want[i]) <= 1e-5 * scale[i] + 1e-30;
    }
    const std::string t = std::string(what) + " threads " + std::to_string(threads);
    check(guarded, t + ": wrote past N");
    check(close, t + ": off the float64 product");
    if (path != Bf16Path::kAmx) check(exact, t + ": other bits than vdpbf16ps");
    if (threads == 1) {
      first = rows;
    } else {
      check(std::memcmp(first.data(), rows.data(), rows.size() * sizeof(float)) == 0, t + ": other bits than on 1 thread");
    }
  }
}

void check_refusals() {
  refused("path 3", "unknown bf16 GEMM path", [] { radixlm::bf16_path(3); });
  if (!radixlm::bf16_path_runs(Bf16Path::kAvx512Bf16)) refused("path 1", "AVX512-BF16", [] { radixlm::bf16_path(1); });
  if (!radixlm::bf16_path_runs(Bf16Path::kAmx)) refused("path 2", "AMX", [] { radixlm::bf16_path(2); });
  std::vector<float> x(64, 1.0f), out(32);
  std::vector<uint16_t> w(32 * 64);
  refused("1 panel", "pair panels come in pairs", [&] {
    radixlm::bf16_gemm(x.data(), 1, 64, w.data(), 1, out.data(), 32, nullptr, 0, nullptr, Bf16Path::kEmulated);
  });
}

}  // namespace

int main() {
  check_refusals();
  std::vector<Bf16Path> paths;
  std::string names;
  for (Bf16Path p : {Bf16Path::kEmulated, Bf16Path::kAvx512Bf16, Bf16Path::kAmx}) {
    if (!radixlm::bf16_path_runs(p)) continue;
    paths.push_back(p);
    names += std::string(names.empty() ? "" : " ") + path_name(p);
  }
  check(radixlm::bf16_path() == paths.back(), "bf16_path() is not the fastest path that runs");
  Rng rng{11};
  const int64_t Ks[] = {1, 5, 31, 32, 33, 96, 100, 576};
  const int64_t panel_counts[] = {2, 4, 6, 18};
  int variant = 0;
  for (const int64_t M : {1, 2, 3, 4, 5, 6, 7, 11, 16, 17, 33, 130}) {
    for (const int64_t K : Ks) {
      // a different panel count and mix of extras on each shape, the large ones kept few
      const int64_t panels = M * K >= 130 * 96 ? 2 + 2 * (variant % 2) : panel_counts[variant % 4];
      const Shape shape{M, K, panels, variant % 2 == 0, variant % 3 != 0, variant % 4 == 2};
      ++variant;
      for (const Bf16Path p : paths) check_shape(rng, shape, p);
    }
  }
  return driver::finish("bf16_gemm", " (paths: " + names + ")");
}
