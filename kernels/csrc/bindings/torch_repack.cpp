// quant_repack's torch entry point (kernels/kquant_repack.h): GGUF blocks, as row blocks of
// uint8 tensors, into a new tensor of quant groups. Registered as a torch op of its own library
// fragment (the other ops: torch_ops.cpp), so Python calls torch.ops.radixlm_<build>.quant_repack.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "kernels/kquant_repack.h"

namespace radixlm::bindings {
namespace {

radixlm::RepackFormat repack_format_named(c10::string_view name) {
  static const std::pair<const char*, radixlm::RepackFormat> kRepackFormats[] = {
      {"q8_0", radixlm::RepackFormat::kQ8_0}, {"q4_0", radixlm::RepackFormat::kQ4_0},
      {"q4_1", radixlm::RepackFormat::kQ4_1}, {"q4_k", radixlm::RepackFormat::kQ4K},
      {"q5_k", radixlm::RepackFormat::kQ5K},  {"q6_k", radixlm::RepackFormat::kQ6K}};
  for (const auto& [known, fmt] : kRepackFormats) {
    if (name == known) return fmt;
  }
  TORCH_CHECK(false, "quant_repack: unknown format '", std::string(name), "' (q8_0, q4_0, q4_1, q4_k, q5_k, q6_k)");
}

// The packed shape [padded_n / 16, k / block_k, packed bytes] of `parts`' rows, the parts checked:
// uint8 [rows, k / block_k * GGUF bytes], unit column stride.
std::vector<int64_t> repack_shape_of(const std::vector<torch::Tensor>& parts, int64_t k, radixlm::RepackFormat fmt,
                                     int64_t n_multiple) {
  const radixlm::RepackSizes sizes = radixlm::repack_sizes(fmt);
  TORCH_CHECK(!parts.empty(), "quant_repack: no weight given");
  TORCH_CHECK(k > 0 && k % sizes.block_k == 0, "quant_repack: k ", k, " is not a multiple of ", sizes.block_k);
  TORCH_CHECK(n_multiple > 0 && n_multiple % 16 == 0, "quant_repack: n_multiple must be a multiple of 16");
  const int64_t row_bytes = k / sizes.block_k * sizes.gguf_bytes;
  int64_t n = 0;
  for (const auto& part : parts) {
    TORCH_CHECK(part.scalar_type() == at::kByte && part.dim() == 2 && part.size(1) == row_bytes &&
                    part.stride(1) == 1,
                "quant_repack: each part must be uint8 [rows, ", row_bytes, "] with unit column stride, got ",
                part.sizes());
    n += part.size(0);
  }
  const int64_t padded = (n + n_multiple - 1) / n_multiple * n_multiple;
  return {padded / 16, k / sizes.block_k, sizes.packed_bytes};
}

torch::Tensor repack_cpu(const std::vector<torch::Tensor>& parts, int64_t k, c10::string_view fmt_name,
                         int64_t n_multiple) {
  const radixlm::RepackFormat fmt = repack_format_named(fmt_name);
  const std::vector<int64_t> shape = repack_shape_of(parts, k, fmt, n_multiple);
  std::vector<const uint8_t*> rows;
  for (const auto& part : parts) {
    TORCH_CHECK(part.device().is_cpu(), "quant_repack: parts must be on the CPU");
    const uint8_t* base = part.data_ptr<uint8_t>();
    for (int64_t r = 0; r < part.size(0); ++r) rows.push_back(base + r * part.stride(0));
  }
  auto out = torch::empty(shape, torch::dtype(torch::kUInt8));
  radixlm::quant_repack(rows.data(), static_cast<int64_t>(rows.size()), k, fmt, shape[0] * 16,
                        out.data_ptr<uint8_t>());
  return out;
}

torch::Tensor repack_meta(const std::vector<torch::Tensor>& parts, int64_t k, c10::string_view fmt_name,
                          int64_t n_multiple) {
  return torch::empty(repack_shape_of(parts, k, repack_format_named(fmt_name), n_multiple),
                      torch::dtype(torch::kUInt8).device(torch::kMeta));
}

}  // namespace
}  // namespace radixlm::bindings

// parts: the weight's row blocks in order (uint8 [rows, K / block_k * GGUF bytes], unit column
// stride, any row stride); out uint8 [Np / 16, K / block_k, packed bytes], Np the rows padded to
// n_multiple.
TORCH_LIBRARY_FRAGMENT(RADIXLM_OPS, m) {
  m.def("quant_repack(Tensor[] parts, int k, str fmt, int n_multiple) -> Tensor");
}

TORCH_LIBRARY_IMPL(RADIXLM_OPS, CPU, m) { m.impl("quant_repack", &radixlm::bindings::repack_cpu); }

TORCH_LIBRARY_IMPL(RADIXLM_OPS, Meta, m) { m.impl("quant_repack", &radixlm::bindings::repack_meta); }
