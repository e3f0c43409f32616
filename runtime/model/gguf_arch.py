"""What each llama.cpp architecture means in HF terms: tensor names, layouts and config fields.

One `GgufArch` per `general.architecture` we read (`ARCHES`). Facts about llama.cpp's files
(checked against its converter, convert_hf_to_gguf.py, and gguf-py's name tables):
  - only converters derived from its LlamaModel permute q/k rows for interleaved rope: the
    `llama` (Llama, Mistral, Mixtral), `granite` and `smollm3` architectures (`is_rope_permuted`);
  - Gemma 2 / 3 files store every RMSNorm weight as 1 + w (HF Gemma norms multiply by 1 + w);
  - experts are stacked into one 3-D tensor per projection (`ffn_{gate,up,down}_exps`,
    [n_expert, out, in] in torch order) and the router is `ffn_gate_inp`; HF checkpoints of
    Mixtral, Qwen3-MoE and OLMoE name each expert separately (`expert_names`);
  - Phi-3 keeps HF's fused qkv_proj (`attn_qkv`) and gate_up_proj (as `ffn_up`), and its long-rope
    factors as the tensors `rope_factors_long` / `rope_factors_short`;
  - Llama 3 rope scaling is stored as the tensor `rope_freqs` (per-frequency divisors), not as keys.
The config fields each architecture needs are read by `gguf_config.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# llama.cpp per-layer tensor (`blk.N.<key>.weight|bias`) -> HF module under `model.layers.N.`.
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_ATTENTION = {k: v for k, v in _LLAMA_LAYER.items() if k.startswith("attn_")}
_DENSE_MLP = {k: v for k, v in _LLAMA_LAYER.items() if k.startswith("ffn_") and k != "ffn_norm"}
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# a Qwen3-MoE / OLMoE layer: attention with q/k norms, the two norms, the router
_MOE_LAYER = {**_ATTENTION, **_QK_NORM, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
              "ffn_gate_inp": "mlp.gate"}
_MOE_MLP = {  # HF per-expert names with {e} for the expert index (Qwen3-MoE, OLMoE)
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}

GLOBAL_TENSOR_NAMES = MappingProxyType(
    {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
)
# Global tensors that carry config (rope factors), not weights: read by gguf_config.
CONFIG_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})


@dataclass(frozen=True)
class GgufArch:
    """How one llama.cpp architecture maps onto an HF model class.

    `layer_names`: GGUF per-layer key -> HF module path (without `model.layers.N.` and the
    `.weight` / `.bias` suffix). `expert_names`: GGUF stacked-expert key -> HF per-expert module
    path with `{e}`; used when the file has experts (`expert_count` > 0).
    """

    gguf_arch: str
    model_type: str
    architecture: str
    layer_names: Mapping[str, str]
    expert_names: Mapping[str, str] = field(default_factory=dict)
    is_rope_permuted: bool = False
    is_norm_plus_one: bool = False
    # transformers' module name -> the checkpoints' (where they differ outside the experts)
    checkpoint_renames: Mapping[str, str] = field(default_factory=dict)


def _arch(gguf_arch: str, model_type: str, architecture: str, layer_names: dict[str, str], **kw: object) -> GgufArch:
    expert_names = MappingProxyType(dict(kw.pop("expert_names", {})))  # type: ignore[call-overload]
    renames = MappingProxyType(dict(kw.pop("checkpoint_renames", {})))  # type: ignore[call-overload]
    return GgufArch(
        gguf_arch, model_type, architecture, MappingProxyType(layer_names), expert_names,
        checkpoint_renames=renames, **kw,  # type: ignore[arg-type]
    )


_MIXTRAL = _arch(
    "llama",
    "mixtral",
    "MixtralForCausalLM",
    {**_ATTENTION, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
     "ffn_gate_inp": "block_sparse_moe.gate"},
    expert_names={
        "ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
        "ffn_down_exps": "block_sparse_moe.experts.{e}.w2",
        "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
    },
    is_rope_permuted=True,
    checkpoint_renames={".mlp.gate.": ".block_sparse_moe.gate."},
)

ARCHES: Mapping[str, GgufArch] = MappingProxyType(
    {
        "llama": _arch("llama", "llama", "LlamaForCausalLM", dict(_LLAMA_LAYER), is_rope_permuted=True),
        "qwen2": _arch("qwen2", "qwen2", "Qwen2ForCausalLM", dict(_LLAMA_LAYER)),
        "qwen3": _arch("qwen3", "qwen3", "Qwen3ForCausalLM", {**_LLAMA_LAYER, **_QK_NORM}),
        "qwen3moe": _arch(
            "qwen3moe",
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            dict(_MOE_LAYER),
            expert_names=_MOE_MLP,
        ),
        "olmoe": _arch(
            "olmoe",
            "olmoe",
            "OlmoeForCausalLM",
            dict(_MOE_LAYER),
            expert_names=_MOE_MLP,
        ),
        "gemma2": _arch(
            "gemma2", "gemma2", "Gemma2ForCausalLM", {**_ATTENTION, **_DENSE_MLP, **_GEMMA_NORMS}, is_norm_plus_one=True
        ),
        "gemma3": _arch(
            "gemma3",
            "gemma3_text",
            "Gemma3ForCausalLM",
            {**_ATTENTION, **_QK_NORM, **_DENSE_MLP, **_GEMMA_NORMS},
            is_norm_plus_one=True,
        ),
        "phi3": _arch(
            "phi3",
            "phi3",
            "Phi3ForCausalLM",
            {
                "attn_norm": "input_layernorm",
                "attn_qkv": "self_attn.qkv_proj",
                "attn_output": "self_attn.o_proj",
                "ffn_norm": "post_attention_layernorm",
                "ffn_up": "mlp.gate_up_proj",
                "ffn_down": "mlp.down_proj",
            },
        ),
        "olmo2": _arch(
            "olmo2",
            "olmo2",
            "Olmo2ForCausalLM",
            {
                **_ATTENTION,
                **_QK_NORM,
                **_DENSE_MLP,
                "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm",
            },
        ),
        "granite": _arch("granite", "granite", "GraniteForCausalLM", dict(_LLAMA_LAYER), is_rope_permuted=True),
        "smollm3": _arch("smollm3", "smollm3", "SmolLM3ForCausalLM", dict(_LLAMA_LAYER), is_rope_permuted=True),
    }
)


def arch_for(gguf_arch: str, num_experts: int) -> GgufArch | None:
    """The mapping for a file of `gguf_arch` with `num_experts` experts (0: dense), or None if we
    cannot read it. llama.cpp writes Mixtral as `llama` with experts."""
    if gguf_arch == "llama" and num_experts > 0:
        return _MIXTRAL
    arch = ARCHES.get(gguf_arch)
    if arch is None or bool(arch.expert_names) != (num_experts > 0):
        return None
    return arch
