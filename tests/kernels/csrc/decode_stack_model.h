// The model test_decode_stack.cpp runs: random layers packed for DecodeStack (kernels/
// decode_stack.h) with the values they hold, KV pools, decode batches over scattered slots, and a
// float64 reference of the layers' math over those same values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "driver_util.h"
#include "kernels/decode_stack.h"

namespace decode_model {

using driver::Rng;
using radixlm::DType;

struct Dims {
  int64_t hidden, heads, kv_heads, head_dim, inter;
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

enum class WeightType : int { kFloat32, kBFloat16, kQ8_0, kQ4_1 };
inline const char* type_name(WeightType t) {
  return t == WeightType::kFloat32 ? "float32" : t == WeightType::kBFloat16 ? "bf16" : t == WeightType::kQ8_0 ? "q8_0" : "q4_1";
}

struct Options {
  radixlm::Bf16Path bf16_path;
  radixlm::QMode quant_mode;
  bool flash = false;  // attention may take the flash kernels (DecodeStack::flash_attention)
};
// What of the options weights of `type` use: the bf16 GEMM path, or the quantized mode.
inline std::string options_name(WeightType type, const Options& o) {
  const char* paths[] = {"emulated", "avx512bf16", "amx"};
  const char* modes[] = {"weight-only", "int8", "int8_row"};
  if (type == WeightType::kFloat32) return "";
  if (type == WeightType::kBFloat16) return std::string(" (") + paths[static_cast<int>(o.bf16_path)] + ")";
  return std::string(" (") + modes[static_cast<int>(o.quant_mode)] + ")";
}

// One linear layer: W [K][N] as the kernel's weights hold it (bfloat16-rounded or dequantized),
// and its packed bytes.
struct Linear {
  int64_t K = 0, N = 0;
  WeightType type = WeightType::kFloat32;
  std::vector<double> W;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> quant;

  static Linear from_values(WeightType type, const std::vector<float>& values, int64_t K, int64_t N) {
    Linear l{K, N, type};
    l.W.assign(values.begin(), values.end());
    if (type == WeightType::kFloat32) {
      l.f32 = driver::pack_panels(values, K, N);
    } else {
      l.bf16 = driver::pack_pairs(values, K, N);
      for (double& w : l.W) w = driver::round_bf16(static_cast<float>(w));
    }
    return l;
  }

  static Linear random(WeightType type, int64_t K, int64_t N, Rng& rng) {
    if (type == WeightType::kFloat32 || type == WeightType::kBFloat16) {
      std::vector<float> values(K * N);
      for (float& v : values) v = rng.uniform() * 0.1f;
      return from_values(type, values, K, N);
    }
    const driver::QuantFormat& fmt = driver::kQuantFormats[type == WeightType::kQ8_0 ? 0 : 2];
    const int64_t groups = driver::round_up(N, 64) / 16, nb = K / 32;
    Linear l{K, N, type};
    // q8_0 values within +-24 of the zero point (weights of ~0.05, as the float ones)
    l.quant = driver::make_quant(fmt, groups, nb, rng, [&]() -> uint8_t {
      return static_cast<uint8_t>(type == WeightType::kQ8_0 ? 104 + rng.below(49) : rng.next());
    }, N);
    const std::vector<float> Wt = driver::decode_quant(fmt, l.quant, groups, nb);  // [Np][K]
    l.W.resize(K * N);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < N; ++n) l.W[k * N + n] = Wt[n * K + k];
    }
    return l;
  }

  radixlm::PackedWeight view() const {
    switch (type) {
      case WeightType::kFloat32: return {radixlm::WeightKind::kFloat32, f32.data(), driver::round_up(N, 64) / 64};
      case WeightType::kBFloat16: return {radixlm::WeightKind::kBFloat16, bf16.data(), driver::round_up(N, 64) / 32};
      default:
        return {radixlm::WeightKind::kQuant, quant.data(), driver::round_up(N, 64) / 16,
                type == WeightType::kQ8_0 ? radixlm::QFormat::kQ8_0 : radixlm::QFormat::kQ4_1};
    }
  }

  // Rows [k0, k0 + k) and columns cols of W, as float32 weights (values of a float32 layer).
  Linear slice(int64_t k0, int64_t k, const std::vector<int64_t>& cols) const {
    std::vector<float> v(k * cols.size());
    for (int64_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < cols.size(); ++j) v[i * cols.size() + j] = static_cast<float>(W[(k0 + i) * N + cols[j]]);
    }
    return from_values(WeightType::kFloat32, v, k, static_cast<int64_t>(cols.size()));
  }
};

