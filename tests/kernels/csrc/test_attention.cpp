// The long-extend vector kernels (kernels/flash_attention.cpp: flash_extend_attention and
// flash_cascade_attention) at the level this file is compiled for, without torch
// (-DRADIXLM_NO_TORCH -fopenmp): every math the level runs (float32 FMAs everywhere, vdpbf16ps in
// the avx512 build on a CPU with AVX512-BF16), float32 and bfloat16 q over float32 and bfloat16
// pools, head dims 64 and 128, GQA, requests scattered over the pool, against a float64 reference
// on the same (bfloat16-exact) numbers:
//   - within 2e-5 where nothing is rounded to bf16 (FMAs, float32 q and output), else within
//     1.6e-2 (bf16 output, or q and the softmax weights rounded to bf16 by vdpbf16ps);
//   - the same bits on 1, 2 and 3 threads;
//   - set_long_extend_math refuses vdpbf16ps where it does not run;
//   - online_softmax.h's weights_to_pairs words: each pair the two weights rounded as torch
//     rounds to bf16, and weights_to_pairs_bf16 (vcvtne2ps2bf16, where it runs) the same words.
// Built and run by tests/kernels/test_paged_attention.py for every x86 level and, under qemu, the
// aarch64 ones (the torch module's tests cover the x86 levels through paged_attention):
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_attention.cpp kernels/csrc/kernels/flash_attention.cpp -o t && ./t
// Exit 0 with "attention <level>: N checks passed (maths ...)"; else the first mismatches and exit 1.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dispatch/cpu_features.h"
#include "driver_util.h"
#include "kernels/amx_attention.h"
#include "kernels/online_softmax.h"
#include "simd/math.h"

namespace {

using radixlm::ExtendRequest;

using driver::check;
using driver::reference_attention_row;
using driver::Rng;

// A batch over a pool: each request's slots scattered (a permutation of the pool), the first
// `shared` of every request the same slots (a cascade's shared prefix; 0: none).
struct Batch {
  int64_t Hq, Hkv, D, T = 0;
  std::vector<float> q, k, v;  // q [T][Hq][D]; pool [slots][Hkv][D]; every number bf16-exact
  std::vector<int32_t> slots;  // request i's at i * context
  int64_t context = 0;
  std::vector<ExtendRequest> requests;

