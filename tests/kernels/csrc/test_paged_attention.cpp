// paged_attention (kernels/paged_attention.h) at the level this file is compiled for, without torch
// (-DRADIXLM_NO_TORCH -fopenmp), against a float64 attention written here:
//   - decode batches (contexts 1..100), extends (several 32-token units per request, short and
//     long ones), mixed batches; decodes and extends sharing a long cached prefix (the same slots:
//     the cascade kernel where the caller allows it), and batches sharing a prefix where the
//     cascade does not pay (too short, or dwarfed by a request's own keys);
//   - GQA groups 1, 3 and 4, head dims 64, 128, 80 and 256; requests on shuffled req_to_token rows,
//     their slots scattered over the pool, q rows in another order than the requests;
//   - float32 and bfloat16 q over float32 and bfloat16 pools; every number bfloat16-exact, so
//     within 2e-5 where nothing is rounded (float32 q and output), 1.6e-2 where the output or the
//     products are bfloat16 (bf16 q; vdpbf16ps or AMX on long extends);
//   - each dispatch: the vector kernel alone (amx = flash = false), and with the long-extend and
//     cascade kernels allowed (flash; amx where it runs) on every long-extend math the level runs
//     here; the cascade taken exactly where expected (num_cascade_calls);
//   - every output row written; the same bits on 1, 2 and 3 threads;
//   - a head size, a head ratio, a length and a slot out of range refused (std::runtime_error).
// Built and run by tests/kernels/test_paged_attention.py per x86 build and, under qemu, aarch64:
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_paged_attention.cpp kernels/csrc/kernels/{paged,flash,amx}_attention.cpp
// Exit 0 with "paged_attention <level>: N checks passed (maths ...)"; else the first mismatches, exit 1.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "driver_util.h"
#include "kernels/amx_attention.h"
#include "kernels/paged_attention.h"

namespace {

using driver::check;
using driver::reference_attention_row;
using driver::Rng;
using radixlm::AttentionBatch;
using radixlm::DType;
using radixlm::KvBuffers;

struct Case {
  const char* name;
  std::vector<std::pair<int64_t, int64_t>> lens;  // (cached prefix, new tokens) per request
  int64_t shared;                                 // slots shared by requests whose prefix is that long
  bool cascade;                                   // the dispatch must take the cascade (with flash)
};

// A batch over a pool of scattered slots (slot 0 never used, as the pool's dummy), every number
// bfloat16-exact. Request b sits on row rows[b] of req_to_token (entries past its length -1);
// its q rows follow those of the requests after it.
struct Batch {
  int64_t Hq, Hkv, D, T = 0, context = 0, num_rows = 0, num_slots = 0;
  std::vector<float> q, k, v;
  std::vector<int32_t> req_to_token;
  std::vector<int64_t> rows, seq_lens, extend_lens, extend_start;

