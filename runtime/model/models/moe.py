"""The sparse mixture-of-experts block of Qwen3-MoE, Mixtral and OLMoE: a router and E SwiGLU
experts, each token's output the weighted sum of its top-k experts' outputs.

    x [T, H] -> router logits [T, E] -> softmax (float32) -> top-k (ids, weights; renormalised
    where the family does) -> rows grouped by expert -> per routed expert, on all its rows:
    gate_up, SiLU x up, down -> scaled by the weights -> each token's k outputs summed -> [T, H]

The three families route alike (softmax over all E experts, then top-k of the probabilities);
they differ in whether the k weights are renormalised to sum to one (Mixtral always;
Qwen3-MoE and OLMoE as `norm_topk_prob` says, False when unset), in the dtype of those weights
(Mixtral keeps them float32, the others cast them to the activations' dtype), in which layers
are sparse (Qwen3-MoE: `decoder_sparse_step`, `mlp_only_layers`; the others: every layer) and in
their checkpoint names (Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`, the others'
`mlp.experts.{e}.gate_proj/up_proj/down_proj`).

A step reads only the experts its tokens are routed to, each once for all its rows: at most
min(E, T x top_k) expert products of each kind per step (`group_by_expert`). An expert's two
products are our `Linear`s (models/layers.py), so with the C++ kernels (`use_cpu_kernels`) they
run our packed float32 / bf16 or block-quantized kernels, and without them torch's GEMM; a
block-quantized expert (GGUF blocks from the file, or `quantize_to` at load) holds only its blocks.
With the C++ kernels, the experts' weights sit in one arena per layer and a step's experts run in
ONE kernel call (`FusedExperts`, kernels/csrc/kernels/moe_experts.h: grouping, every routed
expert's gate_up, SiLU x up and down, and the weighted sum, in one parallel region), the same
products as the experts' own layers (a decode step in DecodeStack calls the same kernel from its
layer loop, after routing as `route` does: models/llama.py); the per-expert path above remains
for torch's ops, for float experts past their kernel's rows (prefill: torch's GEMM), and for
widths the kernel does not tile (moe_intermediate_size not a multiple of 64 / 32).
The block takes x already normalised (the post-attention RMSNorm with its weight: the router
and every expert read it, so the norm's weight cannot be folded into one linear layer's rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_linear
from radixlm.kernels.quant import BLOCK, QuantizedTensor, quantize
from radixlm.runtime.model.kernel_policy import CpuIsa
from radixlm.runtime.model.linear_method import CpuKernels, KernelLinear, in_one_arena
from radixlm.runtime.model.models.layers import Linear
from radixlm.runtime.model.models.weights import Weight, WeightLoadError


@dataclass(frozen=True)
class ExpertNames:
    """How a family's hub checkpoints name one layer's block: `{layer}{block}.gate.weight` (the
    router, `[E, H]`) and `{layer}{block}.experts.{e}.{gate|up|down}.weight` (`[I, H]`, `[I, H]`,
    `[H, I]`)."""

    block: str
    gate: str
    up: str
    down: str


QWEN_NAMES = ExpertNames("mlp", "gate_proj", "up_proj", "down_proj")
MIXTRAL_NAMES = ExpertNames("block_sparse_moe", "w1", "w3", "w2")


@dataclass(frozen=True)
class MoeOptions:
    """One model's mixture-of-experts shape and routing (`moe_options_from_hf`)."""

    architecture: str
    num_experts: int
    top_k: int  # experts per token (HF's num_experts_per_tok)
    moe_intermediate_size: int  # each expert's SwiGLU width
    norm_topk_prob: bool  # the k weights renormalised to sum to 1
    router_weights_in_float32: bool  # the k weights stay float32 (Mixtral), else the activations' dtype
    names: ExpertNames
    decoder_sparse_step: int = 1  # Qwen3-MoE: layer i is sparse where (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here (these keep a dense MLP)

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"{self.architecture}: top_k must be within 1..num_experts, got top_k={self.top_k} "
                             f"of {self.num_experts} experts")
        if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
            raise ValueError(f"{self.architecture}: moe_intermediate_size and decoder_sparse_step must be positive")

    def is_sparse_layer(self, layer_id: int) -> bool:
        """Whether decoder layer `layer_id` has this block (else the config's dense MLP)."""
        return layer_id not in self.mlp_only_layers and (layer_id + 1) % self.decoder_sparse_step == 0


MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM")


