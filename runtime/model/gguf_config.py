"""A GGUF file's metadata as the HF config.json transformers' config class of its family holds.

`read_metadata(get, config_tensors, tensor_shapes, source)` reads `<arch>.*` and `tokenizer.ggml.*`
keys (through `get(key, default)`, which raises KeyError for a missing key without default) and
returns a frozen `GgufMetadata`; its `config` is what `AutoConfig.for_model(model_type, **fields)`
writes to config.json (save_pretrained's diff form), so defaults and derived fields (layer types,
rope parameters) are transformers' own. Floats stored as float32 come back as the shortest decimal.

Where llama.cpp does not store a field, we use the value llama.cpp itself assumes when it runs the
file (so a file behaves here as there): Gemma 2 / 3 scale queries by head_dim^-1/2 except the
27B models (by (hidden / heads)^-1/2); Gemma 3 alternates 5 sliding layers and 1 global layer
with local rope base 10000; SmolLM3 drops rope on every 4th layer; Qwen3-MoE and Mixtral
normalise the top-k routing weights, OLMoE does not (unless `expert_weights_norm` says); Granite
without `attention.scale` uses head_dim^-1/2; a sentencepiece vocabulary without
`add_bos_token` gets BOS. Llama-architecture files become LlamaForCausalLM (Mistral included:
llama.cpp keeps no sliding window for them) or, with experts, MixtralForCausalLM.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlm.runtime.model.gguf_arch import ARCHES, GgufArch, arch_for
from radixlm.runtime.model.model_files import ModelLoadError

Getter = Callable[..., Any]  # get(key) or get(key, default)


def _f32(value: Any) -> float:
    """A float GGUF stores as float32, as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06), as the HF config had it before conversion."""
    return float(str(np.float32(value)))


@dataclass(frozen=True)
class GgufMetadata:
    """What the conversion needs from the metadata. `config` is the config.json dict."""

    arch: GgufArch
    config: dict[str, Any]
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int
    context_length: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None
    tokenizer_pre: str | None


def read_metadata(
    get: Getter, config_tensors: Mapping[str, np.ndarray], tensor_shapes: Mapping[str, tuple[int, ...]], source: str
) -> GgufMetadata:
    """The metadata of a GGUF file (`source` names it in errors); ModelLoadError if we cannot read it."""
    try:
        return _read_metadata(get, config_tensors, tensor_shapes, source)
    except KeyError as e:
        raise ModelLoadError(f"{source}: GGUF metadata key {e.args[0]!r} is missing") from e
    except _Unsupported as e:
        raise ModelLoadError(f"{source}: unsupported GGUF model: {e}") from e


class _Unsupported(ValueError):
    """Something in the metadata we cannot express as an HF config (the caller adds the file)."""


def _read_metadata(
    get: Getter, config_tensors: Mapping[str, np.ndarray], tensor_shapes: Mapping[str, tuple[int, ...]], source: str
) -> GgufMetadata:
    from transformers import AutoConfig

    name = str(get("general.architecture"))
    num_experts = int(get(f"{name}.expert_count", 0))
    arch = arch_for(name, num_experts)
    if arch is None and name in ARCHES:
        has = f"{num_experts} experts" if num_experts else "no experts"
        raise _Unsupported(f"a {name!r} file with {has} ({name}.expert_count), unlike every {name} model")
    if arch is None:
        raise ModelLoadError(
            f"{source}: unsupported GGUF architecture {name!r} (supported: {', '.join(_supported())})"
        )
    fields = _common_fields(get, name, tensor_shapes)
    fields.update(_FAMILY_FIELDS[arch.model_type](get, name, fields, config_tensors, tensor_shapes))
    _check_rotary(get, name, fields, source)
    try:
        config = json.loads(AutoConfig.for_model(arch.model_type, **fields).to_json_string(use_diff=True))
    except (ValueError, TypeError, KeyError) as e:
        raise ModelLoadError(f"{source}: the GGUF metadata makes no valid {arch.model_type} config: {e}") from e
    config.update(architectures=[arch.architecture], dtype="float32")
    config.pop("transformers_version", None)
    return GgufMetadata(
        arch=arch,
        config=config,
        num_layers=fields["num_hidden_layers"],
        num_heads=fields["num_attention_heads"],
        num_kv_heads=fields["num_key_value_heads"],
        num_experts=num_experts,
        context_length=fields["max_position_embeddings"],
        bos_token_id=fields["bos_token_id"],
        eos_token_id=fields["eos_token_id"],
        pad_token_id=fields["pad_token_id"],
        # llama.cpp adds BOS to a sentencepiece ("llama") vocabulary unless the file says otherwise
        add_bos_token=bool(get("tokenizer.ggml.add_bos_token", get("tokenizer.ggml.model", None) == "llama")),
        chat_template=get("tokenizer.chat_template", None),
        tokenizer_pre=get("tokenizer.ggml.pre", None),
    )


def _supported() -> list[str]:
    return [*ARCHES, "llama with experts (Mixtral)"]


def _common_fields(get: Getter, a: str, tensor_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    hidden = int(get(f"{a}.embedding_length"))
    heads = _per_layer_constant(get(f"{a}.attention.head_count"), f"{a}.attention.head_count")
    kv_heads = _per_layer_constant(get(f"{a}.attention.head_count_kv", heads), f"{a}.attention.head_count_kv")
    # llama.cpp writes no vocab_size for most families: the embedding's rows are the vocabulary
    embedding = tensor_shapes.get("token_embd.weight")
    return dict(
        vocab_size=int(get(f"{a}.vocab_size", embedding[0] if embedding else len(get("tokenizer.ggml.tokens")))),
        hidden_size=hidden,
        intermediate_size=int(get(f"{a}.feed_forward_length", 0)),
        num_hidden_layers=int(get(f"{a}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(get(f"{a}.attention.key_length", hidden // heads)),
        max_position_embeddings=int(get(f"{a}.context_length")),
        rms_norm_eps=_f32(get(f"{a}.attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in tensor_shapes,
        bos_token_id=get("tokenizer.ggml.bos_token_id", None),
        eos_token_id=get("tokenizer.ggml.eos_token_id", None),
        pad_token_id=get("tokenizer.ggml.padding_token_id", None),
    )


def _optional_f32(value: Any) -> float | None:
    return None if value is None else _f32(value)


def _per_layer_constant(value: Any, key: str) -> int:
    """A count that some files give per layer (an array): we read only files where all are equal."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise _Unsupported(f"{key} differs between layers ({value})")
        value = value[0]
    return int(value)


