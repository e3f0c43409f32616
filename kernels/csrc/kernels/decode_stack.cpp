// DecodeStack (see decode_stack.h): the decoder layers of a decode step in one call.
#include "kernels/decode_stack.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/bf16_gemm.h"
#include "kernels/packed_gemm.h"
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
void store_kv(const float* k, const float* v, int64_t slot, int64_t width, torch::Tensor& k_buf, torch::Tensor& v_buf) {
  from_float(k, width, static_cast<T*>(k_buf.data_ptr()) + slot * width);
  from_float(v, width, static_cast<T*>(v_buf.data_ptr()) + slot * width);
}

void check_packed(const torch::Tensor& w, int64_t k, int64_t n, const char* name) {
  if (w.scalar_type() == at::kByte) {
    TORCH_CHECK(w.dim() == 3 && w.size(0) * kQGroup == padded(n) && w.size(1) * kQBlock == k && w.is_contiguous(),
                name, " (quantized) must be quant groups [", padded(n) / kQGroup, ", ", k / kQBlock, ", block bytes]");
    q_format_of(w.size(2));
  } else if (w.scalar_type() == at::kBFloat16) {
    TORCH_CHECK(w.dim() == 4 && w.size(0) * kVnniPanel == padded(n) && w.size(1) * 2 == vnni_k(k) &&
                    w.size(2) == kVnniPanel && w.size(3) == 2 && w.is_contiguous(),
                name, " (bfloat16) must be VNNI panels [", padded(n) / kVnniPanel, ", ", vnni_k(k) / 2, ", 32, 2]");
  } else {
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 3 && w.size(1) == k && w.size(2) == kPanel &&
                    w.size(0) * kPanel == padded(n) && w.is_contiguous(),
                name, " (float32) must be packed [", padded(n) / kPanel, ", ", k, ", 64]");
  }
}

torch::Tensor optional_vector(const c10::optional<torch::Tensor>& t, int64_t n, const char* name) {
  if (!t.has_value() || !t->defined()) return torch::Tensor();
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n, name, " must be float32 [", n, "]");
  return *t;
}

const float* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

}  // namespace

// out = x @ w (+ bias) (+ residual): float32 panels through packed_gemm, bfloat16 VNNI panels
// through bf16_gemm on the stack's path.
void DecodeStack::linear(const torch::Tensor& w, const float* x, int64_t M, int64_t K, float* out, int64_t ld_out,
                         const float* residual, int64_t ld_res, const torch::Tensor& bias) const {
  if (w.scalar_type() == at::kByte) {
    q_gemm(x, M, K, w.data_ptr<uint8_t>(), w.size(0), q_format_of(w.size(2)), quant_mode_, out, ld_out, residual, ld_res,
           data_or_null(bias));
  } else if (w.scalar_type() == at::kBFloat16) {
    bf16_gemm(x, M, K, static_cast<const uint16_t*>(w.data_ptr()), w.size(0), out, ld_out, residual, ld_res,
              data_or_null(bias), bf16_path_);
  } else {
    packed_gemm(x, M, K, w.data_ptr<float>(), w.size(0), out, ld_out, residual, ld_res, data_or_null(bias));
  }
}

void DecodeStack::set_bf16_path(int64_t path) { bf16_path_ = bf16_path(static_cast<int>(path)); }

int64_t DecodeStack::get_bf16_path() const { return static_cast<int64_t>(bf16_path_); }

void DecodeStack::set_quant_mode(int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= static_cast<int64_t>(QMode::kInt8Row), "unknown quantized mode ", mode);
  quant_mode_ = static_cast<QMode>(mode);
}

int64_t DecodeStack::get_quant_mode() const { return static_cast<int64_t>(quant_mode_); }

void DecodeStack::set_tensor_parallel(std::shared_ptr<ShmAllReduce> comm) { tp_ = std::move(comm); }