def moe_options_from_hf(hf: Mapping[str, Any]) -> MoeOptions | None:
    """The block's options from an HF config.json dict, or None for an architecture without
    experts. Keys missing from the dict take the defaults of transformers' config class (5.x),
    as transformers itself would; a MoE config with another activation than SiLU is refused."""
    architecture = (hf.get("architectures") or [""])[0]
    if architecture not in MOE_ARCHITECTURES:
        return None
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{architecture}: experts with hidden_act {act!r} are not supported (only 'silu')")

    def first(*keys: str, default: Any) -> Any:
        return next((hf[k] for k in keys if hf.get(k) is not None), default)

    if architecture == "MixtralForCausalLM":
        return MoeOptions(
            architecture, num_experts=int(first("num_local_experts", "num_experts", default=8)),
            top_k=int(first("num_experts_per_tok", default=2)),
            moe_intermediate_size=int(first("intermediate_size", default=14336)),
            norm_topk_prob=True, router_weights_in_float32=True, names=MIXTRAL_NAMES,
        )
    if architecture == "OlmoeForCausalLM":
        return MoeOptions(
            architecture, num_experts=int(first("num_experts", "num_local_experts", default=64)),
            top_k=int(first("num_experts_per_tok", default=8)),
            moe_intermediate_size=int(first("intermediate_size", default=2048)),
            norm_topk_prob=bool(first("norm_topk_prob", default=False)), router_weights_in_float32=False,
            names=QWEN_NAMES,
        )
    return MoeOptions(
        architecture, num_experts=int(first("num_experts", "num_local_experts", default=128)),
        top_k=int(first("num_experts_per_tok", default=8)),
        moe_intermediate_size=int(first("moe_intermediate_size", default=768)),
        norm_topk_prob=bool(first("norm_topk_prob", default=False)), router_weights_in_float32=False,
        names=QWEN_NAMES, decoder_sparse_step=int(first("decoder_sparse_step", default=1)),
        mlp_only_layers=tuple(int(i) for i in first("mlp_only_layers", default=())),
    )


class ExpertGroups(NamedTuple):
    """A step's (token, expert) pairs ordered by expert: expert `expert_ids[i]` takes the rows
    `token_ids[offsets[i]:offsets[i + 1]]` of x (each token at most once per expert), scaled by
    `weights` of the same slice. Only experts with at least one row are listed, ascending.
    `inverse[t * k + j]` is the grouped position of token t's j-th choice."""

    expert_ids: list[int]
    offsets: list[int]
    token_ids: torch.Tensor  # [T * top_k] int64
    weights: torch.Tensor  # [T * top_k]
    inverse: torch.Tensor  # [T * top_k] int64


def group_by_expert(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> ExpertGroups:
    """Group the routing `topk_ids` / `topk_weights` (`[T, k]`) by expert (one host sync)."""
    flat = topk_ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    experts, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    offsets = [0]
    for count in counts.tolist():
        offsets.append(offsets[-1] + count)
    return ExpertGroups(experts.tolist(), offsets, order // topk_ids.shape[1], topk_weights.reshape(-1)[order],
                        torch.argsort(order))


class Expert(nn.Module):
    """One SwiGLU expert: down(SiLU(gate(x)) * up(x)), gate and up fused in one product."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, rows: torch.Tensor, ext: CpuKernels | None) -> torch.Tensor:
        """The expert's output for the rows `[R, H]` routed to it (`ext`: the fused SiLU x up)."""
        gate_up = self.gate_up_proj(rows)
        if ext is not None:
            act = ext.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate).mul_(up)
        return self.down_proj(act)


@dataclass(frozen=True)
class FusedExperts:
    """A layer's experts as the fused kernel reads them: expert e's packed gate_up at byte
    `offsets[e, 0]` of `arena`, its down at `offsets[e, 1]`, all of one `kind` (0 float32, 1
    bf16, 2 quantized: `block_bytes` (gate_up's, down's) name their formats, `mode` how they
    multiply; `bf16_path` the bf16 GEMM path's index). Steps of up to `max_rows` tokens run it."""

    ext: Any
    arena: torch.Tensor  # uint8, the whole allocation the experts' methods were placed in
    offsets: torch.Tensor  # int64 [E, 2]
    inter: int
    kind: int
    block_bytes: tuple[int, int]
    mode: int
    bf16_path: int
    max_rows: int

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """y [T, H] float32 for x [T, H] routed to `ids` [T, k] with `weights` [T, k]."""
        return self.ext.moe_experts(x.float().contiguous(), ids.contiguous(), weights.float().contiguous(), self.arena,
                                    self.offsets, self.inter, self.kind, *self.block_bytes, self.mode, self.bf16_path)