def _check_rotary(get: Getter, a: str, fields: dict[str, Any], source: str) -> None:
    rotary = int(get(f"{a}.rope.dimension_count", fields["head_dim"]))
    factor = fields.get("rope_parameters", {}).get("partial_rotary_factor", 1.0)
    if rotary != round(fields["head_dim"] * factor):
        raise _Unsupported(f"partial rotary embedding ({rotary} of {fields['head_dim']} dimensions)")


def _rope(get: Getter, a: str, default_theta: float = 10000.0) -> dict[str, Any]:
    """HF rope parameters from the `<arch>.rope.*` keys (no scaling, linear or yarn)."""
    theta = _f32(get(f"{a}.rope.freq_base", default_theta))
    kind = get(f"{a}.rope.scaling.type", "none")
    if kind == "none":
        return {"rope_type": "default", "rope_theta": theta}
    if kind not in ("linear", "yarn"):
        raise _Unsupported(f"rope scaling {kind!r} (supported: none, linear, yarn; Llama 3's as rope_freqs)")
    factor = _f32(get(f"{a}.rope.scaling.factor"))
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": factor}
    original = int(get(f"{a}.rope.scaling.original_context_length"))
    return {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": original}


def llama3_rope(rope_freqs: np.ndarray, theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3 rope parameters recovered from llama.cpp's `rope_freqs` tensor.

    llama.cpp stores, per frequency, the divisor 1 (short wavelengths), `factor` (long ones) or
    1 / ((1 - s) / factor + s) with s = (old_ctx / wavelen - low) / (high - low) in between. The
    smooth band gives s as a line in 1 / wavelen: slope old_ctx / (high - low), intercept
    -low / (high - low). One more equation is needed: every Llama 3.x has low_freq_factor = 1,
    which we assume (and check: the recovered parameters must reproduce the tensor).
    """
    divisors = np.asarray(rope_freqs, dtype=np.float64)
    factor = float(divisors.max())
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (divisors > 1.0 + 1e-6) & (divisors < factor - 1e-6 * factor)
    if factor <= 1.0 or smooth.sum() < 2:
        raise _Unsupported("rope_freqs tensor (not a Llama 3 rope scaling)")
    s = (1.0 / divisors[smooth] - 1.0 / factor) / (1.0 - 1.0 / factor)
    slope, intercept = np.polyfit(1.0 / wavelen[smooth], s, 1)
    low = 1.0
    high = low - low / intercept
    original = slope * (high - low)
    params = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": round(high, 3),
        "original_max_position_embeddings": int(round(original)),
    }
    if not np.allclose(_llama3_divisors(params, wavelen), divisors, rtol=1e-4):
        raise _Unsupported("rope_freqs tensor (no Llama 3 parameters reproduce it)")
    return params


def _llama3_divisors(p: dict[str, Any], wavelen: np.ndarray) -> np.ndarray:
    old, factor = p["original_max_position_embeddings"], p["factor"]
    low_wavelen, high_wavelen = old / p["low_freq_factor"], old / p["high_freq_factor"]
    s = (old / wavelen - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
    mid = 1.0 / ((1 - s) / factor + s)
    return np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, factor, mid))


FamilyFields = Callable[
    [Getter, str, dict[str, Any], Mapping[str, np.ndarray], Mapping[str, tuple[int, ...]]], dict[str, Any]
]


def _llama(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    rope = _rope(get, a)
    if "rope_freqs.weight" in tensors:
        rope = llama3_rope(tensors["rope_freqs.weight"], rope["rope_theta"], f["head_dim"])
    return dict(rope_parameters=rope, attention_bias="blk.0.attn_q.bias" in names, mlp_bias=False)


def _mixtral(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(
        rope_parameters=_rope(get, a),
        num_local_experts=int(get(f"{a}.expert_count")),
        num_experts_per_tok=int(get(f"{a}.expert_used_count")),
        sliding_window=get(f"{a}.attention.sliding_window", None),
    )


def _plain(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(rope_parameters=_rope(get, a))


def _qwen2(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(rope_parameters=_rope(get, a), use_sliding_window=False)


def _qwen3_moe(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    moe_size = int(get(f"{a}.expert_feed_forward_length"))
    return dict(
        rope_parameters=_rope(get, a),
        num_experts=int(get(f"{a}.expert_count")),
        num_experts_per_tok=int(get(f"{a}.expert_used_count")),
        moe_intermediate_size=moe_size,
        intermediate_size=f["intermediate_size"] or moe_size,
        norm_topk_prob=bool(get(f"{a}.expert_weights_norm", True)),
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def _olmoe(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(
        rope_parameters=_rope(get, a),
        num_experts=int(get(f"{a}.expert_count")),
        num_experts_per_tok=int(get(f"{a}.expert_used_count")),
        intermediate_size=int(get(f"{a}.expert_feed_forward_length", f["intermediate_size"])),
        norm_topk_prob=bool(get(f"{a}.expert_weights_norm", False)),
    )


def _gemma_query_scalar(f: dict[str, Any]) -> float:
    is_27b = f["num_hidden_layers"] in (46, 62)  # Gemma 2 27B, Gemma 3 27B (llama.cpp's rule)
    return f["hidden_size"] / f["num_attention_heads"] if is_27b else f["head_dim"]


def _gemma2(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(
        rope_parameters=_rope(get, a),
        attn_logit_softcapping=_optional_f32(get(f"{a}.attn_logit_softcapping", None)),
        final_logit_softcapping=_optional_f32(get(f"{a}.final_logit_softcapping", None)),
        sliding_window=int(get(f"{a}.attention.sliding_window")),
        query_pre_attn_scalar=_gemma_query_scalar(f),
    )


def _gemma3(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    full = _rope(get, a, default_theta=1000000.0)
    local = {"rope_type": "default", "rope_theta": _f32(get(f"{a}.rope.freq_base_swa", 10000.0))}
    out: dict[str, Any] = dict(
        rope_parameters={"full_attention": full, "sliding_attention": local},
        sliding_window=int(get(f"{a}.attention.sliding_window")),
        query_pre_attn_scalar=_gemma_query_scalar(f),
        final_logit_softcapping=_optional_f32(get(f"{a}.final_logit_softcapping", None)),
        attn_logit_softcapping=_optional_f32(get(f"{a}.attn_logit_softcapping", None)),
    )
    pattern = get(f"{a}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # one flag per layer: True = sliding
        out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        n = int(pattern)
        out["layer_types"] = [
            "full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(f["num_hidden_layers"])
        ]
    return out


def _phi3(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    rotary = int(get(f"{a}.rope.dimension_count", f["head_dim"]))
    rope = _rope(get, a)
    rope["partial_rotary_factor"] = rotary / f["head_dim"]
    original = int(get(f"{a}.rope.scaling.original_context_length", f["max_position_embeddings"]))
    if "rope_factors_long.weight" in tensors:
        rope.update(
            rope_type="longrope",
            long_factor=[_f32(x) for x in tensors["rope_factors_long.weight"]],
            short_factor=[_f32(x) for x in tensors["rope_factors_short.weight"]],
            original_max_position_embeddings=original,
        )
    window = get(f"{a}.attention.sliding_window", None)
    return dict(rope_parameters=rope, original_max_position_embeddings=original, sliding_window=window)


def _granite(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(
        rope_parameters=_rope(get, a),
        embedding_multiplier=_f32(get(f"{a}.embedding_scale", 1.0)),
        residual_multiplier=_f32(get(f"{a}.residual_scale", 1.0)),
        logits_scaling=_f32(get(f"{a}.logit_scale", 1.0)),
        attention_multiplier=_f32(get(f"{a}.attention.scale", f["head_dim"] ** -0.5)),
        attention_bias="blk.0.attn_q.bias" in names,
    )


def _smollm3(get: Getter, a: str, f: dict[str, Any], tensors: Mapping[str, np.ndarray], names: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    return dict(rope_parameters=_rope(get, a), use_sliding_window=False, no_rope_layer_interval=4)


_FAMILY_FIELDS: dict[str, FamilyFields] = {
    "llama": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _plain,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "phi3": _phi3,
    "olmo2": _plain,
    "granite": _granite,
    "smollm3": _smollm3,
}