DecodeStack::DecodeStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                         int64_t intermediate, double rms_eps, double scale)
    : hidden_(hidden), num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim),
      intermediate_(intermediate), eps_(static_cast<float>(rms_eps)), scale_(static_cast<float>(scale)),
      bf16_path_(bf16_path()) {
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even (RoPE pairs)");
}

void DecodeStack::add_layer(torch::Tensor qkv, c10::optional<torch::Tensor> qkv_bias, torch::Tensor o,
                            c10::optional<torch::Tensor> o_bias, torch::Tensor gate_up, torch::Tensor down,
                            c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm,
                            torch::Tensor k_buf, torch::Tensor v_buf, c10::optional<torch::Tensor> attn_norm,
                            c10::optional<torch::Tensor> ffn_norm) {
  const int64_t qkv_width = (num_heads_ + 2 * num_kv_heads_) * head_dim_;
  check_packed(qkv, hidden_, qkv_width, "qkv");
  check_packed(o, num_heads_ * head_dim_, hidden_, "o");
  check_packed(gate_up, hidden_, 2 * intermediate_, "gate_up");
  check_packed(down, intermediate_, hidden_, "down");
  TORCH_CHECK(k_buf.dim() == 3 && k_buf.size(1) == num_kv_heads_ && k_buf.size(2) == head_dim_ && k_buf.is_contiguous() &&
                  v_buf.sizes() == k_buf.sizes() && v_buf.is_contiguous() && v_buf.scalar_type() == k_buf.scalar_type() &&
                  (k_buf.scalar_type() == at::kFloat || k_buf.scalar_type() == at::kBFloat16),
              "k_buf / v_buf must be contiguous float32 or bfloat16 [slots, num_kv_heads, head_dim]");
  layers_.push_back(Layer{qkv, optional_vector(qkv_bias, padded(qkv_width), "qkv_bias"), o,
                          optional_vector(o_bias, padded(hidden_), "o_bias"), gate_up, down,
                          optional_vector(q_norm, head_dim_, "q_norm"), optional_vector(k_norm, head_dim_, "k_norm"),
                          k_buf, v_buf, optional_vector(attn_norm, hidden_, "attn_norm"),
                          optional_vector(ffn_norm, hidden_, "ffn_norm")});
}

