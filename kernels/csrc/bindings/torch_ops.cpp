// The Python entry points of the extension. Torch ops (TORCH_LIBRARY, below): packed_linear (one
// linear layer through the packed GEMM of packed_gemm.h), bf16_linear (the pair-panel GEMM of
// bf16_gemm.h), q_linear and q_columns (block-quantized weights, quant_gemm.h), and the torch
// layers of torch_layers.h: paged attention, the row-wise ops and a MoE layer's experts. The Python module (pybind):
// DecodeStack (every decoder layer of a decode step), the shared-memory all-reduce, and the CPU's
// features as the kernels see them.
#include <torch/extension.h>

#include <string>

#include "bindings/torch_layers.h"
#include "dispatch/cpu_features.h"
#include "kernels/amx_attention.h"
#include "kernels/bf16_gemm.h"
#include "kernels/packed_gemm.h"
#include "kernels/paged_attention.h"
#include "kernels/quant_gemm.h"
#include "simd/vec.h"

namespace {

std::string& isa_level() {
  static std::string level = RADIXLM_SIMD_NAME;
  return level;
}

// The loader's word (kernels/cpu_linear.py load_level): the features the kernels may use (the
// CPU's, within the level) and the level's name.
void set_cpu_features(uint64_t bits, const std::string& level) {
  radixlm::set_cpu_features(bits);
  isa_level() = level;
}

// (residual pointer, its row stride) of an optional float32 [M, N] residual with unit column stride
std::pair<const float*, int64_t> residual_of(const c10::optional<torch::Tensor>& residual, int64_t M, int64_t N) {
  if (!residual.has_value() || !residual->defined()) return {nullptr, 0};
  TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->dim() == 2 && residual->size(0) == M &&
                  residual->size(1) == N && residual->stride(1) == 1,
              "residual must be float32 [M, N] with unit column stride");
  return {residual->data_ptr<float>(), residual->stride(0)};
}

const float* bias_of(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N && bias->is_contiguous(), "bias must be float32 [N]");
  return bias->data_ptr<float>();
}

}  // namespace

// x [M, K] float32 contiguous; packed [N/64, K, 64] float32; residual [M, N] float32
// with unit column stride, or None; bias [N] float32 or None. Returns [M, N] float32.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed,
                            const c10::optional<torch::Tensor>& residual, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous float32 [M, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == x.size(1) && packed.size(2) == radixlm::kPanel && packed.is_contiguous(),
              "packed must be a contiguous [N/64, K, 64] matching x");
  TORCH_CHECK(packed.scalar_type() == at::kFloat, "packed must be float32 (bfloat16 weights take bf16_linear)");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0), N = panels * radixlm::kPanel;
  const auto [res, ld_res] = residual_of(residual, M, N);
  auto out = torch::empty({M, N}, x.options());
  radixlm::packed_gemm(x.data_ptr<float>(), M, K, packed.data_ptr<float>(), panels, out.data_ptr<float>(), N, res, ld_res,
                       bias_of(bias, N));
  return out;
}

// x [M, K] float32 contiguous; packed bfloat16 pair panels [N/32, Kp/2, 32, 2] (bf16_gemm.h);
// path: -1 the fastest this CPU runs, else a radixlm::Bf16Path. Returns [M, N] float32.
torch::Tensor bf16_linear(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& residual,
                          const c10::optional<torch::Tensor>& bias, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                  packed.size(1) * 2 == radixlm::pair_k(K) && packed.size(2) == radixlm::kPairPanel && packed.size(3) == 2,
              "packed must be contiguous bfloat16 pair panels [N/32, Kp/2, 32, 2] matching x");
  const int64_t panels = packed.size(0), N = panels * radixlm::kPairPanel;
  const auto [res, ld_res] = residual_of(residual, M, N);
  auto out = torch::empty({M, N}, x.options());
  radixlm::bf16_gemm(x.data_ptr<float>(), M, K, static_cast<const uint16_t*>(packed.data_ptr()), panels,
                     out.data_ptr<float>(), N, res, ld_res, bias_of(bias, N), radixlm::bf16_path(static_cast<int>(path)));
  return out;
}