// One layer's KV pool buffers [slots][kv_heads * head_dim], float32 or bfloat16.
struct Pool {
  DType dtype;
  int64_t slots, width;
  std::vector<float> kf, vf;
  std::vector<uint16_t> kh, vh;

  double k(int64_t i) const { return dtype == DType::kFloat32 ? kf[i] : driver::from_bf16(kh[i]); }
  double v(int64_t i) const { return dtype == DType::kFloat32 ? vf[i] : driver::from_bf16(vh[i]); }
  radixlm::KvBuffers view(int64_t kv_heads, int64_t head_dim) {
    void* kp = dtype == DType::kFloat32 ? static_cast<void*>(kf.data()) : static_cast<void*>(kh.data());
    void* vp = dtype == DType::kFloat32 ? static_cast<void*>(vf.data()) : static_cast<void*>(vh.data());
    return radixlm::KvBuffers{kp, vp, slots, kv_heads, head_dim, dtype};
  }
  // The same bits as `other` in every slot but `skip`.
  bool same_except(const Pool& other, const std::vector<int64_t>& skip) const {
    for (int64_t s = 0; s < slots; ++s) {
      if (std::find(skip.begin(), skip.end(), s) != skip.end()) continue;
      for (int64_t i = s * width; i < (s + 1) * width; ++i) {
        if (k(i) != other.k(i) || v(i) != other.v(i)) return false;
      }
    }
    return true;
  }
};

struct Layer {
  int64_t kv_heads = 0, head_dim = 0;
  Linear qkv, o, gate_up, down;
  std::vector<float> qkv_bias, o_bias, q_norm, k_norm, attn_norm, ffn_norm;  // empty: none

  radixlm::DecodeLayer view(Pool& pool) const {
    auto p = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
    radixlm::DecodeLayer l;
    l.qkv = qkv.view(), l.o = o.view(), l.gate_up = gate_up.view(), l.down = down.view();
    l.qkv_bias = p(qkv_bias), l.o_bias = p(o_bias), l.q_norm = p(q_norm), l.k_norm = p(k_norm);
    l.attn_norm = p(attn_norm), l.ffn_norm = p(ffn_norm);
    l.kv = pool.view(kv_heads, head_dim);
    return l;
  }
};

constexpr int64_t kSlots = 400;  // of each pool; slot 0 never used (the pool's dummy)

struct Model {
  Dims dims;
  std::vector<Layer> layers;
  int64_t kv_head0 = 0;  // of a shard: its first KV head in the whole model

  static Model make(const Dims& d, int64_t num_layers, WeightType type, uint64_t seed) {
    Rng rng{seed};
    Model m{d};
    auto vec = [&](int64_t n, float base, float spread) {
      std::vector<float> v(n);
      for (float& x : v) x = base + spread * rng.uniform();
      return v;
    };
    const bool quantized = type == WeightType::kQ8_0 || type == WeightType::kQ4_1;
    for (int64_t l = 0; l < num_layers; ++l) {
      Layer L;
      L.qkv = Linear::random(type, d.hidden, d.qkv_width(), rng);
      L.o = Linear::random(type, d.heads * d.head_dim, d.hidden, rng);
      L.gate_up = Linear::random(type, d.hidden, 2 * d.inter, rng);
      L.down = Linear::random(type, d.inter, d.hidden, rng);
      L.head_dim = d.head_dim, L.kv_heads = d.kv_heads;
      // float layers: biases and Qwen3's q/k norms, norm weights folded (none); quantized: the
      // norms carry their weights
      if (!quantized) {
        L.qkv_bias = vec(driver::round_up(d.qkv_width(), 64), 0.0f, 0.1f);
        L.o_bias = vec(driver::round_up(d.hidden, 64), 0.0f, 0.1f);
        L.q_norm = vec(d.head_dim, 1.0f, 0.2f);
        L.k_norm = vec(d.head_dim, 1.0f, 0.2f);
      } else {
        L.attn_norm = vec(d.hidden, 1.0f, 0.2f);
        L.ffn_norm = vec(d.hidden, 1.0f, 0.2f);
      }
      m.layers.push_back(L);
    }
    return m;
  }

  radixlm::DecodeShape shape() const {
    return {dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.inter, 1e-6f,
            static_cast<float>(1.0 / std::sqrt(static_cast<double>(dims.head_dim)))};
  }

