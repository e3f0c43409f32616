// DecodeStack's torch class: its layers' tensors checked and kept alive, their memory handed to
// the torch-free stack (kernels/decode_stack.h) as views.
#include "bindings/torch_layers.h"

#include <ATen/record_function.h>

#include <utility>

#include "kernels/packed_gemm.h"

namespace radixlm::bindings {

namespace {

int64_t padded(int64_t n) { return (n + kPanel - 1) / kPanel * kPanel; }

// The view of a packed weight for a product of K rows and n (unpadded) columns.
PackedWeight packed_weight(const torch::Tensor& w, int64_t k, int64_t n, const char* name) {
  if (w.scalar_type() == at::kByte) {
    TORCH_CHECK(w.dim() == 3, name, " (quantized) must be quant groups [N/16, K/block k, block bytes]");
    const QFormat format = q_format_of(w.size(2));
    const int64_t block_k = q_block_k(format);
    TORCH_CHECK(w.size(0) * kQGroup == padded(n) && w.size(1) * block_k == k && w.is_contiguous(), name,
                " (quantized) must be quant groups [", padded(n) / kQGroup, ", ", k / block_k, ", block bytes]");
    return PackedWeight{WeightKind::kQuant, w.data_ptr(), w.size(0), format};
  }
  if (w.scalar_type() == at::kBFloat16) {
    TORCH_CHECK(w.dim() == 4 && w.size(0) * kPairPanel == padded(n) && w.size(1) * 2 == pair_k(k) &&
                    w.size(2) == kPairPanel && w.size(3) == 2 && w.is_contiguous(),
                name, " (bfloat16) must be pair panels [", padded(n) / kPairPanel, ", ", pair_k(k) / 2, ", 32, 2]");
    return PackedWeight{WeightKind::kBFloat16, w.data_ptr(), w.size(0)};
  }
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 3 && w.size(1) == k && w.size(2) == kPanel &&
                  w.size(0) * kPanel == padded(n) && w.is_contiguous(),
              name, " (float32) must be packed [", padded(n) / kPanel, ", ", k, ", 64]");
  return PackedWeight{WeightKind::kFloat32, w.data_ptr(), w.size(0)};
}

const float* optional_vector(const c10::optional<torch::Tensor>& t, int64_t n, const char* name) {
  if (!t.has_value() || !t->defined()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n, name, " must be float32 [", n, "]");
  return t->data_ptr<float>();
}

}  // namespace

Experts::Experts(torch::Tensor router, torch::Tensor arena, torch::Tensor offsets, int64_t inter, int64_t kind,
                 int64_t gate_up_block_bytes, int64_t down_block_bytes, int64_t mode, int64_t bf16_path, int64_t top_k,
                 bool norm_topk_prob) {
  TORCH_CHECK(router.dim() == 2 && router.scalar_type() == at::kFloat && router.is_contiguous(),
              "router must be contiguous float32 [num_experts, hidden]");
  view.experts = moe_layer(arena, offsets, router.size(1), inter, kind, gate_up_block_bytes, down_block_bytes, mode,
                           bf16_path);
  TORCH_CHECK(router.size(0) == view.experts.num_experts, "router has ", router.size(0), " rows for ",
              view.experts.num_experts, " experts");
  TORCH_CHECK(top_k >= 1 && top_k <= view.experts.num_experts, "top_k must be within 1..", view.experts.num_experts,
              ", not ", top_k);
  view.router = router.data_ptr<float>();
  view.top_k = top_k;
  view.norm_topk_prob = norm_topk_prob;
  kept = {router, arena, offsets};
}

DecodeStack::DecodeStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                         int64_t intermediate, double rms_eps, double scale)
    : core_(DecodeShape{hidden, num_heads, num_kv_heads, head_dim, intermediate, static_cast<float>(rms_eps),
                        static_cast<float>(scale)}) {}

