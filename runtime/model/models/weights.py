"""Map HF checkpoint tensors of every dense family onto our fused modules (models/decoder_layer.py).

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
from radixlm.runtime.model.models.decoder_layer import DecoderLayer, DenseMLP
from radixlm.runtime.model.models.layers import Linear, RMSNorm, release_freed_memory

if TYPE_CHECKING:
    from radixlm.runtime.model.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

Weight = torch.Tensor | QuantizedTensor


class WeightLoadError(ValueError):
    """The checkpoint lacks a tensor the model needs, or a tensor has the wrong shape."""


def to_interleaved_rope(w: torch.Tensor, num_heads: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Permute the per-head rows of a q/k projection (weight or bias, or a q/k-norm weight) from
    HF's half-split rotary layout to interleaved pairs: new row 2i+j of each head is old row
    j*rotary_dim/2 + i, for the head's first `rotary_dim` rows (default: all); the rest stay."""
    head_dim = w.shape[0] // num_heads
    rot = rotary_dim or head_dim
    rest = w.shape[1:]
    heads = w.reshape(num_heads, head_dim, *rest)
    rotated = heads[:, :rot].reshape(num_heads, 2, rot // 2, *rest).transpose(1, 2).reshape(num_heads, rot, *rest)
    return torch.cat([rotated, heads[:, rot:]], dim=1).reshape(w.shape)


def _rope_rows(w: Weight, num_heads: int, rotary_dim: int) -> Weight:
    if isinstance(w, QuantizedTensor):  # whole rows of blocks move: the same permutation
        return QuantizedTensor(w.fmt, to_interleaved_rope(w.raw, num_heads, rotary_dim), w.k)
    return to_interleaved_rope(w, num_heads, rotary_dim)


def _split_rows(w: Weight, sizes: list[int]) -> list[Weight]:
    """A fused checkpoint tensor (Phi-3's qkv_proj / gate_up_proj) cut into its parts' rows."""
    if tuple(w.shape)[0] != sum(sizes):
        raise WeightLoadError(f"a fused tensor has {tuple(w.shape)[0]} rows, expected {sum(sizes)}")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    if isinstance(w, QuantizedTensor):
        return [w.rows(slice(s, s + n)) for s, n in zip(starts, sizes)]
    return [w[s: s + n] for s, n in zip(starts, sizes)]


def _fuse(parts: list[Weight], name: str) -> Weight | list[QuantizedTensor]:
    """Rows concatenated. Quantized parts stay quantized: in one tensor if they share a format,
    else as a list of row blocks, adjacent parts of one format joined (a Q4_K_M file's q and k in
    Q4_K, then v in Q6_K: the layer holds one product per block, Linear.quantize_parts_). A mix of
    float and quantized parts is dequantized to float."""
    if all(isinstance(p, QuantizedTensor) for p in parts):
        blocks: list[QuantizedTensor] = []
        for part in parts:
            assert isinstance(part, QuantizedTensor)
            if blocks and blocks[-1].fmt == part.fmt:
                blocks[-1] = QuantizedTensor.cat([blocks[-1], part])
            else:
                blocks.append(part)
        return blocks[0] if len(blocks) == 1 else blocks
    if any(isinstance(p, QuantizedTensor) for p in parts):
        logger.info("%s: float and quantized parts; dequantized to float", name)
    return torch.cat([p.dequantize() if isinstance(p, QuantizedTensor) else p for p in parts])


# Our layer's norms by role, and the checkpoint's name for each, per norm layout
# (models/decoder_layer.py): the ones before a sublayer are folded into its input product.
_NORM_NAMES = {
    "pre": {"input_layernorm": "input_layernorm", "pre_mlp_norm": "post_attention_layernorm"},
    "sandwich": {"input_layernorm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                 "pre_mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"},
    "post": {"attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"},
}


class _Loader:
    """Puts HF-named tensors into a model's modules (see load_llama_weights)."""

    def __init__(self, model: LlamaForCausalLM, state_dict: Mapping[str, Weight], quantize_to: str | None,
                 quant_mode: str):
        self.model, self.cfg, self.state_dict = model, model.cfg, state_dict
        self.quantize_to, self.quant_mode = quantize_to, quant_mode

    def take(self, name: str) -> Weight:
        if name not in self.state_dict:
            raise WeightLoadError(f"checkpoint has no tensor {name!r}")
        return self.state_dict[name]

    @staticmethod
    def put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise WeightLoadError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(value.shape)}")
        with torch.no_grad():
            param.copy_(value)

    def float_of(self, name: str) -> torch.Tensor:
        w = self.take(name)
        return w.dequantize() if isinstance(w, QuantizedTensor) else w

    def norm_weight(self, name: str) -> torch.Tensor:
        """An RMSNorm's scale: its weight, plus Gemma's offset of 1."""
        w = self.float_of(name)
        return w + self.cfg.norm_weight_offset if self.cfg.norm_weight_offset else w

    def put_linear(self, linear: Linear, weight: Weight | list[QuantizedTensor], name: str,
                   norm: RMSNorm | None = None, norm_name: str | None = None, may_quantize: bool = True) -> None:
        """Our Linear stores [in, out]; the RMSNorm weight `norm_name` before it goes into its
        input rows (float) or into `norm` (quantized). A list: row blocks in their own formats."""
        if isinstance(weight, list):
            try:
                linear.quantize_parts_(weight, self.quant_mode)
            except ValueError as e:
                raise WeightLoadError(f"{name}: {e}") from e
            if norm_name is not None and norm is not None:
                norm.set_weight(self.norm_weight(norm_name))
            return
        if (self.quantize_to is not None and may_quantize and isinstance(weight, torch.Tensor)
                and weight.shape[1] % BLOCK == 0):
            weight = quantize(weight, self.quantize_to)
        if isinstance(weight, QuantizedTensor):
            if tuple(weight.shape) != (linear.out_features, linear.in_features):
                raise WeightLoadError(f"{name}: expected shape {(linear.out_features, linear.in_features)}, "
                                      f"got {tuple(weight.shape)}")
            linear.quantize_(weight, self.quant_mode)
            if norm_name is not None and norm is not None:
                norm.set_weight(self.norm_weight(norm_name))
            return
        if norm_name is not None:  # scale the input columns by the norm's weight
            weight = weight * self.norm_weight(norm_name)[None, :]
        self.put(linear.weight_t, weight.t(), name)

    def load(self) -> None:
        model, cfg = self.model, self.cfg
        embed = self.take("model.embed_tokens.weight")
        if isinstance(embed, QuantizedTensor):
            model.quantize_embedding(embed)
        else:
            self.put(model.embed_tokens.weight, embed, "model.embed_tokens.weight")
        # a tensor-parallel rank's lm_head is its rows of the vocabulary (tp_sharding.ShardedWeights)
        head = embed if cfg.tie_word_embeddings and getattr(self.state_dict, "vocab_part", None) is None \
            else self.take("lm_head.weight")
        self.put_linear(model.lm_head, head, "lm_head.weight", model.norm, "model.norm.weight", may_quantize=False)
        if isinstance(embed, QuantizedTensor) and model.lm_head.qweight is not None and head is embed:
            model.share_embedding_with_lm_head()
        for i, layer in enumerate(model.layers):
            assert isinstance(layer, DecoderLayer)
            p = f"model.layers.{i}."
            norms = {role: p + hf + ".weight" for role, hf in _NORM_NAMES[cfg.norm_layout].items()}
            for role in ("attn_out_norm", "mlp_out_norm"):
                if role in norms:
                    self.put(getattr(layer, role).weight, self.norm_weight(norms[role]), norms[role])
            self.load_attention(layer, p + "self_attn.", norms.get("input_layernorm"))
            if isinstance(layer.mlp, DenseMLP):
                self.load_dense_mlp(layer, layer.mlp, p + "mlp.", norms.get("pre_mlp_norm"))
            else:  # a block with its own loader (models/moe.py) reading the normed input, weight included
                if layer.pre_mlp_norm is not None and "pre_mlp_norm" in norms:
                    layer.pre_mlp_norm.set_weight(self.norm_weight(norms["pre_mlp_norm"]))
                layer.mlp.load_weights(self.state_dict, p, quantize_to=self.quantize_to,  # type: ignore[operator]
                                       quant_mode=self.quant_mode)
            self.fold_residual_scale(layer)
            # A layer's read buffers and fused / packed copies are freed by now, but tensors of a
            # few MB come from malloc's heap, which keeps the pages: give them back layer by layer,
            # or a quantized load peaks ~1.4x the weights (a 17 GB MoE GGUF then fails on 24 GB).
            release_freed_memory()

    def load_attention(self, layer: DecoderLayer, attn: str, norm_name: str | None) -> None:
        cfg = self.cfg
        rot = cfg.rope.rotary_dim(cfg.head_dim)
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        kinds = ["weight", "bias"] if cfg.attention_bias else ["weight"]
        for kind in kinds:
            if f"{attn}qkv_proj.{kind}" in self.state_dict:  # Phi-3: fused in the checkpoint
                q, k, v = _split_rows(self.take(f"{attn}qkv_proj.{kind}"), [q_size, kv_size, kv_size])
            else:
                q, k, v = (self.take(f"{attn}{name}_proj.{kind}") for name in "qkv")
            q, k = _rope_rows(q, cfg.num_heads, rot), _rope_rows(k, cfg.num_kv_heads, rot)
            fused = _fuse([q, k, v], f"{attn}qkv_proj.{kind}")
            if kind == "weight":
                self.put_linear(layer.qkv_proj, fused, f"{attn}qkv_proj.weight", layer.input_layernorm, norm_name)
            else:
                assert layer.qkv_proj.bias is not None and isinstance(fused, torch.Tensor)
                self.put(layer.qkv_proj.bias, fused, f"{attn}qkv_proj.bias")
        self.put_linear(layer.o_proj, self.take(attn + "o_proj.weight"), attn + "o_proj.weight")
        if layer.o_proj.bias is not None:
            self.put(layer.o_proj.bias, self.float_of(attn + "o_proj.bias"), attn + "o_proj.bias")
        if layer.q_norm is not None and layer.k_norm is not None:
            # per head: one head's dims permuted; whole projection (OLMo 2): every head's
            heads = (1, 1) if cfg.qk_norm == "head" else (cfg.num_heads, cfg.num_kv_heads)
            for norm, name, n in ((layer.q_norm, "q_norm", heads[0]), (layer.k_norm, "k_norm", heads[1])):
                self.put(norm.weight, to_interleaved_rope(self.norm_weight(attn + name + ".weight"), n, rot),
                         attn + name)

    def load_dense_mlp(self, layer: DecoderLayer, mlp: DenseMLP, prefix: str, norm_name: str | None) -> None:
        size = self.cfg.intermediate_size
        kinds = ["weight", "bias"] if self.cfg.mlp_bias else ["weight"]
        for kind in kinds:
            if f"{prefix}gate_up_proj.{kind}" in self.state_dict:  # Phi-3: fused in the checkpoint (gate, then up)
                gate, up = _split_rows(self.take(f"{prefix}gate_up_proj.{kind}"), [size, size])
            else:
                gate, up = self.take(f"{prefix}gate_proj.{kind}"), self.take(f"{prefix}up_proj.{kind}")
            fused = _fuse([gate, up], f"{prefix}gate_up_proj.{kind}")
            if kind == "weight":
                self.put_linear(mlp.gate_up_proj, fused, prefix + "gate_up_proj", layer.pre_mlp_norm, norm_name)
            else:
                assert mlp.gate_up_proj.bias is not None and isinstance(fused, torch.Tensor)
                self.put(mlp.gate_up_proj.bias, fused, prefix + "gate_up_proj.bias")
        self.put_linear(mlp.down_proj, self.take(prefix + "down_proj.weight"), prefix + "down_proj.weight")
        if mlp.down_proj.bias is not None:
            self.put(mlp.down_proj.bias, self.float_of(prefix + "down_proj.bias"), prefix + "down_proj.bias")

    def fold_residual_scale(self, layer: DecoderLayer) -> None:
        """Granite's residual multiplier into the float output products (weights and biases),
        or, where one is quantized, into the layer's runtime `output_scale`."""
        scale = self.cfg.residual_scale
        if scale == 1.0:
            return
        outputs = [layer.o_proj, *([layer.down_proj] if isinstance(layer.mlp, DenseMLP) else [])]
        if len(outputs) < 2 or any(lin.qweight is not None for lin in outputs):
            layer.output_scale = scale
            return
        with torch.no_grad():
            for lin in outputs:
                lin.weight_t.mul_(scale)
                if lin.bias is not None:
                    lin.bias.mul_(scale)


def load_llama_weights(model: LlamaForCausalLM, state_dict: Mapping[str, Weight], quantize_to: str | None = None,
                       quant_mode: str = "float32") -> None:
    """Load HF-named weights of any dense family. `quantize_to` (q8_0, q4_0, q4_1, w8a8_int8):
    float linear weights of the decoder layers are quantized (the embedding and lm_head stay
    float); `quant_mode`: how quantized layers multiply (kernels/quant.py MODES)."""
    _Loader(model, state_dict, quantize_to, quant_mode).load()