  // Every pool slot's K/V, bfloat16-exact, a function of (layer, slot, KV head of the whole
  // model, dim): a shard's pools hold its heads' part of the whole model's.
  std::vector<Pool> make_pools(DType dtype) const {
    std::vector<Pool> pools;
    const int64_t width = dims.kv_heads * dims.head_dim;
    for (size_t l = 0; l < layers.size(); ++l) {
      Pool p{dtype, kSlots, width};
      std::vector<float> k(kSlots * width), v(kSlots * width);
      for (int64_t s = 0; s < kSlots; ++s) {
        for (int64_t h = 0; h < dims.kv_heads; ++h) {
          Rng rng{(l * 1000003 + s) * 64 + kv_head0 + h};
          for (int64_t d = 0; d < dims.head_dim; ++d) {
            k[(s * dims.kv_heads + h) * dims.head_dim + d] = rng.bf16_exact(1.0f);
            v[(s * dims.kv_heads + h) * dims.head_dim + d] = rng.bf16_exact(1.0f);
          }
        }
      }
      if (dtype == DType::kFloat32) {
        p.kf = k, p.vf = v;
      } else {
        for (float x : k) p.kh.push_back(driver::to_bf16(x));
        for (float x : v) p.vh.push_back(driver::to_bf16(x));
      }
      pools.push_back(p);
    }
    return pools;
  }

  // Rank r of `ranks` of a float32 model: its query and KV heads, its MLP columns; o_proj's bias
  // on rank 0 only (the ranks' partial sums are added).
  Model shard(int64_t r, int64_t ranks) const {
    const int64_t D = dims.head_dim, hq = dims.heads / ranks, hkv = dims.kv_heads / ranks, inter = dims.inter / ranks;
    Model m{Dims{dims.hidden, hq, hkv, D, inter}};
    m.kv_head0 = r * hkv;
    std::vector<int64_t> qkv_cols, all_hidden, gu_cols;
    for (int64_t c = 0; c < hq * D; ++c) qkv_cols.push_back(r * hq * D + c);
    for (int64_t part = 0; part < 2; ++part) {  // k, then v
      for (int64_t c = 0; c < hkv * D; ++c) qkv_cols.push_back((dims.heads + part * dims.kv_heads + r * hkv) * D + c);
    }
    for (int64_t c = 0; c < dims.hidden; ++c) all_hidden.push_back(c);
    for (int64_t part = 0; part < 2; ++part) {  // gate, then up
      for (int64_t c = 0; c < inter; ++c) gu_cols.push_back(part * dims.inter + r * inter + c);
    }
    for (const Layer& L : layers) {
      Layer S = L;
      S.qkv = L.qkv.slice(0, dims.hidden, qkv_cols);
      S.o = L.o.slice(r * hq * D, hq * D, all_hidden);
      S.gate_up = L.gate_up.slice(0, dims.hidden, gu_cols);
      S.down = L.down.slice(r * inter, inter, all_hidden);
      S.kv_heads = hkv;
      if (!L.qkv_bias.empty()) {
        S.qkv_bias.assign(driver::round_up(m.dims.qkv_width(), 64), 0.0f);
        for (size_t c = 0; c < qkv_cols.size(); ++c) S.qkv_bias[c] = L.qkv_bias[qkv_cols[c]];
      }
      if (r != 0) S.o_bias.clear();
      m.layers.push_back(S);
    }
    return m;
  }
};

// One decode step's operands (the batch's req_to_token is the Batch's).
struct StepInputs {
  int64_t size = 0, num_rows = 0, context = 0;
  const int32_t* req_to_token = nullptr;
  std::vector<float> hidden, rope;
  std::vector<int64_t> slots, rows, seq_lens;

  radixlm::DecodeBatch view() const {
    radixlm::DecodeBatch b;
    b.size = size, b.hidden = hidden.data(), b.rope = rope.data(), b.slots = slots.data();
    b.req_to_token = req_to_token, b.num_rows = num_rows, b.context = context;
    b.rows = rows.data(), b.seq_lens = seq_lens.data();
    return b;
  }
};

// Requests on shuffled rows over scattered slots; request b has first_lens[b] positions at the
// first step (the last one new), one more at each step after; the first `shared` slots of all
// requests are the same (a cached prefix).
struct Batch {
  int64_t num_steps = 0, context = 0, num_rows = 0;
  uint64_t seed = 0;
  std::vector<int32_t> req_to_token;
  std::vector<int64_t> rows, first_lens;

