"""Each architecture's config.json turned into ModelConfig's typed options, once, at load.

model_config.SUPPORTED_ARCHITECTURES maps the architectures we implement to their variant;
`family_options` takes the fields every family shares (parsed by ModelConfig.from_dict) and adds
what the variant's parser here says.
Defaults where a config.json omits a field are those of the family's transformers config class;
an option we do not implement is refused here, by name, never ignored."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from radixlm.runtime.model.model_config import Activation, LayerOptions, RopeConfig, UnsupportedModelError

Raw = dict[str, Any]
_ACTIVATIONS: dict[str, Activation] = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def family_options(variant: str, raw: Raw, common: dict[str, Any], source: str) -> dict[str, Any]:
    """ModelConfig's keyword arguments: `common` plus the variant's options."""
    if variant not in _PARSERS:
        raise UnsupportedModelError(f"{source}: no options parser for the {variant!r} variant")
    opts = dict(common)
    opts.update(_PARSERS[variant](raw, opts, source))
    return opts


def rope_config(params: Raw, raw: Raw, source: str, head_dim: int) -> RopeConfig:
    """One rotary embedding from a rope-parameters dict (transformers >= 5 `rope_parameters`, or
    older `rope_scaling` merged with the top-level `rope_theta`)."""
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    if kind not in ("default", "linear", "llama3", "longrope"):
        raise UnsupportedModelError(f"{source}: unsupported rope scaling type {kind!r}")
    rope = RopeConfig(
        theta=theta,
        scaling_type=kind,
        factor=float(params.get("factor") or 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        partial_rotary_factor=partial,
    )
    if rope.rotary_dim(head_dim) % 2:
        raise UnsupportedModelError(f"{source}: partial_rotary_factor {partial} gives an odd rotary dim")
    return _longrope(rope, params, raw, source, head_dim) if kind == "longrope" else rope


def _longrope(rope: RopeConfig, params: Raw, raw: Raw, source: str, head_dim: int) -> RopeConfig:
    """LongRoPE as transformers computes it: the top-level original_max_position_embeddings wins;
    without `factor`, max / original; without `attention_factor`, sqrt(1 + ln(factor) / ln(original))."""
    original = int(raw.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                   or raw.get("max_position_embeddings", 2048))
    factor = params.get("factor")
    factor = float(factor) if factor is not None else int(raw.get("max_position_embeddings", 2048)) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    short, long = tuple(map(float, params.get("short_factor") or ())), tuple(map(float, params.get("long_factor") or ()))
    half = rope.rotary_dim(head_dim) // 2
    if len(short) != half or len(long) != half:
        raise UnsupportedModelError(f"{source}: longrope needs short_factor and long_factor of {half} values each")
    return RopeConfig(rope.theta, "longrope", factor, original_max_position_embeddings=original,
                      partial_rotary_factor=rope.partial_rotary_factor, short_factor=short, long_factor=long,
                      attention_factor=float(attention))


def _rope_params(raw: Raw) -> Raw:
    params = dict(raw.get("rope_parameters") or {})
    params.update(raw.get("rope_scaling") or {})
    return params


def _activation(raw: Raw, source: str, default: str = "silu") -> Activation:
    name = raw.get("hidden_activation") or raw.get("hidden_act") or default
    if name not in _ACTIVATIONS:
        raise UnsupportedModelError(f"{source}: unsupported activation {name!r}; supported: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _layer_windows(raw: Raw, num_layers: int, pattern: int, source: str) -> list[int | None]:
    """Each layer's window from `layer_types` (or, without it, every `pattern`-th layer full)."""
    window = raw.get("sliding_window")
    types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise UnsupportedModelError(f"{source}: layer_types must name sliding_attention or full_attention per layer")
    if "sliding_attention" in types and not window:
        raise UnsupportedModelError(f"{source}: sliding_attention layers but no sliding_window")
    return [int(window) if t == "sliding_attention" else None for t in types]