// x [M, K] float32 contiguous; packed uint8 quant groups [N/16, K/block k, block bytes] (quant_gemm.h;
// the block size names the format, block k is 32 or a K-quant's 256); mode a radixlm::QMode.
// Returns [M, N] float32.
torch::Tensor q_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t mode,
                       const c10::optional<torch::Tensor>& residual, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "packed must be contiguous uint8 quant groups [N/16, K/block k, block bytes] matching x");
  const radixlm::QFormat format = radixlm::q_format_of(packed.size(2));
  TORCH_CHECK(packed.size(1) * radixlm::q_block_k(format) == K,
              "packed must be contiguous uint8 quant groups [N/16, K/block k, block bytes] matching x");
  TORCH_CHECK(mode >= 0 && mode <= static_cast<int64_t>(radixlm::QMode::kInt8Row), "unknown quantized mode ", mode);
  const int64_t groups = packed.size(0), N = groups * radixlm::kQGroup;
  const auto [res, ld_res] = residual_of(residual, M, N);
  auto out = torch::empty({M, N}, x.options());
  radixlm::q_gemm(x.data_ptr<float>(), M, K, packed.data_ptr<uint8_t>(), groups, format,
                  static_cast<radixlm::QMode>(mode), out.data_ptr<float>(), N, res, ld_res, bias_of(bias, N));
  return out;
}

// packed uint8 quant groups [N/16, K/32, block bytes]; cols int64 [T]. Returns [T, K] float32:
// those columns dequantized (a tied embedding's rows).
torch::Tensor q_columns(const torch::Tensor& packed, const torch::Tensor& cols) {
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "packed must be contiguous uint8 quant groups [N/16, K/32, block bytes]");
  TORCH_CHECK(cols.dim() == 1 && cols.scalar_type() == at::kLong && cols.is_contiguous(), "cols must be contiguous int64 [T]");
  const int64_t nb = packed.size(1), T = cols.size(0);
  const radixlm::QFormat format = radixlm::q_format_of(packed.size(2));
  auto out = torch::empty({T, nb * radixlm::q_block_k(format)}, torch::dtype(torch::kFloat32));
  radixlm::q_columns(packed.data_ptr<uint8_t>(), packed.size(0), nb, format,
                     cols.data_ptr<int64_t>(), T, out.data_ptr<float>());
  return out;
}

// The features the kernels may use (dispatch/cpu_features.h, as the loader set them), this
// build's vector layer, the ISA level the loader named, and the bf16 GEMM paths that run here.
pybind11::dict cpu_features() {
  pybind11::dict d;
  for (int i = 0; i < radixlm::kNumCpuFeatures; ++i) d[radixlm::kCpuFeatureNames[i]] = radixlm::cpu_has(static_cast<radixlm::CpuFeature>(i));
  d["build"] = RADIXLM_SIMD_NAME;
  d["isa"] = isa_level();
  d["bf16_path"] = static_cast<int>(radixlm::bf16_path());
  pybind11::list paths;
  paths.append(0);  // emulated: every level
#if defined(RADIXLM_SIMD_AVX512)
  if (radixlm::cpu_has(radixlm::kAvx512Bf16)) paths.append(1);
  if (radixlm::cpu_has(radixlm::kAmxBf16)) paths.append(2);
#endif
  d["bf16_paths"] = paths;
  return d;
}

// The compute ops, registered with torch's dispatcher: Python calls torch.ops.<RADIXLM_OPS>.<op>
// (kernels/cpu_linear.py Extension), so profilers and torch.compile see them by name. Each build
// has its own namespace (radixlm_<build>, set by the loader): the tests load several in one process.
TORCH_LIBRARY(RADIXLM_OPS, m) {
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? residual=None, Tensor? bias=None) -> Tensor");
  m.def("bf16_linear(Tensor x, Tensor packed, Tensor? residual=None, Tensor? bias=None, int path=-1) -> Tensor");
  m.def("q_linear(Tensor x, Tensor packed, int mode=0, Tensor? residual=None, Tensor? bias=None) -> Tensor");
  m.def("q_columns(Tensor packed, Tensor cols) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, Tensor rows, Tensor seq_lens, "
        "Tensor extend_lens, Tensor extend_start, float scale, bool amx=False, bool flash=False) -> Tensor");
  m.def("moe_experts(Tensor x, Tensor ids, Tensor weights, Tensor arena, Tensor offsets, int inter, int kind, "
        "int gate_up_block_bytes, int down_block_bytes, int mode, int bf16_path) -> Tensor");
}