  Batch(int64_t hq, int64_t hkv, int64_t d, const std::vector<std::pair<int64_t, int64_t>>& lens, int64_t shared,
        uint64_t seed)
      : Hq(hq), Hkv(hkv), D(d) {
    Rng rng{seed};
    int64_t pool = shared;
    for (const auto& [seq, ext] : lens) {
      context = std::max(context, seq);
      pool += seq - shared;
      T += ext;
    }
    std::vector<int32_t> perm(pool);
    for (int64_t i = 0; i < pool; ++i) perm[i] = static_cast<int32_t>(i);
    for (int64_t i = pool - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
    slots.assign(lens.size() * context, 0);
    int64_t next = shared, q_row = 0;
    for (size_t r = 0; r < lens.size(); ++r) {
      const auto [seq, ext] = lens[r];
      int32_t* own = slots.data() + r * context;
      for (int64_t p = 0; p < seq; ++p) own[p] = perm[p < shared ? p : next++];
      requests.push_back(ExtendRequest{own, seq, ext, q_row});
      q_row += ext;
    }
    for (auto* buf : {&k, &v}) {
      buf->resize(pool * Hkv * D);
      for (float& x : *buf) x = rng.bf16_exact(1.0f);
    }
    q.resize(T * Hq * D);
    for (float& x : q) x = rng.bf16_exact(2.0f);  // peaked softmaxes: a wrong key or mask shows
  }

  // float64 attention of every new token and query head over its request's visible keys
  std::vector<double> reference(double scale) const {
    std::vector<double> out(T * Hq * D, 0.0);
    const int64_t group = Hq / Hkv;
    for (const ExtendRequest& r : requests) {
      for (int64_t t = 0; t < r.extend_len; ++t) {
        const int64_t pos = r.seq_len - r.extend_len + t;
        for (int64_t h = 0; h < Hq; ++h) {
          reference_attention_row(q.data() + ((r.q_start + t) * Hq + h) * D, k.data(), v.data(), r.slots, pos, Hkv,
                                  h / group, D, scale, out.data() + ((r.q_start + t) * Hq + h) * D);
        }
      }
    }
    return out;
  }
};

// One kernel call (extend, or cascade over `shared` slots) on 1, 2, 3 threads: q of T, pool of P.
template <typename T, typename P>
void run_case(const Batch& b, int64_t shared, bool rounded, const std::string& name) {
  const std::vector<T> q = driver::from_floats<T>(b.q);
  const std::vector<P> k = driver::from_floats<P>(b.k), v = driver::from_floats<P>(b.v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(b.D));
  const std::vector<double> want = b.reference(scale);
  // rounded: q, weights or output in bf16
  const double tolerance = rounded || std::is_same_v<T, uint16_t> ? 1.6e-2 : 2e-5;
  std::vector<T> first;
  for (int threads = 1; threads <= 3; ++threads) {
    omp_set_num_threads(threads);
    std::vector<T> out(q.size());
    if (shared > 0) {
      radixlm::flash_cascade_attention<T, P>(b.requests, shared, q.data(), out.data(), b.Hq, b.Hkv, b.D, k.data(),
                                            v.data(), scale);
    } else {
      radixlm::flash_extend_attention<T, P>(b.requests, q.data(), out.data(), b.Hq, b.Hkv, b.D, k.data(), v.data(),
                                           scale);
    }
    if (threads == 1) {
      double err = 0.0;
      for (size_t i = 0; i < out.size(); ++i) err = std::max(err, std::fabs(driver::to_float(out[i]) - want[i]));
      check(err < tolerance, name + ": largest error " + std::to_string(err) + " against " + std::to_string(tolerance));
      first = out;
    } else {
      check(std::memcmp(out.data(), first.data(), out.size() * sizeof(T)) == 0,
            name + ": other bits on " + std::to_string(threads) + " threads");
    }
  }
}

// P^T pairs of a block of softmax weights (0, and normal floats up to e^8 ~ 3000, as
// block_weights gives them): word [i][r] = bf16(p[2i][r]) | bf16(p[2i + 1][r]) << 16.
void check_pairs() {
  using radixlm::kSoftmaxKeys;
  using radixlm::kSoftmaxRows;
  Rng rng{7};
  alignas(64) float w[kSoftmaxKeys][kSoftmaxRows];
  for (auto& key : w) {
    for (float& x : key) x = rng.next() % 5 == 0 ? 0.0f : std::exp(rng.uniform() * 45.0f - 37.0f);
  }
  radixlm::Vf p[kSoftmaxKeys];
  for (int64_t k = 0; k < kSoftmaxKeys; ++k) p[k] = radixlm::simd::vload(w[k]);
  alignas(64) uint32_t words[kSoftmaxKeys / 2 * kSoftmaxRows];
  radixlm::weights_to_pairs(p, words);
  bool same = true;
  for (int64_t i = 0; i < kSoftmaxKeys / 2; ++i) {
    for (int64_t r = 0; r < kSoftmaxRows; ++r) {
      const uint32_t want = radixlm::float_to_bf16(w[2 * i][r]) | static_cast<uint32_t>(radixlm::float_to_bf16(w[2 * i + 1][r])) << 16;
      same = same && words[i * kSoftmaxRows + r] == want;
    }
  }
  check(same, "weights_to_pairs: a word other than the two weights' bf16 (even key low)");
#if defined(RADIXLM_SIMD_AVX512)
  if (radixlm::cpu_has(radixlm::kAvx512Bf16)) {
    alignas(64) uint32_t cvt[kSoftmaxKeys / 2 * kSoftmaxRows];
    radixlm::weights_to_pairs_bf16(p, cvt);
    check(std::memcmp(cvt, words, sizeof cvt) == 0, "weights_to_pairs_bf16: other words than weights_to_pairs");
  }
#endif
}

}  // namespace

int main() {
  check_pairs();
  // the maths this level runs: 1 float32 FMAs (every level), 0 vdpbf16ps (where it runs)
  std::vector<int> maths = {1};
  try {
    radixlm::set_long_extend_math(0);
    maths.push_back(0);
  } catch (const std::runtime_error&) {
    check(std::string(RADIXLM_SIMD_NAME) != "avx512" || !radixlm::cpu_has(radixlm::kAvx512Bf16),
          "vdpbf16ps refused in the avx512 build on a CPU with AVX512-BF16");
  }
  const std::vector<std::pair<int64_t, int64_t>> extends = {{37, 37}, {300, 20}, {129, 16}, {70, 1}, {45, 3}};
  const std::vector<std::pair<int64_t, int64_t>> sharing = {{101, 5}, {97, 1}, {136, 33}, {180, 2}};
  for (const int64_t D : {64, 128}) {
    for (const auto& [Hq, Hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 4}}) {
      for (const int64_t shared : {int64_t{0}, int64_t{96}}) {
        const Batch b(Hq, Hkv, D, shared > 0 ? sharing : extends, shared, static_cast<uint64_t>(D * 100 + Hq + shared));
        const std::string shape = (shared > 0 ? "cascade" : "extend") + std::string(" D ") + std::to_string(D) + " Hq " +
                                  std::to_string(Hq) + " Hkv " + std::to_string(Hkv);
        radixlm::set_long_extend_math(1);
        run_case<float, float>(b, shared, false, shape + " float32 pool");
        for (const int math : maths) {
          radixlm::set_long_extend_math(math);
          const std::string m = math == 1 ? " fma" : " vdpbf16ps";
          run_case<float, uint16_t>(b, shared, math == 0, shape + " bf16 pool, float32 q" + m);
          run_case<uint16_t, uint16_t>(b, shared, math == 0, shape + " bf16 pool, bf16 q" + m);
        }
      }
    }
  }
  std::string names;
  for (const int math : maths) names += math == 1 ? (names.empty() ? "fma" : " fma") : (names.empty() ? "vdpbf16ps" : " vdpbf16ps");
  return driver::finish("attention", " (maths: " + names + ")");
}