void DecodeStack::add_layer(c10::optional<torch::Tensor> qkv, c10::optional<torch::Tensor> qkv_bias, torch::Tensor o,
                            c10::optional<torch::Tensor> o_bias, c10::optional<torch::Tensor> gate_up,
                            c10::optional<torch::Tensor> down, c10::optional<torch::Tensor> q_norm,
                            c10::optional<torch::Tensor> k_norm, torch::Tensor k_buf, torch::Tensor v_buf,
                            c10::optional<torch::Tensor> attn_norm, c10::optional<torch::Tensor> ffn_norm,
                            const Experts* experts, const std::vector<std::pair<torch::Tensor, int64_t>>& qkv_parts,
                            const std::vector<std::pair<torch::Tensor, int64_t>>& gate_up_parts) {
  const DecodeShape& c = core_.shape();
  const int64_t qkv_width = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  DecodeLayer layer;
  const bool whole_qkv = qkv.has_value() && qkv->defined();
  TORCH_CHECK(whole_qkv == qkv_parts.empty(), "a layer takes either qkv or qkv_parts");
  TORCH_CHECK(gate_up_parts.empty() || experts == nullptr, "a sparse layer has no gate_up_parts");
  if (whole_qkv) layer.qkv = packed_weight(*qkv, c.hidden, qkv_width, "qkv");
  for (const auto& [w, columns] : qkv_parts) {
    layer.qkv_parts.push_back(WeightPart{packed_weight(w, c.hidden, columns, "qkv part"), columns});
    kept_.push_back(w);
  }
  for (const auto& [w, columns] : gate_up_parts) {
    layer.gate_up_parts.push_back(WeightPart{packed_weight(w, c.hidden, columns, "gate_up part"), columns});
    kept_.push_back(w);
  }
  layer.o = packed_weight(o, c.num_heads * c.head_dim, c.hidden, "o");
  const bool dense = (!gate_up_parts.empty() || (gate_up.has_value() && gate_up->defined())) && down.has_value() &&
                     down->defined();
  TORCH_CHECK(dense != (experts != nullptr), "a layer takes either gate_up and down (dense) or experts (sparse)");
  if (dense) {
    if (gate_up_parts.empty()) layer.gate_up = packed_weight(*gate_up, c.hidden, 2 * c.intermediate, "gate_up");
    layer.down = packed_weight(*down, c.intermediate, c.hidden, "down");
  } else {
    layer.moe = experts->view;
  }
  TORCH_CHECK(k_buf.dim() == 3 && k_buf.size(1) == c.num_kv_heads && k_buf.size(2) == c.head_dim && k_buf.is_contiguous() &&
                  v_buf.sizes() == k_buf.sizes() && v_buf.is_contiguous() && v_buf.scalar_type() == k_buf.scalar_type() &&
                  (k_buf.scalar_type() == at::kFloat || k_buf.scalar_type() == at::kBFloat16),
              "k_buf / v_buf must be contiguous float32 or bfloat16 [slots, num_kv_heads, head_dim]");
  layer.kv = KvBuffers{k_buf.data_ptr(), v_buf.data_ptr(), k_buf.size(0), c.num_kv_heads, c.head_dim,
                       k_buf.scalar_type() == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat32};
  layer.qkv_bias = optional_vector(qkv_bias, padded(qkv_width), "qkv_bias");
  layer.o_bias = optional_vector(o_bias, padded(c.hidden), "o_bias");
  layer.q_norm = optional_vector(q_norm, c.head_dim, "q_norm");
  layer.k_norm = optional_vector(k_norm, c.head_dim, "k_norm");
  layer.attn_norm = optional_vector(attn_norm, c.hidden, "attn_norm");
  layer.ffn_norm = optional_vector(ffn_norm, c.hidden, "ffn_norm");
  core_.add_layer(layer);
  for (const auto& t : {o, k_buf, v_buf}) kept_.push_back(t);
  if (experts != nullptr) kept_.insert(kept_.end(), experts->kept.begin(), experts->kept.end());
  for (const auto* t : {&qkv, &gate_up, &down, &qkv_bias, &o_bias, &q_norm, &k_norm, &attn_norm, &ffn_norm}) {
    if (t->has_value() && (*t)->defined()) kept_.push_back(**t);
  }
}

torch::Tensor DecodeStack::forward(const torch::Tensor& hidden, const torch::Tensor& rope, const torch::Tensor& slots,
                                   const torch::Tensor& req_to_token, const torch::Tensor& rows,
                                   const torch::Tensor& seq_lens) {
  RECORD_FUNCTION("radixlm::decode_stack", std::vector<c10::IValue>({hidden}));  // a profiler's name for the step
  const DecodeShape& c = core_.shape();
  const int64_t B = hidden.size(0);
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == c.hidden && hidden.scalar_type() == at::kFloat &&
                  hidden.is_contiguous(),
              "hidden must be contiguous float32 [B, hidden]");
  TORCH_CHECK(rope.scalar_type() == at::kFloat && rope.is_contiguous() && rope.numel() == B * c.head_dim,
              "rope must be contiguous float32 [B, head_dim/2, 2]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == B && rows.scalar_type() == at::kLong && rows.numel() == B &&
                  seq_lens.scalar_type() == at::kLong && seq_lens.numel() == B,
              "slots, rows and seq_lens must be int64 [B]");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.dim() == 2 && req_to_token.is_contiguous(),
              "req_to_token must be contiguous int32 [rows, context]");
  DecodeBatch batch;
  batch.size = B;
  batch.hidden = hidden.data_ptr<float>();
  batch.rope = rope.data_ptr<float>();
  batch.slots = slots.data_ptr<int64_t>();
  batch.req_to_token = req_to_token.data_ptr<int32_t>();
  batch.num_rows = req_to_token.size(0);
  batch.context = req_to_token.size(1);
  batch.rows = rows.data_ptr<int64_t>();
  batch.seq_lens = seq_lens.data_ptr<int64_t>();
  auto out = torch::empty({B, c.hidden}, hidden.options());
  core_.forward(batch, out.data_ptr<float>());
  return out;
}

void DecodeStack::set_bf16_path(int64_t path) { core_.bf16_path = radixlm::bf16_path(static_cast<int>(path)); }

int64_t DecodeStack::get_bf16_path() const { return static_cast<int64_t>(core_.bf16_path); }

void DecodeStack::set_quant_mode(int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= static_cast<int64_t>(QMode::kInt8Row), "unknown quantized mode ", mode);
  core_.quant_mode = static_cast<QMode>(mode);
}

int64_t DecodeStack::get_quant_mode() const { return static_cast<int64_t>(core_.quant_mode); }

void DecodeStack::set_tensor_parallel(std::shared_ptr<ShmAllReduce> comm) {
  tp_ = std::move(comm);
  core_.all_reduce = AllReduce{};
  if (!tp_) return;
  const ShmAllReduce* shm = tp_.get();
  core_.all_reduce = AllReduce{[shm](float* data, int64_t n) { shm->all_reduce(data, n); }, tp_->rank(), tp_->max_floats()};
}

}  // namespace radixlm::bindings
