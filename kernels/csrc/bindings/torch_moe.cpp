// moe_experts' torch entry point (kernels/moe_experts.h): the tensors checked (an arena too
// small for the offsets it is given is refused, never read past), the output allocated.
#include <torch/extension.h>

#include <string>

#include "bindings/torch_layers.h"
#include "kernels/moe_experts.h"
#include "kernels/packed_gemm.h"
#include "kernels/kquant_gemm.h"

namespace radixlm::bindings {
namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Bytes of a packed weight of K rows and N columns in the layer's layout (quantized: format f).
int64_t packed_bytes(const MoeExperts& L, QFormat f, int64_t K, int64_t N) {
  const int64_t Np = round_up(N, kPanel);
  switch (L.kind) {
    case MoeWeights::kFloat32: return Np * K * 4;
    case MoeWeights::kBf16: return Np * pair_k(K) * 2;
    case MoeWeights::kQuant: return Np / kQGroup * (K / q_block_k(f)) * q_block_bytes(f);
  }
  return 0;
}

}  // namespace

MoeExperts moe_layer(const torch::Tensor& arena, const torch::Tensor& offsets, int64_t hidden, int64_t inter,
                     int64_t kind, int64_t gate_up_block_bytes, int64_t down_block_bytes, int64_t mode,
                     int64_t bf16_path) {
  TORCH_CHECK(arena.dim() == 1 && arena.scalar_type() == at::kByte && arena.is_contiguous(), "arena must be contiguous uint8");
  TORCH_CHECK(offsets.dim() == 2 && offsets.size(1) == 2 && offsets.scalar_type() == at::kLong && offsets.is_contiguous(),
              "offsets must be contiguous int64 [E, 2]");
  TORCH_CHECK(kind >= 0 && kind <= static_cast<int64_t>(MoeWeights::kQuant), "unknown expert weight kind ", kind);
  TORCH_CHECK(mode >= 0 && mode <= static_cast<int64_t>(QMode::kInt8Row), "unknown quantized mode ", mode);
  MoeExperts L;
  L.hidden = hidden;
  L.inter = inter;
  L.num_experts = offsets.size(0);
  L.kind = static_cast<MoeWeights>(kind);
  if (L.kind == MoeWeights::kQuant) {
    L.formats[0] = q_format_of(gate_up_block_bytes);
    L.formats[1] = q_format_of(down_block_bytes);
  }
  L.mode = static_cast<QMode>(mode);
  if (L.kind == MoeWeights::kBf16) L.bf16_path = radixlm::bf16_path(static_cast<int>(bf16_path));
  L.arena = arena.data_ptr<uint8_t>();
  L.offsets = offsets.data_ptr<int64_t>();
  const int64_t sizes[2] = {packed_bytes(L, L.formats[0], L.hidden, 2 * inter), packed_bytes(L, L.formats[1], inter, L.hidden)};
  const int64_t* off = L.offsets;
  for (int64_t i = 0; i < 2 * L.num_experts; ++i) {
    TORCH_CHECK(off[i] >= 0 && off[i] + sizes[i % 2] <= arena.numel(), "expert ", i / 2, "'s ",
                i % 2 ? "down" : "gate_up", " weight at byte ", off[i], " runs past the arena's ", arena.numel(), " bytes");
  }
  return L;
}

torch::Tensor moe_experts(const torch::Tensor& x, const torch::Tensor& ids, const torch::Tensor& weights,
                          const torch::Tensor& arena, const torch::Tensor& offsets, int64_t inter, int64_t kind,
                          int64_t gate_up_block_bytes, int64_t down_block_bytes, int64_t mode, int64_t bf16_path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous float32 [T, H]");
  const int64_t T = x.size(0);
  TORCH_CHECK(ids.dim() == 2 && ids.size(0) == T && ids.scalar_type() == at::kLong && ids.is_contiguous(),
              "ids must be contiguous int64 [T, k]");
  TORCH_CHECK(weights.sizes() == ids.sizes() && weights.scalar_type() == at::kFloat && weights.is_contiguous(),
              "weights must be contiguous float32 [T, k]");
  const MoeExperts L =
      moe_layer(arena, offsets, x.size(1), inter, kind, gate_up_block_bytes, down_block_bytes, mode, bf16_path);
  auto y = torch::empty_like(x);
  radixlm::moe_experts(L, x.data_ptr<float>(), T, ids.data_ptr<int64_t>(), weights.data_ptr<float>(), ids.size(1),
                       y.data_ptr<float>());
  return y;
}

torch::Tensor q4k_row_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t mode,
                             const c10::optional<torch::Tensor>& residual, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [1, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(2) == q_block_bytes(QFormat::kQ4_K) && packed.size(1) * q_block_k(QFormat::kQ4_K) == x.size(1),
              "packed must be contiguous uint8 Q4_K quant groups [N/16, K/256, 2304] matching x");
  TORCH_CHECK(mode == static_cast<int64_t>(QMode::kInt8Block) || mode == static_cast<int64_t>(QMode::kInt8Row),
              "q4k_row_linear takes an int8 mode, not ", mode);
  const int64_t groups = packed.size(0), N = groups * kQGroup;
  const auto operand = [&](const c10::optional<torch::Tensor>& t, const char* name) -> const float* {
    if (!t) return nullptr;
    TORCH_CHECK(t->numel() == N && t->scalar_type() == at::kFloat && t->is_contiguous(), name,
                " must be contiguous float32 of ", N, " values");
    return t->data_ptr<float>();
  };
  const float* res = operand(residual, "residual");
  const float* b = operand(bias, "bias");
  auto out = torch::empty({1, N}, x.options());
  q4k_int8_row_parallel(x.data_ptr<float>(), x.size(1), packed.data_ptr<uint8_t>(), groups,
                        static_cast<QMode>(mode), out.data_ptr<float>(), res, b);
  return out;
}

}  // namespace radixlm::bindings
