// paged_attention's torch entry point: the tensors checked, the output allocated in q's dtype,
// the kernel (kernels/paged_attention.h) called on their memory.
#include <initializer_list>

#include "bindings/torch_layers.h"
#include "kernels/paged_attention.h"

namespace radixlm::bindings {

namespace {

DType dtype_of(const torch::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat32; }

}  // namespace

torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                              const torch::Tensor& req_to_token, const torch::Tensor& rows, const torch::Tensor& seq_lens,
                              const torch::Tensor& extend_lens, const torch::Tensor& extend_start, double scale,
                              bool amx, bool flash) {
  TORCH_CHECK(q.dim() == 3 && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) && q.is_contiguous(),
              "q must be contiguous float32 or bfloat16 [T, Hq, D]");
  TORCH_CHECK(k_buf.dim() == 3 && k_buf.is_contiguous() && v_buf.sizes() == k_buf.sizes() && v_buf.is_contiguous() &&
                  v_buf.scalar_type() == k_buf.scalar_type() &&
                  (k_buf.scalar_type() == at::kFloat || k_buf.scalar_type() == at::kBFloat16),
              "k_buf / v_buf must be contiguous float32 or bfloat16 [slots, Hkv, D]");
  TORCH_CHECK(k_buf.size(2) == q.size(2), "head shapes of q and the pool disagree");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.dim() == 2 && req_to_token.is_contiguous(),
              "req_to_token must be contiguous int32 [rows, context]");
  const int64_t B = rows.numel();
  for (const auto* t : {&rows, &seq_lens, &extend_lens, &extend_start}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->numel() == B && t->is_contiguous(), "rows / lengths must be int64 [B]");
  }
  const KvBuffers kv{k_buf.data_ptr(), v_buf.data_ptr(), k_buf.size(0), k_buf.size(1), k_buf.size(2), dtype_of(k_buf)};
  const AttentionBatch batch{req_to_token.data_ptr<int32_t>(), req_to_token.size(0),       req_to_token.size(1),
                             rows.data_ptr<int64_t>(),         seq_lens.data_ptr<int64_t>(), extend_lens.data_ptr<int64_t>(),
                             extend_start.data_ptr<int64_t>(), B};
  auto out = torch::empty_like(q);
  radixlm::paged_attention(q.data_ptr(), out.data_ptr(), dtype_of(q), q.size(0), q.size(1), kv, batch,
                           static_cast<float>(scale), amx, flash);
  return out;
}

}  // namespace radixlm::bindings
