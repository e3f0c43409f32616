"""The model's shape and options, read once from an HF `config.json` into a frozen dataclass."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Architectures our decoder implements; the value says which variant-specific parts apply.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    """The config names an architecture or option this runtime does not implement."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    scaling_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
    has_qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    sliding_window: int | None

    @property
    def context_len(self) -> int:
        """Longest sequence (prompt + output) the model serves."""
        if self.sliding_window is not None:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

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
            use_sliding = raw.get("use_sliding_window", variant == "mistral")
            window = raw.get("sliding_window") if use_sliding else None
            return cls(
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
                rope=_rope_config(raw, source),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases and never an o_proj bias; the others follow the flag.
                attention_bias=variant == "qwen2" or bool(raw.get("attention_bias", False)),
                o_proj_bias=variant != "qwen2" and bool(raw.get("attention_bias", False)),
                has_qk_norm=variant == "qwen3",
                eos_token_ids=eos_ids,
                bos_token_id=raw.get("bos_token_id"),
                sliding_window=int(window) if window else None,
            )
        except KeyError as e:
            raise UnsupportedModelError(f"{source}: missing required field {e.args[0]!r}") from e


def _rope_config(raw: dict[str, Any], source: str) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older configs use rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    params.update(scaling)
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(f"{source}: unsupported rope scaling type {kind!r}")
    return RopeConfig(
        theta=theta,
        scaling_type=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
