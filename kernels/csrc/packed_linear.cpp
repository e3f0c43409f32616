// The Python entry points of the extension: packed_linear (one linear layer through the packed
// GEMM of packed_gemm.h) and DecodeStack (decode_stack.h: every decoder layer of a decode step).
#include <torch/extension.h>

#include "decode_stack.h"
#include "packed_gemm.h"

namespace radixlm {
torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                              const torch::Tensor& req_to_token, const torch::Tensor& rows, const torch::Tensor& seq_lens,
                              const torch::Tensor& extend_lens, const torch::Tensor& extend_start, double scale);
}  // namespace radixlm

// x [M, K] float32 contiguous; packed [N/64, K, 64] float32 or bfloat16; residual [M, N] float32
// with unit column stride, or None; bias [N] float32 or None. Returns [M, N] float32.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed,
                            const c10::optional<torch::Tensor>& residual, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous float32 [M, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == x.size(1) && packed.size(2) == radixlm::kPanel && packed.is_contiguous(),
              "packed must be a contiguous [N/64, K, 64] matching x");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 || packed.scalar_type() == at::kFloat,
              "packed must be float32 or bfloat16");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0), N = panels * radixlm::kPanel;
  const float* res = nullptr;
  int64_t ld_res = 0;
  if (residual.has_value() && residual->defined()) {
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->dim() == 2 && residual->size(0) == M &&
                    residual->size(1) == N && residual->stride(1) == 1,
                "residual must be float32 [M, N] with unit column stride");
    res = residual->data_ptr<float>();
    ld_res = residual->stride(0);
  }
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N && bias->is_contiguous(), "bias must be float32 [N]");
    b = bias->data_ptr<float>();
  }
  auto out = torch::empty({M, N}, x.options());
  radixlm::packed_gemm(x.data_ptr<float>(), M, K, packed.data_ptr(), packed.scalar_type() == at::kBFloat16, panels,
                       out.data_ptr<float>(), N, res, ld_res, b);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("packed_linear", &packed_linear, "x @ W (+ bias) (+ residual) with W packed in 64-column panels");
  m.def("paged_attention", &radixlm::paged_attention,
        "causal attention of new tokens over their requests' context, read in place from the KV pool");
  pybind11::class_<radixlm::DecodeStack>(m, "DecodeStack")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double>())
      .def("add_layer", &radixlm::DecodeStack::add_layer)
      .def("forward", &radixlm::DecodeStack::forward);
}