def fused_experts(ext: Any, methods: list[tuple[KernelLinear, KernelLinear]], inter: int) -> FusedExperts | None:
    """The fused kernel over the experts' placed (gate_up, down) methods, or None where it cannot
    take them: float and quantized products mixed, formats that differ between experts, weights
    in several allocations, biases, a width it does not tile, or an extension without it."""
    if not hasattr(ext, "moe_experts"):
        return None
    first = methods[0][0]

    def form(m: KernelLinear) -> tuple[Any, ...]:
        return m.packed.dtype, m.quant_mode, m.packed.shape[-1] if m.quant_mode is not None else 0

    forms = [{form(pair[i]) for pair in methods} for i in (0, 1)]
    storages = {m.packed.untyped_storage().data_ptr() for pair in methods for m in pair}
    if len(forms[0]) != 1 or len(forms[1]) != 1 or len(storages) != 1 or \
            any(m.bias is not None for pair in methods for m in pair):
        return None
    (gate_up_form,), (down_form,) = forms
    if gate_up_form[:2] != down_form[:2]:  # the same dtype and mode (quantized: the formats may differ)
        return None
    block_bytes, mode, path = (int(gate_up_form[2]), int(down_form[2])), int(first.quant_mode or 0), -1
    if first.quant_mode is not None:
        kind = 2
    elif first.packed.dtype == torch.bfloat16:
        path_name = getattr(first.product, "keywords", {}).get("path")
        kind = 1
        path = cpu_linear.BF16_PATHS.index(path_name) if path_name in cpu_linear.BF16_PATHS else -1
    else:
        kind = 0
    if inter % (64 if kind in (0, 1) else 32):  # float32 panels, bf16 panel pairs: 64 columns
        return None
    storage = first.packed.untyped_storage()
    arena = torch.empty(0, dtype=torch.uint8).set_(storage)
    base = storage.data_ptr()
    offsets = torch.tensor([[m.packed.data_ptr() - base for m in pair] for pair in methods], dtype=torch.int64)
    return FusedExperts(ext, arena, offsets, inter, kind, block_bytes, mode, path,
                        min(m.max_rows for pair in methods for m in pair))


class SparseMoeBlock(nn.Module):
    """The mixture-of-experts block of one decoder layer: forward(x `[T, H]`) -> `[T, H]`."""

    def __init__(self, options: MoeOptions, hidden_size: int):
        super().__init__()
        self.options = options
        self.hidden_size = hidden_size
        self.gate = nn.Parameter(torch.empty(options.num_experts, hidden_size))  # the router, HF's [E, H]
        self.experts = nn.ModuleList(
            Expert(hidden_size, options.moe_intermediate_size) for _ in range(options.num_experts))
        self.ext: CpuKernels | None = None  # the C++ kernels' fused SiLU x up, once use_cpu_kernels ran
        self.fused: FusedExperts | None = None  # every routed expert in one kernel call, where it can

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids `[T, k]` int64, topk_weights `[T, k]`) of each token: the router's logits in
        x's dtype, softmax over all experts in float32, the k most probable, renormalised where
        the options say, in float32 or x's dtype as the family keeps them."""
        probs = torch.softmax(F.linear(x, self.gate).float(), dim=-1)
        weights, ids = torch.topk(probs, self.options.top_k, dim=-1)
        if self.options.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights if self.options.router_weights_in_float32 else weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f"SparseMoeBlock takes x [T, {self.hidden_size}], got {tuple(x.shape)}")
        ids, weights = self.route(x)
        if self.fused is not None and x.shape[0] <= self.fused.max_rows:
            return self.fused(x, ids, weights).to(x.dtype)
        groups = group_by_expert(ids, weights)
        # one gather, one product pair per routed expert on its contiguous slice of rows, one
        # scale, one gather back to token order and a sum over each token's k: the per-expert work
        # is the expert's products and nothing else (torch's index_add_ / scatter_add_ would sum
        # too, but run a parallel region that costs a time slice beside a competing process)
        rows = x.index_select(0, groups.token_ids)
        outputs = [self.experts[e](rows[groups.offsets[i]:groups.offsets[i + 1]], self.ext)
                   for i, e in enumerate(groups.expert_ids)]
        if not outputs:  # no tokens
            return torch.zeros_like(x)
        y = torch.cat(outputs) * groups.weights[:, None]  # transformers' order: scaled after down
        return y.index_select(0, groups.inverse).view(x.shape[0], -1, x.shape[1]).sum(dim=1).to(x.dtype)

    def use_cpu_kernels(self, ext: CpuKernels, bf16_path: str, chosen: CpuIsa) -> None:
        """Run the experts' products in our packed kernels (a quantized expert already does) and
        their SiLU x up in the fused row-wise one; the experts' packed weights move into one
        huge-page allocation, expert by expert (linear_method.in_one_arena: a routed expert's
        two products read one run of memory)."""
        linears = [part for expert in self.experts for lin in (expert.gate_up_proj, expert.down_proj)
                   if isinstance(lin, Linear) for part in lin.kernel_linears()]
        for linear in linears:
            linear.use_packed(ext, bf16_path, chosen)
        for linear, method in zip(linears, in_one_arena([lin.method for lin in linears]), strict=True):
            linear.place(method)
        self.ext = ext
        self.fuse_experts()

    def fuse_experts(self) -> None:
        """Run the experts in the fused kernel from now on, where it takes them (fused_experts):
        called once the experts' methods are placed in their final arena (use_cpu_kernels here,
        or the model's own placement of every weight), never before."""
        methods = [(expert.gate_up_proj.method, expert.down_proj.method) for expert in self.experts]
        if self.ext is not None and all(a is not None and b is not None for a, b in methods):
            self.fused = fused_experts(self.ext, methods, self.options.moe_intermediate_size)  # type: ignore[arg-type]

    def load_weights(self, tensors: Mapping[str, Weight], layer_prefix: str, quantize_to: str | None = None,
                     quant_mode: str = "float32") -> None:
        """Load this block of the layer named `layer_prefix` (e.g. "model.layers.3.") from
        checkpoint tensors as hub files (and transformers' save_pretrained) name them, or in
        transformers' fused in-memory form (`mlp.experts.gate_up_proj` `[E, 2I, H]`,
        `mlp.experts.down_proj` `[E, H, I]`, a model's state_dict). Block-quantized experts stay
        quantized (`quant_mode`: how they multiply, kernels/quant.py MODES); `quantize_to`
        (q8_0, q4_0, q4_1, w8a8_int8) quantizes float experts; the router stays float."""
        load_block(self, tensors, layer_prefix, quantize_to, quant_mode)


