"""The model's shape and options, read once from an HF `config.json` into a frozen dataclass.

The options a family differs by (norm layout, activation, scales, soft-caps, per-layer sliding
windows and rotary embeddings) are typed fields here, each with the Llama value as its default;
families.py turns each family's config.json into them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from radixlm.runtime.model.models.moe import MoeOptions

# Architectures our decoder implements; the value is the variant whose options parser
# (families.py) reads the rest of the config.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "Olmo2ForCausalLM": "olmo2",
    "GraniteForCausalLM": "granite",
    "SmolLM3ForCausalLM": "smollm3",
    # mixtures of experts (models/moe.py): the decoder layer's MLP a SparseMoeBlock on sparse layers
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
}

NormLayout = Literal["pre", "sandwich", "post"]
QKNorm = Literal["none", "head", "projection"]
Activation = Literal["silu", "gelu_tanh"]


class UnsupportedModelError(ValueError):
    """The config names an architecture or option this runtime does not implement."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    scaling_type: str = "default"  # default | linear | llama3 | longrope
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0  # the leading fraction of each head that rotates (Phi-4-mini: 0.75)
    # longrope: per-frequency divisors for sequences up to / beyond original_max_position_embeddings,
    # and the factor scaling cos and sin (hence the rotated dims of q and k)
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dims of each head rotate (even); the rest pass through."""
        return int(head_dim * self.partial_rotary_factor)


@dataclass(frozen=True)
class LayerOptions:
    """What differs between a model's layers."""

    sliding_window: int | None = None  # a query attends to the last `sliding_window` positions, itself included
    rope: RopeConfig | None = None  # None: this layer applies no rotary embedding (SmolLM3's no-rope layers)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    variant: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections
    o_proj_bias: bool  # bias on the attention output projection
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    # Mistral / Qwen2: the window caps the context (`context_len`), so it never cuts; the families
    # that attend through windows per layer say so in `layers`
    sliding_window: int | None
    # pre: RMSNorm before each sublayer (Llama); sandwich: also on each sublayer's output before the
    # residual add (Gemma 2/3); post: only on the sublayer's output (OLMo 2)
    norm_layout: NormLayout = "pre"
    norm_weight_offset: float = 0.0  # RMSNorm scales by (offset + weight): Gemma's 1 + weight
    qk_norm: QKNorm = "none"  # RMSNorm of q and k before RoPE: per head (Qwen3, Gemma 3) or whole projection (OLMo 2)
    hidden_act: Activation = "silu"  # of the gated MLP: act(gate) * up
    mlp_bias: bool = False
    embedding_scale: float = 1.0  # embeddings multiplied by it (Gemma: sqrt(hidden); Granite's embedding_multiplier)
    residual_scale: float = 1.0  # each sublayer's output multiplied by it before the add (Granite)
    attention_scaling: float | None = None  # the attention scores' scale; None: head_dim ** -0.5
    attn_logit_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2)
    final_logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2/3)
    logits_scaling: float = 1.0  # logits divided by it (Granite)
    layers: tuple[LayerOptions, ...] = ()  # per layer; empty: every layer LayerOptions(None, rope)
    # a mixture of experts' shape and routing (Qwen3-MoE, Mixtral, OLMoE), None for a dense model;
    # its sparse layers (`moe.is_sparse_layer`) have a SparseMoeBlock for their MLP, the others a
    # dense one of `intermediate_size`
    moe: MoeOptions | None = None

    @property
    def context_len(self) -> int:
        """Longest sequence (prompt + output) the model serves."""
        if self.sliding_window is not None:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @property
    def has_qk_norm(self) -> bool:
        return self.qk_norm != "none"

    @property
    def scaling(self) -> float:
        """The attention scores' scale."""
        return self.attention_scaling if self.attention_scaling is not None else self.head_dim**-0.5

    def layer(self, layer_id: int) -> LayerOptions:
        return self.layers[layer_id] if self.layers else LayerOptions(None, self.rope)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise UnsupportedModelError(f"{path}: config.json not found") from e
        except json.JSONDecodeError as e:
            raise UnsupportedModelError(f"{path}: config.json is not valid JSON ({e})") from e
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> ModelConfig:
        from radixlm.runtime.model.families import family_options  # it imports this module's types

        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise UnsupportedModelError(
                f"{source}: unsupported architecture {archs or raw.get('model_type')!r}; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        variant = SUPPORTED_ARCHITECTURES[arch]
        try:
            hidden = int(raw["hidden_size"])
            num_heads = int(raw["num_attention_heads"])
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            common: dict[str, Any] = dict(
                architecture=arch,
                variant=variant,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or hidden // num_heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                eos_token_ids=eos_ids,
                bos_token_id=raw.get("bos_token_id"),
                sliding_window=None,
            )
            return cls(**family_options(variant, raw, common, source))
        except KeyError as e:
            raise UnsupportedModelError(f"{source}: missing required field {e.args[0]!r}") from e
