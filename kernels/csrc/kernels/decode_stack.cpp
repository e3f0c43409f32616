// DecodeStack (see decode_stack.h): the decoder layers of a decode step in one call.
#include "kernels/decode_stack.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/amx_attention.h"
#include "kernels/check.h"
#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"
#include "simd/math.h"

namespace radixlm {
namespace {

int64_t padded(int64_t n) { return (n + kPanel - 1) / kPanel * kPanel; }

inline float dot(const float* a, const float* b, int64_t n) {
  simd::Vf acc = simd::vzero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = simd::vfmadd(simd::vload(a + i), simd::vload(b + i), acc);
  float s = simd::vreduce_add(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = x / sqrt(mean(x^2) + eps) (* weight)
inline void rms_norm(const float* x, int64_t n, float eps, const float* weight, float* y) {
  const float inv = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * (weight ? weight[i] : 1.0f);
}

// Rotate interleaved pairs (x[2i], x[2i+1]) by the angle whose (cos, sin) is rope[i].
inline void rotate(float* x, const float* rope, int64_t head_dim) {
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1], c = rope[2 * i], s = rope[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

// y[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up
inline void silu_mul(const float* gate, const float* up, int64_t n, float* y) {
  using namespace simd;
  int64_t i = 0;
  const Vf one = vset1(1.0f);
  for (; i + 16 <= n; i += 16) {
    const Vf g = vload(gate + i);
    const Vf e = exp16(vsub(vzero(), g));
    vstore(y + i, vmul(vdiv(g, vadd(one, e)), vload(up + i)));
  }
  for (; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

template <typename T>
void store_kv(const float* k, const float* v, int64_t slot, int64_t width, const KvBuffers& kv) {
  from_float(k, width, static_cast<T*>(kv.k) + slot * width);
  from_float(v, width, static_cast<T*>(kv.v) + slot * width);
}

// A token's routing (DecodeExperts): ids[0, k) the k most probable experts of softmax(logits)
// (descending; ties: the lower id), weights[0, k) their probabilities (renormalised where `norm`).
// logits [E] is overwritten with the probabilities.
void route(float* logits, int64_t E, int64_t k, bool norm, int64_t* ids, float* weights) {
  const float top = *std::max_element(logits, logits + E);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += logits[e] = std::exp(logits[e] - top);
  for (int64_t e = 0; e < E; ++e) logits[e] /= sum;
  float chosen = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (std::find(ids, ids + j, e) != ids + j) continue;
      if (best < 0 || logits[e] > logits[best]) best = e;
    }
    ids[j] = best;
    weights[j] = logits[best];
    chosen += logits[best];
  }
  if (norm) {
    for (int64_t j = 0; j < k; ++j) weights[j] /= chosen;
  }
}

void check_weight(const PackedWeight& w, int64_t k, int64_t n, const char* name);

// A product's weight: whole, or its parts (quantized, their columns summing to n).
void check_parts(const PackedWeight& whole, const std::vector<WeightPart>& parts, int64_t k, int64_t n,
                 const char* name) {
  if (parts.empty()) return check_weight(whole, k, n, name);
  int64_t columns = 0;
  for (const WeightPart& p : parts) {
    RADIXLM_CHECK(p.weight.kind == WeightKind::kQuant && p.columns > 0, name, "'s parts must be quantized");
    check_weight(p.weight, k, p.columns, name);
    columns += p.columns;
  }
  RADIXLM_CHECK(columns == n, name, "'s parts hold ", columns, " columns, not ", n);
}

// Row stride of a product's output: its padded width, and where it comes in parts room for the
// last part's padding (each part writes its padded columns; the next part overwrites them).
int64_t parts_stride(const std::vector<WeightPart>& parts, int64_t n) {
  return padded(n) + (parts.empty() ? 0 : kPanel);
}

void check_weight(const PackedWeight& w, int64_t k, int64_t n, const char* name) {
  RADIXLM_CHECK(w.data != nullptr && w.units > 0 && w.columns() == padded(n), name, " must hold ", padded(n),
                " packed columns (", n, " padded to a multiple of 64), not ", w.columns());
  RADIXLM_CHECK(w.kind != WeightKind::kQuant || k % q_block_k(w.format) == 0, name, " (quantized) needs K a multiple of ",
                q_block_k(w.format), ", not ", k);
}

}  // namespace

// The step's buffers: the residual stream [B, Hp] (columns past hidden stay 0: the padded
// products' columns), the normed rows [B, hidden], the q/k/v product [B, Qp], q [B, Hq, D], the
// attention [B, Hq, D], the gate/up product [B, Gp] and its activation [B, intermediate]; and
// the rows as paged_attention reads them (attention_entries).
struct DecodeStack::Scratch {
  int64_t Hp, Qp, Gp;
  std::vector<float> residual, xn, qkv, q, attn, gu, act;
  std::vector<int64_t> rows, seq_lens, extend_lens, starts;  // one per entry
  // sparse layers: the router's logits [B, E], each token's experts and weights [B, top_k], the
  // experts' output [B, hidden]
  std::vector<float> logits, expert_weights, moe_out;
  std::vector<int64_t> expert_ids;
};

namespace {

// The batch's rows as paged_attention's entries: a run of rows of one request at consecutive
// positions (a speculative verify step: its decode row, then its drafts) is one entry of that
// many new tokens, up to kAmxMinTokens - 1 of them, and every other row an entry of its own.
// An entry of fewer than kAmxMinTokens new tokens is one work unit of the vector kernel, whose
// keys are read once for all its rows, and each row's output is, to the bit, what the row alone
// gives (the long-extend kernels, which round otherwise, take 16+); as separate entries the rows
// were one unit each, every key read once per row.
void attention_entries(const DecodeBatch& batch, std::vector<int64_t>& rows, std::vector<int64_t>& seq_lens,
                       std::vector<int64_t>& extend_lens, std::vector<int64_t>& starts) {
  rows.clear();
  seq_lens.clear();
  extend_lens.clear();
  starts.clear();
  for (int64_t b = 0; b < batch.size; ++b) {
    const bool follows = !rows.empty() && rows.back() == batch.rows[b] && seq_lens.back() + 1 == batch.seq_lens[b] &&
                         extend_lens.back() < kAmxMinTokens - 1;
    if (follows) {
      seq_lens.back() += 1;
      extend_lens.back() += 1;
    } else {
      rows.push_back(batch.rows[b]);
      seq_lens.push_back(batch.seq_lens[b]);
      extend_lens.push_back(1);
      starts.push_back(b);
    }
  }
}

}  // namespace

DecodeStack::DecodeStack(const DecodeShape& shape) : shape_(shape) {
  RADIXLM_CHECK(shape.num_kv_heads > 0 && shape.num_heads % shape.num_kv_heads == 0,
                "num_heads must be a multiple of num_kv_heads");
  RADIXLM_CHECK(shape.head_dim % 2 == 0, "head_dim must be even (RoPE pairs)");
}

void DecodeStack::add_layer(const DecodeLayer& layer) {
  const DecodeShape& c = shape_;
  check_parts(layer.qkv, layer.qkv_parts, c.hidden, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, "qkv");
  check_weight(layer.o, c.num_heads * c.head_dim, c.hidden, "o");
  if (layer.is_sparse()) {
    const MoeExperts& x = layer.moe.experts;
    RADIXLM_CHECK(layer.moe.router != nullptr && x.arena != nullptr && x.offsets != nullptr && x.hidden == c.hidden &&
                      x.inter > 0 && layer.moe.top_k <= x.num_experts,
                  "a sparse layer needs a router, its experts' arena and offsets, hidden ", c.hidden,
                  " and top_k within 1..num_experts");
  } else {
    check_parts(layer.gate_up, layer.gate_up_parts, c.hidden, 2 * c.intermediate, "gate_up");
    check_weight(layer.down, c.intermediate, c.hidden, "down");
  }
  RADIXLM_CHECK(layer.kv.k != nullptr && layer.kv.v != nullptr && layer.kv.num_kv_heads == c.num_kv_heads &&
                    layer.kv.head_dim == c.head_dim,
                "k_buf / v_buf must be contiguous float32 or bfloat16 [slots, num_kv_heads, head_dim]");
  qkv_ld_ = std::max(qkv_ld_, parts_stride(layer.qkv_parts, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim));
  gate_up_ld_ = std::max(gate_up_ld_, parts_stride(layer.gate_up_parts, 2 * c.intermediate));
  layers_.push_back(layer);
}

// out = x @ w (+ bias) (+ residual): float32 panels through packed_gemm, bfloat16 pair panels
// through bf16_gemm on the stack's path, quant groups through q_gemm in the stack's mode.
void DecodeStack::linear(const PackedWeight& w, const float* x, int64_t M, int64_t K, float* out, int64_t ld_out,
                         const float* residual, int64_t ld_res, const float* bias) const {
  switch (w.kind) {
    case WeightKind::kQuant:
      return q_gemm(x, M, K, static_cast<const uint8_t*>(w.data), w.units, w.format, quant_mode, out, ld_out, residual,
                    ld_res, bias);
    case WeightKind::kBFloat16:
      return bf16_gemm(x, M, K, static_cast<const uint16_t*>(w.data), w.units, out, ld_out, residual, ld_res, bias,
                       bf16_path);
    case WeightKind::kFloat32:
      return packed_gemm(x, M, K, static_cast<const float*>(w.data), w.units, out, ld_out, residual, ld_res, bias);
  }
}

// out = x @ whole (+ bias), or x @ each part into its columns (+ bias over them all).
void DecodeStack::linear_parts(const PackedWeight& whole, const std::vector<WeightPart>& parts, const float* x,
                               int64_t M, int64_t K, float* out, int64_t ld_out, const float* bias) const {
  if (parts.empty()) return linear(whole, x, M, K, out, ld_out, nullptr, 0, bias);
  int64_t c0 = 0;
  for (const WeightPart& p : parts) {
    linear(p.weight, x, M, K, out + c0, ld_out, nullptr, 0, nullptr);
    c0 += p.columns;
  }
  if (bias == nullptr) return;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t c = 0; c < c0; ++c) out[m * ld_out + c] += bias[c];
  }
}

// Tensor parallel: a rank's o_proj / down_proj give partial sums; ranks but 0 start them from
// zero instead of the residual (which, past the norm before them, nothing else reads).
template <typename F>
void DecodeStack::reduce_into_residual(Scratch& s, int64_t B, const F& accumulate) const {
  float* res = s.residual.data();
  if (all_reduce.sum && all_reduce.rank != 0) std::memset(res, 0, sizeof(float) * B * s.Hp);
  accumulate();
  if (all_reduce.sum) all_reduce.sum(res, B * s.Hp);
}

// RMSNorm, q/k/v, q/k norms, RoPE, K/V into the pool, attention, o_proj onto the residual.
void DecodeStack::attention_block(const DecodeLayer& L, const DecodeBatch& batch, Scratch& s) const {
  const int64_t B = batch.size, H = shape_.hidden, D = shape_.head_dim, Hq = shape_.num_heads;
  const int64_t Hkv = shape_.num_kv_heads, Hp = s.Hp, Qp = s.Qp;
  const float eps = shape_.rms_eps;
  const bool kv_bf16 = L.kv.dtype == DType::kBFloat16;
  float *res = s.residual.data(), *x = s.xn.data(), *qkv_p = s.qkv.data();
  for (int64_t b = 0; b < B; ++b) rms_norm(res + b * Hp, H, eps, L.attn_norm, x + b * H);
  linear_parts(L.qkv, L.qkv_parts, x, B, H, qkv_p, Qp, L.qkv_bias);
  for (int64_t b = 0; b < B; ++b) {
    float* q = qkv_p + b * Qp;
    float* k = q + Hq * D;
    const float* v = k + Hkv * D;
    for (int64_t h = 0; h < Hq + Hkv; ++h) {
      float* head = q + h * D;
      const float* norm = h < Hq ? L.q_norm : L.k_norm;
      if (norm) rms_norm(head, D, eps, norm, head);
      rotate(head, batch.rope + b * D, D);
    }
    const int64_t slot = batch.slots[b];
    RADIXLM_CHECK(slot > 0 && slot < L.kv.num_slots, "a new token's KV slot is out of range");
    if (kv_bf16) {
      store_kv<uint16_t>(k, v, slot, Hkv * D, L.kv);
    } else {
      store_kv<float>(k, v, slot, Hkv * D, L.kv);
    }
  }
  for (int64_t b = 0; b < B; ++b) std::memcpy(s.q.data() + b * Hq * D, qkv_p + b * Qp, sizeof(float) * Hq * D);
  const AttentionBatch attn_batch{batch.req_to_token,  batch.num_rows,        batch.context,
                                  s.rows.data(),       s.seq_lens.data(),     s.extend_lens.data(),
                                  s.starts.data(),     static_cast<int64_t>(s.rows.size())};
  paged_attention(s.q.data(), s.attn.data(), DType::kFloat32, B, Hq, L.kv, attn_batch, shape_.scale, false,
                  flash_attention);
  reduce_into_residual(s, B, [&] { linear(L.o, s.attn.data(), B, Hq * D, res, Hp, res, Hp, L.o_bias); });
}

// RMSNorm, gate/up, SiLU(gate) * up, down_proj onto the residual.
void DecodeStack::mlp_block(const DecodeLayer& L, int64_t B, Scratch& s) const {
  const int64_t H = shape_.hidden, I = shape_.intermediate, Hp = s.Hp, Gp = s.Gp;
  float *res = s.residual.data(), *x = s.xn.data(), *gu = s.gu.data(), *act = s.act.data();
  for (int64_t b = 0; b < B; ++b) rms_norm(res + b * Hp, H, shape_.rms_eps, L.ffn_norm, x + b * H);
  linear_parts(L.gate_up, L.gate_up_parts, x, B, H, gu, Gp, nullptr);
  for (int64_t b = 0; b < B; ++b) silu_mul(gu + b * Gp, gu + b * Gp + I, I, act + b * I);
  reduce_into_residual(s, B, [&] { linear(L.down, act, B, I, res, Hp, res, Hp, nullptr); });
}

// RMSNorm, the router, top-k, the routed experts (one moe_experts region) onto the residual.
void DecodeStack::experts_block(const DecodeLayer& L, int64_t B, Scratch& s) const {
  const int64_t H = shape_.hidden, Hp = s.Hp, E = L.moe.experts.num_experts, k = L.moe.top_k;
  float *res = s.residual.data(), *x = s.xn.data();
  for (int64_t b = 0; b < B; ++b) rms_norm(res + b * Hp, H, shape_.rms_eps, L.ffn_norm, x + b * H);
  s.logits.resize(B * E);
  s.expert_ids.resize(B * k);
  s.expert_weights.resize(B * k);
  s.moe_out.resize(B * H);
  // the router's E x H products per token: serial at a decode batch of a few tokens (a parallel
  // region costs more than they do), over the threads for larger ones
  parallel_for(0, B, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* logits = s.logits.data() + b * E;
      for (int64_t e = 0; e < E; ++e) logits[e] = dot(x + b * H, L.moe.router + e * H, H);
      route(logits, E, k, L.moe.norm_topk_prob, s.expert_ids.data() + b * k, s.expert_weights.data() + b * k);
    }
  });
  moe_experts(L.moe.experts, x, B, s.expert_ids.data(), s.expert_weights.data(), k, s.moe_out.data());
  reduce_into_residual(s, B, [&] {
    for (int64_t b = 0; b < B; ++b) {
      const float* y = s.moe_out.data() + b * H;
      float* r = res + b * Hp;
      for (int64_t i = 0; i < H; ++i) r[i] += y[i];
    }
  });
}