def load_block(block: SparseMoeBlock, tensors: Mapping[str, Weight], layer_prefix: str, quantize_to: str | None,
               quant_mode: str) -> None:
    """SparseMoeBlock.load_weights."""
    names = block.options.names
    hub = f"{layer_prefix}{names.block}."
    fused = f"{layer_prefix}mlp.experts."

    def take(name: str) -> Weight:
        if name not in tensors:
            raise WeightLoadError(f"checkpoint has no tensor {name!r}")
        return tensors[name]

    router_name = next((n for n in (hub + "gate.weight", f"{layer_prefix}mlp.gate.weight") if n in tensors),
                       hub + "gate.weight")
    router = take(router_name)
    _put(block.gate, router.dequantize() if isinstance(router, QuantizedTensor) else router, router_name)
    stacked = None  # transformers' in-memory form: every expert in two 3-D tensors
    if fused + "gate_up_proj" in tensors:
        stacked = (_float(take(fused + "gate_up_proj")), _float(take(fused + "down_proj")))
    for e, expert in enumerate(block.experts):
        assert isinstance(expert, Expert)
        if stacked is not None:
            gate_up: Weight | list[QuantizedTensor] = stacked[0][e]
            down: Weight = stacked[1][e]
        else:
            p = f"{hub}experts.{e}."
            gate_up = _fuse(take(f"{p}{names.gate}.weight"), take(f"{p}{names.up}.weight"))
            down = take(f"{p}{names.down}.weight")
        _put_linear(expert.gate_up_proj, gate_up, f"{hub}experts.{e}.gate_up", quantize_to, quant_mode)
        _put_linear(expert.down_proj, down, f"{hub}experts.{e}.{names.down}", quantize_to, quant_mode)


def _float(w: Weight) -> torch.Tensor:
    return w.dequantize() if isinstance(w, QuantizedTensor) else w


def _fuse(gate: Weight, up: Weight) -> Weight | list[QuantizedTensor]:
    """gate's rows, then up's: quantized if both are (in two parts if their formats differ); else float."""
    if isinstance(gate, QuantizedTensor) and isinstance(up, QuantizedTensor):
        return QuantizedTensor.cat([gate, up]) if gate.fmt == up.fmt else [gate, up]
    return torch.cat([_float(gate), _float(up)])


def _put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise WeightLoadError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(value.shape)}")
    with torch.no_grad():
        param.copy_(value)


def _put_linear(linear: Linear, weight: Weight | list[QuantizedTensor], name: str, quantize_to: str | None,
                quant_mode: str) -> None:
    """An HF `[out, in]` weight into our Linear: its blocks kept (or made, `quantize_to`), or
    its float values transposed; a list: row blocks in their own formats, each kept."""
    if isinstance(weight, list):
        try:
            linear.quantize_parts_(weight, quant_mode)
        except ValueError as e:
            raise WeightLoadError(f"{name}: {e}") from e
        return
    expected = (linear.out_features, linear.in_features)
    if tuple(weight.shape) != expected:
        raise WeightLoadError(f"{name}: expected shape {expected}, got {tuple(weight.shape)}")
    if quantize_to is not None and isinstance(weight, torch.Tensor) and weight.shape[1] % BLOCK == 0:
        weight = quantize(weight, quantize_to)
    if isinstance(weight, QuantizedTensor):
        linear.quantize_(weight, quant_mode)
        return
    _put(linear.weight_t, weight.t(), name)
