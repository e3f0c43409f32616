// The experts of a mixture-of-experts layer in one parallel region (moe_experts.h).
#include "kernels/moe_experts.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"
#include "kernels/rows.h"

namespace radixlm {
namespace {

constexpr int64_t kSlice = 64;  // columns of the narrowest item of kinds 1 and 2
constexpr int64_t kItemsPerThread = 16;  // at least this many items a thread in each kind, where widths allow

// Columns of an item over `columns` of each of `routed` experts: 256, 128 or 64 (columns a multiple
// of it when `exact`), the widest that still gives every thread kItemsPerThread items. Wider items
// are longer streams with less dispatch each (a batch-1 layer's 27.6 KB down slices were 256
// items); narrower ones balance the threads.
int64_t slice_width(int64_t columns, int64_t routed, bool exact) {
  const int64_t wanted = kItemsPerThread * std::max(1, num_threads());
  for (int64_t w = 4 * kSlice; w > kSlice; w /= 2) {
    if ((!exact || columns % w == 0) && routed * ((columns + w - 1) / w) >= wanted) return w;
  }
  return kSlice;
}
constexpr int64_t kTokenRun = 16;  // tokens of an item of kind 3

inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error("moe_experts: " + message);
}

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// out[M, n] (rows ld_out apart) = x[M, K] @ columns [c0, c0 + n) of the weight at w (K rows, in
// the layer's layout; quantized: format L.formats[which], 0 gate_up, 1 down); c0 and n multiples
// of 64 (float32) or 32.
// xq: x quantized for L.mode (quantized int8 modes), or null.
void slice_product(const MoeExperts& L, int which, const uint8_t* w, int64_t K, const float* x, const QuantizedX* xq,
                   int64_t M, int64_t c0, int64_t n, float* out, int64_t ld_out) {
  switch (L.kind) {
    case MoeWeights::kFloat32: {
      const float* wf = reinterpret_cast<const float*>(w) + (c0 / kPanel) * K * kPanel;
      return packed_gemm(x, M, K, wf, n / kPanel, out, ld_out, nullptr, 0, nullptr);
    }
    case MoeWeights::kBf16: {
      const uint16_t* wb = reinterpret_cast<const uint16_t*>(w) + (c0 / kPairPanel) * pair_k(K) * kPairPanel;
      return bf16_gemm(x, M, K, wb, n / kPairPanel, out, ld_out, nullptr, 0, nullptr, L.bf16_path);
    }
    case MoeWeights::kQuant: {
      const QFormat f = L.formats[which];
      const int64_t group_bytes = K / q_block_k(f) * q_block_bytes(f);
      return q_gemm(x, M, K, w + (c0 / kQGroup) * group_bytes, n / kQGroup, f, L.mode, out, ld_out, nullptr, 0,
                    nullptr, xq);
    }
  }
}

// The step's (token, choice) pairs grouped by expert: routed expert i is expert[i], taking the
// gathered rows [first[i], first[i + 1]); pair (t, j) is gathered row pos[t * k + j].
struct Groups {
  std::vector<int64_t> expert, first, pos;
};

Groups group_by_expert(const int64_t* ids, int64_t T, int64_t k, int64_t num_experts) {
  std::vector<int64_t> count(num_experts + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    require(ids[i] >= 0 && ids[i] < num_experts, "expert id " + std::to_string(ids[i]) + " is out of range [0, " +
                                                     std::to_string(num_experts) + ")");
    ++count[ids[i] + 1];
  }
  Groups g;
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    start[e + 1] = start[e] + count[e + 1];
    if (count[e + 1] > 0) {
      g.expert.push_back(e);
      g.first.push_back(start[e]);
    }
  }
  g.first.push_back(T * k);
  g.pos.resize(T * k);
  for (int64_t i = 0; i < T * k; ++i) g.pos[i] = start[ids[i]]++;  // token order within an expert
  return g;
}

// xq = x's tokens quantized for `mode` (once each: a gathered row is a copy of its token's, and
// quantizes to the same values), gathered: pair i (token i / k) to row pos[i].
void gather_quantized(const float* x, int64_t T, int64_t H, int64_t k, const std::vector<int64_t>& pos, QMode mode,
                      QuantizedXBuffer& xq) {
  QuantizedXBuffer tokens;
  q_quantize_x(x, T, H, mode, tokens);
  const int64_t nb = H / kQBlock;
  xq.resize(T * k, H);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t t = i / k, r = pos[i];
    std::copy_n(tokens.xq.data() + t * H, H, xq.xq.data() + r * H);
    std::copy_n(tokens.dx.data() + t * nb, nb, xq.dx.data() + r * nb);
    std::copy_n(tokens.sq.data() + t * nb, nb, xq.sq.data() + r * nb);
    std::copy_n(tokens.cx.data() + t * nb, nb, xq.cx.data() + r * nb);
  }
}

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Until `counter` reaches `target` (items claimed earlier, being run by other threads).
inline void wait_for(const std::atomic<int64_t>& counter, int64_t target) {
  for (int spins = 0; counter.load(std::memory_order_acquire) < target; ++spins) {
    if (spins < 256) {
      pause();
    } else {
      std::this_thread::yield();  // a thread of ours may have lost its core to another process
    }
  }
}

}  // namespace