void DecodeStack::forward(const DecodeBatch& batch, float* out) const {
  const int64_t B = batch.size, H = shape_.hidden, D = shape_.head_dim, Hq = shape_.num_heads;
  for (int64_t b = 0; b < B; ++b) {
    RADIXLM_CHECK(batch.seq_lens[b] >= 1 && batch.seq_lens[b] <= batch.context && batch.rows[b] >= 0 &&
                      batch.rows[b] < batch.num_rows,
                  "a request's row or length is out of range");
  }
  Scratch s;
  s.Hp = padded(H);
  s.Qp = std::max(qkv_ld_, padded((Hq + 2 * shape_.num_kv_heads) * D));
  s.Gp = std::max(gate_up_ld_, padded(2 * shape_.intermediate));
  s.residual.assign(B * s.Hp, 0.0f);
  for (int64_t b = 0; b < B; ++b) std::memcpy(s.residual.data() + b * s.Hp, batch.hidden + b * H, sizeof(float) * H);
  s.xn.resize(B * H);
  s.qkv.resize(B * s.Qp);
  s.q.resize(B * Hq * D);
  s.attn.resize(B * Hq * D);
  s.gu.resize(B * s.Gp);
  s.act.resize(B * shape_.intermediate);
  attention_entries(batch, s.rows, s.seq_lens, s.extend_lens, s.starts);
  RADIXLM_CHECK(!all_reduce.sum || B * s.Hp <= all_reduce.max_floats, "a decode batch of ", B,
                " rows exceeds the all-reduce's slots");
  for (const DecodeLayer& L : layers_) {
    attention_block(L, batch, s);
    if (L.is_sparse()) {
      experts_block(L, B, s);
    } else {
      mlp_block(L, B, s);
    }
  }
  for (int64_t b = 0; b < B; ++b) std::memcpy(out + b * H, s.residual.data() + b * s.Hp, sizeof(float) * H);
}

}  // namespace radixlm
