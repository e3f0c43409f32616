"""Map HF checkpoint tensors onto our fused Llama-family modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.model.models.llama import LlamaForCausalLM


class WeightLoadError(ValueError):
    """The checkpoint lacks a tensor the model needs, or a tensor has the wrong shape."""


def to_interleaved_rope(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Permute the per-head rows of a q/k projection (weight or bias, or a q/k-norm weight with
    num_heads=1) from HF's half-split rotary layout to interleaved pairs: new row 2i+j of each head
    is old row j*head_dim/2 + i."""
    head_dim = w.shape[0] // num_heads
    rest = w.shape[1:]
    return w.reshape(num_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(w.shape)


def load_llama_weights(model: LlamaForCausalLM, state_dict: Mapping[str, torch.Tensor]) -> None:
    cfg = model.cfg

    def take(name: str) -> torch.Tensor:
        if name not in state_dict:
            raise WeightLoadError(f"checkpoint has no tensor {name!r}")
        return state_dict[name]

    def put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise WeightLoadError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(value.shape)}")
        with torch.no_grad():
            param.copy_(value)

    def put_linear(linear: torch.nn.Module, weight: torch.Tensor, name: str) -> None:
        put(linear.weight_t, weight.t(), name)  # our Linear stores [in, out]

    def fold_norm(weight: torch.Tensor, norm_name: str) -> torch.Tensor:
        """Scale a linear weight's input columns by the RMSNorm weight that precedes it."""
        return weight * take(norm_name)[None, :]

    embed = take("model.embed_tokens.weight")
    put(model.embed_tokens.weight, embed, "model.embed_tokens.weight")
    head = embed if cfg.tie_word_embeddings else take("lm_head.weight")
    put_linear(model.lm_head, fold_norm(head, "model.norm.weight"), "lm_head.weight")
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        kinds = ["weight", "bias"] if cfg.attention_bias else ["weight"]
        for kind in kinds:
            q = to_interleaved_rope(take(f"{attn}q_proj.{kind}"), cfg.num_heads)
            k = to_interleaved_rope(take(f"{attn}k_proj.{kind}"), cfg.num_kv_heads)
            v = take(f"{attn}v_proj.{kind}")
            fused = torch.cat([q, k, v])
            if kind == "weight":
                put_linear(layer.qkv_proj, fold_norm(fused, p + "input_layernorm.weight"), f"{attn}qkv_proj.weight")
            else:
                put(layer.qkv_proj.bias, fused, f"{attn}qkv_proj.bias")
        put_linear(layer.o_proj, take(attn + "o_proj.weight"), attn + "o_proj.weight")
        if layer.o_proj.bias is not None:
            put(layer.o_proj.bias, take(attn + "o_proj.bias"), attn + "o_proj.bias")
        if layer.q_norm is not None and layer.k_norm is not None:
            put(layer.q_norm.weight, to_interleaved_rope(take(attn + "q_norm.weight"), 1), attn + "q_norm")
            put(layer.k_norm.weight, to_interleaved_rope(take(attn + "k_norm.weight"), 1), attn + "k_norm")
        mlp = p + "mlp."
        gate_up = torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")])
        put_linear(layer.gate_up_proj, fold_norm(gate_up, p + "post_attention_layernorm.weight"), mlp + "gate_up_proj")
        put_linear(layer.down_proj, take(mlp + "down_proj.weight"), mlp + "down_proj.weight")