void moe_experts(const MoeExperts& L, const float* x, int64_t T, const int64_t* ids, const float* weights, int64_t k,
                 float* y) {
  const int64_t H = L.hidden, I = L.inter, Hp = round_up(H, kPanel);
  require(H > 0 && I > 0 && L.num_experts > 0 && k > 0, "empty shape");
  require(I % (L.kind == MoeWeights::kFloat32 ? kPanel : kPairPanel) == 0,
          "the intermediate width " + std::to_string(I) + " must be a multiple of 64 (float32) or 32");
  if (L.kind == MoeWeights::kQuant) {
    require(H % q_block_k(L.formats[0]) == 0 && I % q_block_k(L.formats[1]) == 0,
            "H and I must be multiples of their products' block k");
  }
  if (T == 0) return;
  const Groups g = group_by_expert(ids, T, k, L.num_experts);
  const int64_t R = T * k, routed = static_cast<int64_t>(g.expert.size());
  std::vector<float> xg(R * H), act(R * I), out(R * Hp);
  for (int64_t i = 0; i < R; ++i) std::copy_n(x + (i / k) * H, H, xg.data() + g.pos[i] * H);
  // The int8 modes' quantized rows, made once per layer rather than by each column slice's
  // product: x's tokens, gathered (before the region), and in kInt8Block the activations, each
  // slice's blocks by the item that computes them (kInt8Row needs whole rows: the down product
  // quantizes its own).
  const bool int8 = L.kind == MoeWeights::kQuant && q_reads_int8(L.formats[0], L.mode);
  const bool int8_act = L.kind == MoeWeights::kQuant && L.mode == QMode::kInt8Block && q_reads_int8(L.formats[1], L.mode);
  QuantizedXBuffer xgq, actq;
  if (int8) gather_quantized(x, T, H, k, g.pos, L.mode, xgq);
  if (int8_act) actq.resize(R, I);

  const int64_t w1 = slice_width(I, routed, false), w2 = slice_width(Hp, routed, true);
  const int64_t s1 = (I + w1 - 1) / w1, s2 = Hp / w2;
  const int64_t n1 = routed * s1, n2 = routed * s2, n3 = (T + kTokenRun - 1) / kTokenRun;
  std::atomic<int64_t> next{0}, down_done{0};
  std::unique_ptr<std::atomic<int64_t>[]> up_done(new std::atomic<int64_t>[routed]);
  for (int64_t i = 0; i < routed; ++i) up_done[i].store(0);
  std::mutex error_lock;
  std::exception_ptr error;

  auto run_item = [&](int64_t u) {
    if (u < n1) {  // gate and up columns [c0, c0 + n) of routed expert i, then silu(gate) * up
      const int64_t i = u / s1, c0 = (u % s1) * w1, n = std::min(w1, I - c0);
      const int64_t M = g.first[i + 1] - g.first[i];
      const uint8_t* w = L.arena + L.offsets[2 * g.expert[i]];
      std::vector<float> gu(M * 2 * n);  // row r: the gate columns, then the up columns
      const float* rows = xg.data() + g.first[i] * H;
      const QuantizedX rows_q = int8 ? xgq.view().from_row(g.first[i], H) : QuantizedX{};
      slice_product(L, 0, w, H, rows, int8 ? &rows_q : nullptr, M, c0, n, gu.data(), 2 * n);
      slice_product(L, 0, w, H, rows, int8 ? &rows_q : nullptr, M, I + c0, n, gu.data() + n, 2 * n);
      for (int64_t r = g.first[i]; r < g.first[i + 1]; ++r) {
        float* a = act.data() + r * I + c0;
        silu_mul_rows<float>(gu.data() + (r - g.first[i]) * 2 * n, 1, n, 2 * n, a);
        if (int8_act) {
          const int64_t b0 = r * (I / kQBlock) + c0 / kQBlock;
          q_quantize_blocks(a, n, actq.xq.data() + r * I + c0, actq.dx.data() + b0, actq.sq.data() + b0,
                            actq.cx.data() + b0);
        }
      }
    } else if (u < n1 + n2) {  // down columns [c0, c0 + 64) of routed expert i
      const int64_t v = u - n1, i = v / s2, c0 = (v % s2) * w2;
      wait_for(up_done[i], s1);
      const int64_t M = g.first[i + 1] - g.first[i];
      const uint8_t* w = L.arena + L.offsets[2 * g.expert[i] + 1];
      const QuantizedX act_q = int8_act ? actq.view().from_row(g.first[i], I) : QuantizedX{};
      slice_product(L, 1, w, I, act.data() + g.first[i] * I, int8_act ? &act_q : nullptr, M, c0, w2,
                    out.data() + g.first[i] * Hp + c0, Hp);
    } else {  // tokens [t0, t1): y[t] = sum over j of w[t][j] * out[pos(t, j)], in j's order
      wait_for(down_done, n2);
      const int64_t t0 = (u - n1 - n2) * kTokenRun, t1 = std::min(T, t0 + kTokenRun);
      for (int64_t t = t0; t < t1; ++t) {
        float* yt = y + t * H;
        std::fill_n(yt, H, 0.0f);
        for (int64_t j = 0; j < k; ++j) {
          const float wj = weights[t * k + j];
          const float* o = out.data() + g.pos[t * k + j] * Hp;
          for (int64_t c = 0; c < H; ++c) yt[c] += o[c] * wj;
        }
      }
    }
  };
  // Each thread claims items in order until none are left. An item's counter is advanced even
  // when it fails, so no thread waits forever; the first error is rethrown after the region.
  parallel_for(0, std::max(1, num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t u = next.fetch_add(1); u < n1 + n2 + n3; u = next.fetch_add(1)) {
      try {
        run_item(u);
      } catch (...) {
        std::lock_guard<std::mutex> hold(error_lock);
        if (!error) error = std::current_exception();
      }
      if (u < n1) {
        up_done[u / s1].fetch_add(1, std::memory_order_release);
      } else if (u < n1 + n2) {
        down_done.fetch_add(1, std::memory_order_release);
      }
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace radixlm
