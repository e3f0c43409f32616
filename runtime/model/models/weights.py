"""Map HF checkpoint tensors onto our fused Llama-family modules.

A checkpoint tensor is a float tensor or a `QuantizedTensor` (GGUF blocks kept from the file);
`quantize_to` quantizes float linear weights at load. A quantized linear layer keeps the
RMSNorm weight before it in the norm (a block-quantized weight cannot absorb it); float ones
absorb it as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from radixlm.kernels.quant import BLOCK, QuantizedTensor, quantize

if TYPE_CHECKING:
    from radixlm.runtime.model.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

Weight = torch.Tensor | QuantizedTensor


class WeightLoadError(ValueError):
    """The checkpoint lacks a tensor the model needs, or a tensor has the wrong shape."""


def to_interleaved_rope(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Permute the per-head rows of a q/k projection (weight or bias, or a q/k-norm weight with
    num_heads=1) from HF's half-split rotary layout to interleaved pairs: new row 2i+j of each head
    is old row j*head_dim/2 + i."""
    head_dim = w.shape[0] // num_heads
    rest = w.shape[1:]
    return w.reshape(num_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(w.shape)


def _rope_rows(w: Weight, num_heads: int) -> Weight:
    if isinstance(w, QuantizedTensor):  # whole rows of blocks move: the same permutation
        return QuantizedTensor(w.fmt, to_interleaved_rope(w.raw, num_heads), w.k)
    return to_interleaved_rope(w, num_heads)


def _fuse(parts: list[Weight], name: str) -> Weight:
    """Rows concatenated; quantized parts stay quantized if they share a format, else all are
    dequantized (a fused layer has one format)."""
    if all(isinstance(p, QuantizedTensor) for p in parts):
        if len({p.fmt for p in parts}) == 1:  # type: ignore[union-attr]
            return QuantizedTensor.cat(parts)  # type: ignore[arg-type]
    if any(isinstance(p, QuantizedTensor) for p in parts):
        logger.info("%s: parts in different formats; dequantized to float", name)
    return torch.cat([p.dequantize() if isinstance(p, QuantizedTensor) else p for p in parts])


def load_llama_weights(model: LlamaForCausalLM, state_dict: Mapping[str, Weight], quantize_to: str | None = None,
                       quant_mode: str = "float32") -> None:
    """Load HF-named weights. `quantize_to` (q8_0, q4_0, q4_1, w8a8_int8): float linear weights of
    the decoder layers are quantized (the embedding and lm_head stay float); `quant_mode`: how
    quantized layers multiply (kernels/quant.py MODES)."""
    cfg = model.cfg

    def take(name: str) -> Weight:
        if name not in state_dict:
            raise WeightLoadError(f"checkpoint has no tensor {name!r}")
        return state_dict[name]

    def put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise WeightLoadError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(value.shape)}")
        with torch.no_grad():
            param.copy_(value)

    def float_of(name: str) -> torch.Tensor:
        w = take(name)
        return w.dequantize() if isinstance(w, QuantizedTensor) else w

    def put_linear(linear: torch.nn.Module, weight: Weight, name: str, norm: torch.nn.Module | None = None,
                   norm_name: str | None = None, may_quantize: bool = True) -> None:
        """Our Linear stores [in, out]; the RMSNorm weight `norm_name` before it goes into its
        input rows (float) or into `norm` (quantized)."""
        if (quantize_to is not None and may_quantize and isinstance(weight, torch.Tensor)
                and weight.shape[1] % BLOCK == 0):
            weight = quantize(weight, quantize_to)
        if isinstance(weight, QuantizedTensor):
            if tuple(weight.shape) != (linear.out_features, linear.in_features):
                raise WeightLoadError(f"{name}: expected shape {(linear.out_features, linear.in_features)}, "
                                      f"got {tuple(weight.shape)}")
            linear.quantize_(weight, quant_mode)
            if norm_name is not None and norm is not None:
                norm.set_weight(float_of(norm_name))
            return
        if norm_name is not None:  # scale the input columns by the norm's weight
            weight = weight * float_of(norm_name)[None, :]
        put(linear.weight_t, weight.t(), name)

    embed = take("model.embed_tokens.weight")
    if isinstance(embed, QuantizedTensor):
        model.quantize_embedding(embed)
    else:
        put(model.embed_tokens.weight, embed, "model.embed_tokens.weight")
    # a tensor-parallel rank's lm_head is its rows of the vocabulary (tp_sharding.ShardedWeights)
    head = embed if cfg.tie_word_embeddings and getattr(state_dict, "vocab_part", None) is None \
        else take("lm_head.weight")
    put_linear(model.lm_head, head, "lm_head.weight", model.norm, "model.norm.weight", may_quantize=False)
    if isinstance(embed, QuantizedTensor) and model.lm_head.qweight is not None and head is embed:
        model.share_embedding_with_lm_head()
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        kinds = ["weight", "bias"] if cfg.attention_bias else ["weight"]
        for kind in kinds:
            q = _rope_rows(take(f"{attn}q_proj.{kind}"), cfg.num_heads)
            k = _rope_rows(take(f"{attn}k_proj.{kind}"), cfg.num_kv_heads)
            fused = _fuse([q, k, take(f"{attn}v_proj.{kind}")], f"{attn}qkv_proj.{kind}")
            if kind == "weight":
                put_linear(layer.qkv_proj, fused, f"{attn}qkv_proj.weight", layer.input_layernorm,
                           p + "input_layernorm.weight")
            else:
                put(layer.qkv_proj.bias, fused, f"{attn}qkv_proj.bias")
        put_linear(layer.o_proj, take(attn + "o_proj.weight"), attn + "o_proj.weight")
        if layer.o_proj.bias is not None:
            put(layer.o_proj.bias, take(attn + "o_proj.bias"), attn + "o_proj.bias")
        if layer.q_norm is not None and layer.k_norm is not None:
            put(layer.q_norm.weight, to_interleaved_rope(take(attn + "q_norm.weight"), 1), attn + "q_norm")
            put(layer.k_norm.weight, to_interleaved_rope(take(attn + "k_norm.weight"), 1), attn + "k_norm")
        mlp = p + "mlp."
        gate_up = _fuse([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")], mlp + "gate_up_proj")
        put_linear(layer.gate_up_proj, gate_up, mlp + "gate_up_proj", layer.post_attention_layernorm,
                   p + "post_attention_layernorm.weight")
        put_linear(layer.down_proj, take(mlp + "down_proj.weight"), mlp + "down_proj.weight")