def _llama(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """Llama, Mistral, Qwen2, Qwen3 (and the attention of Qwen3-MoE and Mixtral): a window caps
    the context rather than cutting it."""
    variant = opts["variant"]
    use_sliding = raw.get("use_sliding_window", variant in ("mistral", "mixtral"))
    window = raw.get("sliding_window") if use_sliding else None
    bias = bool(raw.get("attention_bias", False))
    return dict(
        rope=rope_config(_rope_params(raw), raw, source, opts["head_dim"]),
        # Qwen2 always has q/k/v biases and never an o_proj bias; the others follow the flag.
        attention_bias=variant == "qwen2" or bias,
        o_proj_bias=variant != "qwen2" and bias,
        qk_norm="head" if variant in ("qwen3", "qwen3_moe") else "none",
        hidden_act=_activation(raw, source),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=int(window) if window else None,
    )


def _gemma(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """Gemma 2 and Gemma 3 (text): sandwich norms scaling by 1 + weight, GELU-tanh, embeddings
    times sqrt(hidden), scores scaled by query_pre_attn_scalar^-0.5, local and global layers.
    Gemma 2 soft-caps the attention scores (Gemma 3's modeling code passes no soft-cap to its
    attention, so neither do we) and both soft-cap the logits as their configs say."""
    is_gemma3 = opts["variant"] == "gemma3"
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError(f"{source}: use_bidirectional_attention is not supported (causal decoders only)")
    head_dim = int(raw.get("head_dim") or 256)  # the config classes' default, not hidden / heads
    pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6) if is_gemma3 else 2
    if "sliding_window" not in raw:
        raw = dict(raw, sliding_window=4096)
    windows = _layer_windows(raw, opts["num_layers"], pattern, source)
    global_rope, local_rope = _gemma_ropes(raw, source, head_dim) if is_gemma3 else (None, None)
    if not is_gemma3:
        global_rope = local_rope = rope_config(_rope_params(raw), raw, source, head_dim)
    assert global_rope is not None and local_rope is not None
    bias = bool(raw.get("attention_bias", False))
    return dict(
        head_dim=head_dim,
        rope=global_rope,
        attention_bias=bias,
        o_proj_bias=bias,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        norm_layout="sandwich",
        norm_weight_offset=1.0,
        qk_norm="head" if is_gemma3 else "none",
        hidden_act=_activation(raw, source, "gelu_pytorch_tanh"),
        embedding_scale=opts["hidden_size"] ** 0.5,
        attention_scaling=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_logit_softcap=None if is_gemma3 else _cap(raw.get("attn_logit_softcapping", 50.0)),
        final_logit_softcap=_cap(raw.get("final_logit_softcapping", None if is_gemma3 else 30.0)),
        layers=tuple(LayerOptions(w, local_rope if w is not None else global_rope) for w in windows),
    )


def _cap(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _gemma_ropes(raw: Raw, source: str, head_dim: int) -> tuple[RopeConfig, RopeConfig]:
    """Gemma 3's global (full-attention) and local (sliding) rotary embeddings: transformers >= 5
    nests them in rope_parameters by layer type; older configs give rope_theta (global, scaled by
    rope_scaling) and rope_local_base_freq (local)."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {"rope_theta": 1_000_000.0})
        local = dict(params.get("sliding_attention") or {"rope_theta": 10_000.0})
    else:
        full = {"rope_theta": raw.get("rope_theta", params.get("rope_theta", 1_000_000.0))}
        full.update(raw.get("rope_scaling") or {})
        local = {"rope_theta": raw.get("rope_local_base_freq", 10_000.0)}
    return rope_config(full, raw, source, head_dim), rope_config(local, raw, source, head_dim)


def _phi3(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj in the checkpoint (split at load),
    longrope, partial rotary, and a window on every layer when sliding_window is set."""
    params = _rope_params(raw)
    if params.get("rope_type", params.get("type")) in ("su", "yarn"):  # Phi-3's older names for longrope
        params["rope_type"] = "longrope"
    rope = rope_config(params, raw, source, opts["head_dim"])
    window = raw.get("sliding_window")
    return dict(rope=rope, attention_bias=False, o_proj_bias=False, hidden_act=_activation(raw, source),
                layers=tuple(LayerOptions(int(window) if window else None, rope) for _ in range(opts["num_layers"])))


def _olmo2(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """OLMo 2: RMSNorm on each sublayer's output only; q/k RMSNorm over the whole projection."""
    bias = bool(raw.get("attention_bias", False))
    return dict(rope=rope_config(_rope_params(raw), raw, source, opts["head_dim"]), attention_bias=bias,
                o_proj_bias=bias, norm_layout="post", qk_norm="projection", hidden_act=_activation(raw, source))


def _granite(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """Granite: Llama with embedding, residual and attention multipliers and logits divided by logits_scaling."""
    bias = bool(raw.get("attention_bias", False))
    return dict(
        rope=rope_config(_rope_params(raw), raw, source, opts["head_dim"]), attention_bias=bias, o_proj_bias=bias,
        hidden_act=_activation(raw, source), mlp_bias=bool(raw.get("mlp_bias", False)),
        embedding_scale=float(raw.get("embedding_multiplier", 1.0)),
        residual_scale=float(raw.get("residual_multiplier", 1.0)),
        attention_scaling=float(raw.get("attention_multiplier", 1.0)),
        logits_scaling=float(raw.get("logits_scaling", 1.0)),
    )


def _smollm3(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """SmolLM3: `no_rope_layers[i]` is 1 where layer i applies RoPE, 0 where it does not (default:
    every `no_rope_layer_interval`-th layer has none); windows where layer_types says sliding."""
    n = opts["num_layers"]
    rope = rope_config(_rope_params(raw), raw, source, opts["head_dim"])
    interval = int(raw.get("no_rope_layer_interval", 4))
    uses_rope = raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(uses_rope) != n:
        raise UnsupportedModelError(f"{source}: no_rope_layers must have one entry per layer")
    window = raw.get("sliding_window")
    types = raw.get("layer_types") or [
        "sliding_attention" if raw.get("use_sliding_window") and window and not uses_rope[i] else "full_attention"
        for i in range(n)]
    windows = _layer_windows(dict(raw, layer_types=types), n, 1, source)
    bias = bool(raw.get("attention_bias", False))
    return dict(
        rope=rope, attention_bias=bias, o_proj_bias=bias, hidden_act=_activation(raw, source),
        mlp_bias=bool(raw.get("mlp_bias", False)), tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        layers=tuple(LayerOptions(w, rope if used else None) for w, used in zip(windows, uses_rope)),
    )


def _moe(raw: Raw, opts: dict[str, Any], source: str) -> dict[str, Any]:
    """Qwen3-MoE (Qwen3's attention), Mixtral (Mistral's) and OLMoE (OLMo 2's q/k norm over the
    whole projection, but norms before the sublayers), each with its experts (models/moe.py)."""
    from radixlm.runtime.model.models.moe import moe_options_from_hf  # imports torch modules

    variant = opts["variant"]
    if variant == "olmoe":
        if raw.get("clip_qkv") is not None:
            raise UnsupportedModelError(f"{source}: OLMoE's clip_qkv is not supported")
        bias = bool(raw.get("attention_bias", False))
        out = dict(rope=rope_config(_rope_params(raw), raw, source, opts["head_dim"]), attention_bias=bias,
                   o_proj_bias=bias, qk_norm="projection", hidden_act=_activation(raw, source))
    else:
        out = _llama(raw, opts, source)
    if variant != "qwen3_moe":  # their config classes' default; Qwen3-MoE's is ours (1e-6)
        out["rms_norm_eps"] = float(raw.get("rms_norm_eps", 1e-5))
    try:
        out["moe"] = moe_options_from_hf(dict(raw, architectures=[opts["architecture"]]))
    except ValueError as e:
        raise UnsupportedModelError(f"{source}: {e}") from e
    return out


_PARSERS: dict[str, Callable[[Raw, dict[str, Any], str], dict[str, Any]]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "gemma2": _gemma, "gemma3": _gemma,
    "phi3": _phi3, "olmo2": _olmo2, "granite": _granite, "smollm3": _smollm3,
    "qwen3_moe": _moe, "mixtral": _moe, "olmoe": _moe,
}
