// rms_norm and silu_mul's torch entry points: the tensors checked, the output allocated in the
// input's dtype, the row kernels (kernels/rows.h) called on their memory.
#include "bindings/torch_layers.h"
#include "kernels/rows.h"

namespace radixlm::bindings {

namespace {

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1 && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16),
              name, " must be float32 or bfloat16 [rows, width] with unit column stride");
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& weight, double eps) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  const float* w = nullptr;
  if (weight.has_value() && weight->defined()) {
    TORCH_CHECK(weight->scalar_type() == at::kFloat && weight->is_contiguous() && weight->numel() == n,
                "weight must be contiguous float32 [", n, "]");
    w = weight->data_ptr<float>();
  }
  auto y = torch::empty({rows, n}, x.options());
  if (x.scalar_type() == at::kFloat) {
    rms_norm_rows(x.data_ptr<float>(), rows, n, x.stride(0), w, static_cast<float>(eps), y.data_ptr<float>());
  } else {
    rms_norm_rows(static_cast<const uint16_t*>(x.data_ptr()), rows, n, x.stride(0), w, static_cast<float>(eps),
                  static_cast<uint16_t*>(y.data_ptr()));
  }
  return y;
}

torch::Tensor silu_mul(const torch::Tensor& gu) {
  check_rows(gu, "gate_up");
  TORCH_CHECK(gu.size(1) % 2 == 0, "gate_up must have an even width");
  const int64_t rows = gu.size(0), n = gu.size(1) / 2;
  auto y = torch::empty({rows, n}, gu.options());
  if (gu.scalar_type() == at::kFloat) {
    silu_mul_rows(gu.data_ptr<float>(), rows, n, gu.stride(0), y.data_ptr<float>());
  } else {
    silu_mul_rows(static_cast<const uint16_t*>(gu.data_ptr()), rows, n, gu.stride(0), static_cast<uint16_t*>(y.data_ptr()));
  }
  return y;
}

}  // namespace radixlm::bindings