  static Batch make(const Dims&, const std::vector<int64_t>& lens, int64_t shared, int64_t steps, uint64_t seed) {
    Rng rng{seed};
    Batch b{steps, 0, static_cast<int64_t>(lens.size()) + 2, seed};
    for (int64_t n : lens) b.context = std::max(b.context, n + steps - 1);
    std::vector<int32_t> perm(kSlots - 1);
    for (int64_t i = 0; i < kSlots - 1; ++i) perm[i] = static_cast<int32_t>(i + 1);
    for (int64_t i = kSlots - 2; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
    b.req_to_token.assign(b.num_rows * b.context, -1);
    int64_t next = shared;
    for (size_t r = 0; r < lens.size(); ++r) {
      b.rows.push_back(b.num_rows - 1 - static_cast<int64_t>(r));
      b.first_lens.push_back(lens[r]);
      int32_t* slots = b.req_to_token.data() + b.rows[r] * b.context;
      for (int64_t p = 0; p < lens[r] + steps - 1; ++p) slots[p] = perm[p < shared ? p : next++];
    }
    return b;
  }

  StepInputs step(int64_t s, const Dims& d) const {
    StepInputs in;
    in.size = static_cast<int64_t>(rows.size()), in.num_rows = num_rows, in.context = context;
    in.req_to_token = req_to_token.data();
    Rng rng{seed * 100 + static_cast<uint64_t>(s)};
    for (int64_t b = 0; b < in.size; ++b) {
      const int64_t pos = first_lens[b] + s - 1;
      in.rows.push_back(rows[b]);
      in.seq_lens.push_back(pos + 1);
      in.slots.push_back(req_to_token[rows[b] * context + pos]);
      for (int64_t i = 0; i < d.hidden; ++i) in.hidden.push_back(rng.uniform());
      for (int64_t i = 0; i < d.head_dim / 2; ++i) {
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * i / d.head_dim);
        in.rope.push_back(static_cast<float>(std::cos(angle)));
        in.rope.push_back(static_cast<float>(std::sin(angle)));
      }
    }
    return in;
  }

  std::vector<int64_t> new_slots() const {
    std::vector<int64_t> out;
    for (size_t b = 0; b < rows.size(); ++b) {
      for (int64_t s = 0; s < num_steps; ++s) out.push_back(req_to_token[rows[b] * context + first_lens[b] + s - 1]);
    }
    return out;
  }
};

// The largest |got - want| over the largest |want|.
inline double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    mag = std::max(mag, std::fabs(want[i]));
  }
  return err / mag;
}

// The layers' math in float64 over the model's values, on its own copy of the pools.
class Reference {
 public:
  Reference(const Model& model, const std::vector<Pool>& pools) : m_(model) {
    for (const Pool& p : pools) {
      std::vector<double> k(p.slots * p.width), v(p.slots * p.width);
      for (int64_t i = 0; i < p.slots * p.width; ++i) k[i] = p.k(i), v[i] = p.v(i);
      k_.push_back(k), v_.push_back(v);
    }
  }