TORCH_LIBRARY_IMPL(RADIXLM_OPS, CPU, m) {
  m.impl("packed_linear", &packed_linear);
  m.impl("bf16_linear", &bf16_linear);
  m.impl("q_linear", &q_linear);
  m.impl("q_columns", &q_columns);
  m.impl("rms_norm", &radixlm::bindings::rms_norm);
  m.impl("silu_mul", &radixlm::bindings::silu_mul);
  m.impl("paged_attention", &radixlm::bindings::paged_attention);
  m.impl("moe_experts", &radixlm::bindings::moe_experts);
}

// Output shapes without running (meta tensors: torch.compile's tracing).
namespace {

torch::Tensor rows_by(const torch::Tensor& x, int64_t n) { return torch::empty({x.size(0), n}, x.options().dtype(at::kFloat)); }

}  // namespace

TORCH_LIBRARY_IMPL(RADIXLM_OPS, Meta, m) {
  m.impl("packed_linear", [](const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>&,
                             const c10::optional<torch::Tensor>&) { return rows_by(x, packed.size(0) * radixlm::kPanel); });
  m.impl("bf16_linear", [](const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>&,
                           const c10::optional<torch::Tensor>&, int64_t) { return rows_by(x, packed.size(0) * radixlm::kPairPanel); });
  m.impl("q_linear", [](const torch::Tensor& x, const torch::Tensor& packed, int64_t, const c10::optional<torch::Tensor>&,
                        const c10::optional<torch::Tensor>&) { return rows_by(x, packed.size(0) * radixlm::kQGroup); });
  m.impl("q_columns", [](const torch::Tensor& packed, const torch::Tensor& cols) {
    return torch::empty({cols.size(0), packed.size(1) * radixlm::kQBlock}, packed.options().dtype(at::kFloat));
  });
  m.impl("rms_norm", [](const torch::Tensor& x, const c10::optional<torch::Tensor>&, double) {
    return torch::empty({x.size(0), x.size(1)}, x.options());
  });
  m.impl("silu_mul", [](const torch::Tensor& gu) { return torch::empty({gu.size(0), gu.size(1) / 2}, gu.options()); });
  m.impl("paged_attention", [](const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                               const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, double,
                               bool, bool) { return torch::empty_like(q); });
  m.impl("moe_experts", [](const torch::Tensor& x, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                           const torch::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
    return torch::empty_like(x);
  });
}