torch::Tensor DecodeStack::forward(const torch::Tensor& hidden, const torch::Tensor& rope, const torch::Tensor& slots,
                                   const torch::Tensor& req_to_token, const torch::Tensor& rows,
                                   const torch::Tensor& seq_lens) {
  const int64_t B = hidden.size(0), H = hidden_, D = head_dim_, Hq = num_heads_, Hkv = num_kv_heads_;
  const int64_t I = intermediate_;
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == H && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "hidden must be contiguous float32 [B, hidden]");
  TORCH_CHECK(rope.scalar_type() == at::kFloat && rope.is_contiguous() && rope.numel() == B * D,
              "rope must be contiguous float32 [B, head_dim/2, 2]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == B && rows.scalar_type() == at::kLong && rows.numel() == B &&
                  seq_lens.scalar_type() == at::kLong && seq_lens.numel() == B,
              "slots, rows and seq_lens must be int64 [B]");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.dim() == 2 && req_to_token.is_contiguous(),
              "req_to_token must be contiguous int32 [rows, context]");
  const int64_t context = req_to_token.size(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t* seq = seq_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(seq[b] >= 1 && seq[b] <= context && row[b] >= 0 && row[b] < req_to_token.size(0),
                "a request's row or length is out of range");
  }
  const int64_t Hp = padded(H), qkv_width = (Hq + 2 * Hkv) * D, Qp = padded(qkv_width), Gp = padded(2 * I);
  auto opts = hidden.options();
  torch::Tensor residual = torch::zeros({B, Hp}, opts);
  residual.narrow(1, 0, H).copy_(hidden);
  torch::Tensor xn = torch::empty({B, H}, opts), qkv = torch::empty({B, Qp}, opts);
  torch::Tensor q_all = torch::empty({B, Hq, D}, opts), gu = torch::empty({B, Gp}, opts), act = torch::empty({B, I}, opts);
  float *res = residual.data_ptr<float>(), *x = xn.data_ptr<float>(), *qkv_p = qkv.data_ptr<float>();
  float *q_p = q_all.data_ptr<float>(), *gu_p = gu.data_ptr<float>(), *act_p = act.data_ptr<float>();
  const float* rope_p = rope.data_ptr<float>();
  const torch::Tensor ones = torch::ones({B}, seq_lens.options()), starts = torch::arange(B, seq_lens.options());
  TORCH_CHECK(!tp_ || B * Hp <= tp_->max_floats(), "a decode batch of ", B, " rows exceeds the all-reduce's slots");
  // tensor parallel: a rank's o_proj / down_proj give partial sums; ranks but 0 start them from
  // zero instead of the residual (which, past the norm before them, nothing else reads)
  auto reduce_into_residual = [&](auto&& accumulate) {
    if (tp_ && tp_->rank() != 0) std::memset(res, 0, sizeof(float) * B * Hp);
    accumulate();
    if (tp_) tp_->all_reduce(res, B * Hp);
  };

  for (Layer& L : layers_) {
    const bool kv_bf16 = L.k_buf.scalar_type() == at::kBFloat16;
    const int64_t num_slots = L.k_buf.size(0);
    for (int64_t b = 0; b < B; ++b) rms_norm(res + b * Hp, H, eps_, data_or_null(L.attn_norm), x + b * H);
    linear(L.qkv, x, B, H, qkv_p, Qp, nullptr, 0, L.qkv_bias);
    for (int64_t b = 0; b < B; ++b) {
      float* q = qkv_p + b * Qp;
      float* k = q + Hq * D;
      const float* v = k + Hkv * D;
      for (int64_t h = 0; h < Hq + Hkv; ++h) {
        float* head = q + h * D;
        const torch::Tensor& norm = h < Hq ? L.q_norm : L.k_norm;
        if (norm.defined()) rms_norm(head, D, eps_, norm.data_ptr<float>(), head);
        rotate(head, rope_p + b * D, D);
      }
      TORCH_CHECK(slot[b] > 0 && slot[b] < num_slots, "a new token's KV slot is out of range");
      if (kv_bf16) {
        store_kv<uint16_t>(k, v, slot[b], Hkv * D, L.k_buf, L.v_buf);
      } else {
        store_kv<float>(k, v, slot[b], Hkv * D, L.k_buf, L.v_buf);
      }
    }
    for (int64_t b = 0; b < B; ++b) std::memcpy(q_p + b * Hq * D, qkv_p + b * Qp, sizeof(float) * Hq * D);
    // the vector kernels' cascade over a shared prefix: float32 FMAs over a float32 pool (every
    // level), vdpbf16ps over a bf16 one (as the attention backend's `vnni`)
    const torch::Tensor attn =
        paged_attention(q_all, L.k_buf, L.v_buf, req_to_token, rows, seq_lens, ones, starts, scale_, false,
                        !kv_bf16 || bf16_path_ == Bf16Path::kAvx512Bf16);
    const float* attn_p = attn.data_ptr<float>();
    reduce_into_residual([&] { linear(L.o, attn_p, B, Hq * D, res, Hp, res, Hp, L.o_bias); });
    for (int64_t b = 0; b < B; ++b) rms_norm(res + b * Hp, H, eps_, data_or_null(L.ffn_norm), x + b * H);
    linear(L.gate_up, x, B, H, gu_p, Gp, nullptr, 0, torch::Tensor());
    for (int64_t b = 0; b < B; ++b) silu_mul(gu_p + b * Gp, gu_p + b * Gp + I, I, act_p + b * I);
    reduce_into_residual([&] { linear(L.down, act_p, B, I, res, Hp, res, Hp, torch::Tensor()); });
  }
  return residual.narrow(1, 0, H).contiguous();
}

}  // namespace radixlm