  // The residual [B][hidden] after the step; its new K/V (rounded as a pool of kv stores them)
  // into this reference's pools. With `kernel`, the pools a kernel's step wrote: their new K/V are
  // checked (kv_errors) and, over a bfloat16 pool, taken as this step's (where the kernel's float
  // value and this one fall on two sides of a rounding, an ulp apart: the attention after is then
  // checked on the same keys and values).
  std::vector<double> step(const StepInputs& in, DType kv, const std::vector<Pool>* kernel = nullptr) {
    kv_errors.clear();
    const Dims& d = m_.dims;
    const int64_t B = in.size, H = d.hidden, D = d.head_dim, Hq = d.heads, Hkv = d.kv_heads;
    std::vector<double> res(in.hidden.begin(), in.hidden.end());
    for (size_t l = 0; l < m_.layers.size(); ++l) {
      const Layer& L = m_.layers[l];
      std::vector<double> x = norm_rows(res, B, H, L.attn_norm);
      std::vector<double> qkv = matmul(x, B, L.qkv, L.qkv_bias);
      std::vector<double> attn(B * Hq * D, 0.0);
      for (int64_t b = 0; b < B; ++b) {
        double* q = qkv.data() + b * d.qkv_width();
        for (int64_t h = 0; h < Hq + Hkv; ++h) {
          double* head = q + h * D;
          const std::vector<float>& w = h < Hq ? L.q_norm : L.k_norm;
          if (!w.empty()) norm(head, D, w.data(), head);
          for (int64_t i = 0; i < D / 2; ++i) {
            const double a = head[2 * i], c = head[2 * i + 1], cs = in.rope[(b * D / 2 + i) * 2], sn = in.rope[(b * D / 2 + i) * 2 + 1];
            head[2 * i] = a * cs - c * sn;
            head[2 * i + 1] = a * sn + c * cs;
          }
        }
        const int64_t slot = in.slots[b], W = Hkv * D;
        for (int64_t i = 0; i < W; ++i) {
          k_[l][slot * W + i] = stored(q[Hq * D + i], kv);
          v_[l][slot * W + i] = stored(q[(Hq + Hkv) * D + i], kv);
        }
      }
      if (kernel) kv_errors.push_back(adopt(l, (*kernel)[l], in));
      for (int64_t b = 0; b < B; ++b) attend(l, in, b, qkv.data() + b * d.qkv_width(), attn.data() + b * Hq * D);
      add(res, matmul(attn, B, L.o, L.o_bias));
      x = norm_rows(res, B, H, L.ffn_norm);
      const std::vector<double> gu = matmul(x, B, L.gate_up, {});
      std::vector<double> act(B * d.inter);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < d.inter; ++i) {
          const double g = gu[b * 2 * d.inter + i], u = gu[b * 2 * d.inter + d.inter + i];
          act[b * d.inter + i] = g / (1.0 + std::exp(-g)) * u;
        }
      }
      add(res, matmul(act, B, L.down, {}));
    }
    return res;
  }

  // Per layer of the last step with a kernel's pools: the largest error of their new K/V over
  // the largest magnitude, beyond one bfloat16 rounding (2^-7 relative) over a bfloat16 pool.
  std::vector<double> kv_errors;

 private:
  double adopt(size_t l, const Pool& got, const StepInputs& in) {
    const double ulp = got.dtype == DType::kBFloat16 ? 0x1p-7 : 0.0;
    double err = 0.0, mag = 0.0;
    for (int64_t b = 0; b < in.size; ++b) {
      for (int64_t i = in.slots[b] * got.width; i < (in.slots[b] + 1) * got.width; ++i) {
        err = std::max({err, std::fabs(got.k(i) - k_[l][i]) - ulp * std::fabs(k_[l][i]),
                        std::fabs(got.v(i) - v_[l][i]) - ulp * std::fabs(v_[l][i])});
        mag = std::max({mag, std::fabs(k_[l][i]), std::fabs(v_[l][i])});
        if (got.dtype == DType::kBFloat16) k_[l][i] = got.k(i), v_[l][i] = got.v(i);
      }
    }
    return std::max(err, 0.0) / mag;
  }

  static double stored(double x, DType kv) {
    return kv == DType::kFloat32 ? x : driver::round_bf16(static_cast<float>(x));
  }

  void norm(const double* x, int64_t n, const float* w, double* y) const {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * (w ? w[i] : 1.0);
  }

  std::vector<double> norm_rows(const std::vector<double>& x, int64_t B, int64_t n, const std::vector<float>& w) const {
    std::vector<double> y(B * n);
    for (int64_t b = 0; b < B; ++b) norm(x.data() + b * n, n, w.empty() ? nullptr : w.data(), y.data() + b * n);
    return y;
  }

  static std::vector<double> matmul(const std::vector<double>& x, int64_t B, const Linear& w, const std::vector<float>& bias) {
    std::vector<double> y(B * w.N, 0.0);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t n = 0; n < w.N; ++n) {
        double s = bias.empty() ? 0.0 : bias[n];
        for (int64_t k = 0; k < w.K; ++k) s += x[b * w.K + k] * w.W[k * w.N + n];
        y[b * w.N + n] = s;
      }
    }
    return y;
  }

  static void add(std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }

  // out [Hq][D]: request b's new token (q: its rotated q heads) over its positions.
  void attend(size_t l, const StepInputs& in, int64_t b, const double* q, double* out) const {
    const Dims& d = m_.dims;
    const int64_t D = d.head_dim, W = d.kv_heads * D, group = d.heads / d.kv_heads, seq = in.seq_lens[b];
    const int32_t* slots = in.req_to_token + in.rows[b] * in.context;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (int64_t h = 0; h < d.heads; ++h) {
      std::vector<double> s(seq);
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < seq; ++j) {
        const double* k = k_[l].data() + slots[j] * W + (h / group) * D;
        double dot = 0.0;
        for (int64_t i = 0; i < D; ++i) dot += q[h * D + i] * k[i];
        s[j] = dot * scale, mx = std::max(mx, s[j]);
      }
      for (int64_t j = 0; j < seq; ++j) {
        const double w = std::exp(s[j] - mx);
        const double* v = v_[l].data() + slots[j] * W + (h / group) * D;
        sum += w;
        for (int64_t i = 0; i < D; ++i) out[h * D + i] += w * v[i];
      }
      for (int64_t i = 0; i < D; ++i) out[h * D + i] /= sum;
    }
  }

  const Model& m_;
  std::vector<std::vector<double>> k_, v_;
};

}  // namespace decode_model