  Batch(int64_t hq, int64_t hkv, int64_t d, const Case& c, uint64_t seed) : Hq(hq), Hkv(hkv), D(d) {
    Rng rng{seed};
    const int64_t B = static_cast<int64_t>(c.lens.size());
    int64_t own = 0;
    for (const auto& [prefix, ext] : c.lens) {
      context = std::max(context, prefix + ext);
      own += prefix + ext - (prefix >= c.shared ? c.shared : 0);
      T += ext;
    }
    num_slots = 1 + c.shared + own + 7;  // a few slots no request uses
    std::vector<int32_t> perm(num_slots - 1);
    for (int64_t i = 0; i < num_slots - 1; ++i) perm[i] = static_cast<int32_t>(i + 1);
    for (int64_t i = num_slots - 2; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
    num_rows = B + 3;
    std::vector<int64_t> row_perm(num_rows);
    for (int64_t i = 0; i < num_rows; ++i) row_perm[i] = i;
    for (int64_t i = num_rows - 1; i > 0; --i) std::swap(row_perm[i], row_perm[rng.next() % (i + 1)]);
    req_to_token.assign(num_rows * context, -1);
    int64_t next = c.shared, q_row = T;
    for (int64_t b = 0; b < B; ++b) {
      const auto [prefix, ext] = c.lens[b];
      rows.push_back(row_perm[b]);
      seq_lens.push_back(prefix + ext);
      extend_lens.push_back(ext);
      q_row -= ext;
      extend_start.push_back(q_row);
      int32_t* slots = req_to_token.data() + rows[b] * context;
      for (int64_t p = 0; p < prefix + ext; ++p) slots[p] = perm[p < c.shared && prefix >= c.shared ? p : next++];
    }
    for (auto* buf : {&k, &v}) {
      buf->resize(num_slots * Hkv * D);
      for (float& x : *buf) x = rng.bf16_exact(1.0f);
    }
    q.resize(T * Hq * D);
    for (float& x : q) x = rng.bf16_exact(2.0f);  // peaked softmaxes: a wrong key or mask shows
  }

  // float64 attention of every new token and query head over its request's visible keys
  std::vector<double> reference(double scale) const {
    std::vector<double> out(T * Hq * D, 0.0);
    const int64_t group = Hq / Hkv;
    for (size_t b = 0; b < rows.size(); ++b) {
      const int32_t* slots = req_to_token.data() + rows[b] * context;
      for (int64_t t = 0; t < extend_lens[b]; ++t) {
        const int64_t pos = seq_lens[b] - extend_lens[b] + t, q_row = extend_start[b] + t;
        for (int64_t h = 0; h < Hq; ++h) {
          reference_attention_row(q.data() + (q_row * Hq + h) * D, k.data(), v.data(), slots, pos, Hkv, h / group, D,
                                  scale, out.data() + (q_row * Hq + h) * D);
        }
      }
    }
    return out;
  }

  AttentionBatch view() const {
    return AttentionBatch{req_to_token.data(), num_rows,           context, rows.data(), seq_lens.data(),
                          extend_lens.data(),  extend_start.data(), static_cast<int64_t>(rows.size())};
  }
};

template <typename X>
constexpr DType dtype_of() {
  return std::is_same_v<X, float> ? DType::kFloat32 : DType::kBFloat16;
}

struct Mode {
  bool amx, flash;
  int math;  // the long-extend math (amx_attention.h LongExtendMath) where flash
};

// One call of the batch with q of T over a pool of P, on 1, 2 and 3 threads.
template <typename T, typename P>
void run_case(const Batch& b, const Case& c, const std::vector<double>& want, Mode mode, const std::string& name) {
  const std::vector<T> q = driver::from_floats<T>(b.q);
  std::vector<P> k = driver::from_floats<P>(b.k), v = driver::from_floats<P>(b.v);
  const KvBuffers kv{k.data(), v.data(), b.num_slots, b.Hkv, b.D, dtype_of<P>()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(b.D));
  const bool bf16_pool = std::is_same_v<P, uint16_t>, float_q = std::is_same_v<T, float>;
  const bool takes_amx = mode.amx && bf16_pool && radixlm::amx_attention_supported(b.D);
  const bool takes_flash = mode.flash && !takes_amx && radixlm::flash_attention_supported(b.D) && (bf16_pool || float_q);
  const bool rounded = !float_q || (bf16_pool && (takes_amx || (takes_flash && mode.math == 0)));
  const double tolerance = rounded ? 1.6e-2 : 2e-5;
  if (mode.flash) radixlm::set_long_extend_math(mode.math);
  std::vector<T> first;
  for (int threads = 1; threads <= 3; ++threads) {
    omp_set_num_threads(threads);
    std::vector<T> out(q.size(), driver::from_floats<T>({std::numeric_limits<float>::quiet_NaN()})[0]);  // rows left unwritten show
    const int64_t cascades = radixlm::num_cascade_calls();
    radixlm::paged_attention(q.data(), out.data(), dtype_of<T>(), b.T, b.Hq, kv, b.view(), scale, mode.amx, mode.flash);
    const int64_t took = radixlm::num_cascade_calls() - cascades;
    check(took == (takes_flash && c.cascade ? 1 : 0), name + ": the cascade taken " + std::to_string(took) + " times");
    if (threads == 1) {
      double err = 0.0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double e = std::fabs(driver::to_float(out[i]) - want[i]);
        err = std::isnan(e) ? INFINITY : std::max(err, e);
      }
      check(err < tolerance, name + ": largest error " + std::to_string(err) + " against " + std::to_string(tolerance));
      first = out;
    } else {
      check(std::memcmp(out.data(), first.data(), out.size() * sizeof(T)) == 0,
            name + ": other bits on " + std::to_string(threads) + " threads");
    }
  }
}

void run_batch(int64_t Hq, int64_t Hkv, int64_t D, const Case& c, const std::vector<int>& maths) {
  const Batch b(Hq, Hkv, D, c, static_cast<uint64_t>(D * 1000 + Hq * 10 + Hkv));
  const std::vector<double> want = b.reference(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<Mode> modes = {{false, false, 1}};
  for (const int math : maths) modes.push_back({false, true, math});
  if (radixlm::amx_attention_supported(D)) modes.push_back({true, true, 1});
  for (const Mode& mode : modes) {
    const std::string m = !mode.flash ? " vector" : mode.amx ? " amx" : mode.math == 1 ? " flash fma" : " flash vdpbf16ps";
    const std::string shape = std::string(c.name) + " Hq " + std::to_string(Hq) + " Hkv " + std::to_string(Hkv) +
                              " D " + std::to_string(D) + m;
    run_case<float, float>(b, c, want, mode, shape + " float32 q, float32 pool");
    run_case<float, uint16_t>(b, c, want, mode, shape + " float32 q, bf16 pool");
    run_case<uint16_t, float>(b, c, want, mode, shape + " bf16 q, float32 pool");
    run_case<uint16_t, uint16_t>(b, c, want, mode, shape + " bf16 q, bf16 pool");
  }
}

// Operands out of range are refused with the kernel's message.
void check_refusals() {
  const Case c{"refusals", {{3, 1}, {5, 2}}, 0, false};
  auto refused = [](const char* what, const std::string& needle, auto&& call) {
    try {
      call();
      check(false, std::string(what) + ": accepted");
    } catch (const std::runtime_error& e) {
      check(std::string(e.what()).find(needle) != std::string::npos, std::string(what) + ": refused as " + e.what());
    }
  };
  Batch b(4, 2, 64, c, 1);
  std::vector<float> out(b.q.size());
  const KvBuffers kv{b.k.data(), b.v.data(), b.num_slots, b.Hkv, b.D, DType::kFloat32};
  refused("head_dim 24", "head_dim 24 is not supported", [&] {
    const KvBuffers bad{b.k.data(), b.v.data(), b.num_slots, b.Hkv, 24, DType::kFloat32};
    radixlm::paged_attention(b.q.data(), out.data(), DType::kFloat32, b.T, b.Hq, bad, b.view(), 1.0f);
  });
  refused("3 heads over 2", "head shapes", [&] {
    radixlm::paged_attention(b.q.data(), out.data(), DType::kFloat32, b.T, 3, kv, b.view(), 1.0f);
  });
  refused("a length past the context", "out of range", [&] {
    Batch longer = b;
    longer.seq_lens[1] = longer.context + 1;
    radixlm::paged_attention(b.q.data(), out.data(), DType::kFloat32, b.T, b.Hq, kv, longer.view(), 1.0f);
  });
  refused("a slot past the pool", "a KV slot is out of range", [&] {
    Batch bad = b;
    bad.req_to_token[bad.rows[0] * bad.context + 2] = static_cast<int32_t>(bad.num_slots);
    radixlm::paged_attention(b.q.data(), out.data(), DType::kFloat32, b.T, b.Hq, kv, bad.view(), 1.0f);
  });
}

}  // namespace

int main() {
  check_refusals();
  // the long-extend maths this level runs: 1 float32 FMAs (every level), 0 vdpbf16ps (where it runs)
  std::vector<int> maths = {1};
  try {
    radixlm::set_long_extend_math(0);
    maths.push_back(0);
  } catch (const std::runtime_error&) {
  }
  const std::vector<Case> cases = {
      {"decode", {{0, 1}, {4, 1}, {16, 1}, {40, 1}, {99, 1}}, 0, false},
      {"extend", {{0, 37}, {45, 20}, {3, 70}, {10, 2}}, 0, false},
      {"mixed", {{3, 1}, {0, 2}, {40, 16}, {7, 33}, {0, 15}}, 0, false},
      {"decodes sharing 96", {{96, 1}, {99, 1}, {97, 1}, {101, 1}}, 96, true},
      {"extends sharing 80", {{80, 3}, {85, 1}, {81, 5}}, 80, true},
      {"decodes sharing 40 (too few)", {{40, 1}, {50, 1}, {45, 1}}, 40, false},
      {"decodes sharing 96 of a long one", {{96, 1}, {300, 1}}, 96, false},
  };
  // (Hq, Hkv, D): GQA groups 1, 3, 4, 2; head dims 64, 128, 80 (a value pass of 5 vectors), 256
  const std::vector<std::vector<int64_t>> shapes = {{4, 4, 64}, {6, 2, 128}, {8, 2, 64}, {3, 1, 80}, {2, 1, 256}};
  for (const auto& s : shapes) {
    for (const Case& c : cases) run_batch(s[0], s[1], s[2], c, maths);
  }
  std::string names;
  for (const int math : maths) names += std::string(names.empty() ? "" : " ") + (math == 1 ? "fma" : "vdpbf16ps");
  return driver::finish("paged_attention", " (maths: " + names + ")");
}