// The packed layouts' sizes, which kernels/cpu_linear.py and kernels/quant.py state again to pack
// weights (tests/kernels/test_torch_ops.py checks they agree).
pybind11::dict layout() {
  pybind11::dict d;
  d["panel"] = radixlm::kPanel;
  d["pair_panel"] = radixlm::kPairPanel;
  d["pair_k"] = radixlm::kPairK;
  d["q_group"] = radixlm::kQGroup;
  d["q_block"] = radixlm::kQBlock;
  return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("layout", &layout, "the packed layouts' sizes: panel, pair_panel, pair_k, q_group, q_block");
  m.def("num_vnni_calls", &radixlm::num_vnni_calls, "quantized products that ran in an int8 (vpdpbusd) mode");
  m.def("q4k_row_linear", &radixlm::bindings::q4k_row_linear,
        "Q4_K times one int8-quantized row (kernels/kquant_gemm.h): q_linear's bits at batch 1");
  m.def("cpu_features", &cpu_features,
        "the features the kernels use, the build, the ISA level, and the bf16 GEMM paths (0 emulated, 1 AVX512-BF16, 2 AMX)");
  m.def("set_cpu_features", &set_cpu_features, "the features the kernels may use (bits of dispatch/cpu_features.h) and the level's name",
        pybind11::arg("bits"), pybind11::arg("level"));
  m.def("amx_attention_supported", &radixlm::amx_attention_supported,
        "whether paged_attention(amx=True) runs long extends of this head_dim on AMX tiles here");
  m.def("num_cascade_calls", &radixlm::num_cascade_calls,
        "calls of paged_attention that took the vdpbf16ps cascade over a shared prefix");
  m.def("flash_attention_supported", &radixlm::flash_attention_supported,
        "whether paged_attention(flash=True) runs long extends of this head_dim with the vector kernel");
  m.def("long_extend_uses_fma", &radixlm::long_extend_uses_fma,
        "whether the vector long-extend kernel runs in float32 FMAs here (else vdpbf16ps): timed once, unless set");
  m.def("set_long_extend_math", &radixlm::set_long_extend_math,
        "the vector long-extend kernel's math: 0 vdpbf16ps, 1 float32 FMAs, -1 decide again by timing");
  pybind11::class_<radixlm::bindings::Experts, std::shared_ptr<radixlm::bindings::Experts>>(m, "DecodeExperts",
                                                                                         pybind11::module_local())
      .def(pybind11::init<torch::Tensor, torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t, int64_t, bool>());
  pybind11::class_<radixlm::bindings::DecodeStack>(m, "DecodeStack", pybind11::module_local())
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double>())
      .def("add_layer", &radixlm::bindings::DecodeStack::add_layer, pybind11::arg("qkv"), pybind11::arg("qkv_bias"),
           pybind11::arg("o"), pybind11::arg("o_bias"), pybind11::arg("gate_up"), pybind11::arg("down"),
           pybind11::arg("q_norm"), pybind11::arg("k_norm"), pybind11::arg("k_buf"), pybind11::arg("v_buf"),
           pybind11::arg("attn_norm"), pybind11::arg("ffn_norm"), pybind11::arg("experts") = nullptr,
           pybind11::arg("qkv_parts") = std::vector<std::pair<torch::Tensor, int64_t>>{},
           pybind11::arg("gate_up_parts") = std::vector<std::pair<torch::Tensor, int64_t>>{})
      .def("forward", &radixlm::bindings::DecodeStack::forward)
      .def_property("bf16_path", &radixlm::bindings::DecodeStack::get_bf16_path, &radixlm::bindings::DecodeStack::set_bf16_path)
      .def_property("quant_mode", &radixlm::bindings::DecodeStack::get_quant_mode, &radixlm::bindings::DecodeStack::set_quant_mode)
      .def_property("flash_attention", &radixlm::bindings::DecodeStack::get_flash_attention,
                    &radixlm::bindings::DecodeStack::set_flash_attention)
      .def("set_tensor_parallel", &radixlm::bindings::DecodeStack::set_tensor_parallel);
  pybind11::class_<radixlm::ShmAllReduce, std::shared_ptr<radixlm::ShmAllReduce>>(m, "ShmAllReduce", pybind11::module_local())
      .def(pybind11::init<torch::Tensor, int64_t, int64_t, int64_t, std::vector<int64_t>>())
      .def("all_reduce", [](const radixlm::ShmAllReduce& self, torch::Tensor t) {
        TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "all_reduce takes contiguous float32");
        self.all_reduce(t.data_ptr<float>(), t.numel());
      }, "t summed over the ranks, in place (runtime/model/shm_all_reduce.py's protocol)");

  m.def("int8_variants", &radixlm::int8_variants, "the int8 dot variants (quant_gemm.h) this build runs here, fastest first");
  m.def("int8_variant", &radixlm::int8_variant, "the int8 dot variant the int8 quantized modes use now");
  m.def("set_int8_variant", &radixlm::set_int8_variant, "force an int8 dot variant of int8_variants(); '' for the fastest",
        pybind11::arg("name"));
}
