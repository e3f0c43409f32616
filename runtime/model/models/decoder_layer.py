"""One decoder layer of every family we run, shaped by ModelConfig's options:

    pre      (Llama, Qwen, Mistral, Phi-3, Granite, SmolLM3)  h += o(attn(norm(h)));  h += mlp(norm(h))
    sandwich (Gemma 2/3)                                     h += norm(o(attn(norm(h))));  h += norm(mlp(norm(h)))
    post     (OLMo 2)                                        h += norm(o(attn(h)));  h += norm(mlp(h))

A norm before a sublayer has its weight folded into that sublayer's input product (weights.py);
a norm after one keeps its weight. Where no norm follows a sublayer, its output product takes the
residual as its accumulator (one GEMM). `mlp` is any module mapping `[T, hidden] -> [T, hidden]`:
`DenseMLP` here, or a block with its own output (a mixture of experts, models/moe.py), added to
the residual (under tensor parallelism after the all-reduce of its partial sums).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.model.attention.base import BaseAttentionBackend
from radixlm.runtime.model.forward_batch import ForwardBatch
from radixlm.runtime.model.linear_method import CpuKernels
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.models.layers import Linear, RMSNorm
from radixlm.runtime.model.models.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from radixlm.runtime.model.tensor_parallel import TPGroup


class DenseMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up one product (rows: gate, then up)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.hidden_act = cfg.hidden_act
        self.ext: CpuKernels | None = None  # the C++ kernels' fused SiLU x up, once use_cpu_kernels ran

    def activate(self, x: torch.Tensor) -> torch.Tensor:
        """act(gate(x)) * up(x): `[T, intermediate]`, the input of down_proj."""
        gate_up = self.gate_up_proj(x)
        if self.hidden_act == "silu" and self.ext is not None:
            return self.ext.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        if self.hidden_act == "silu":
            return F.silu(gate).mul_(up)
        return F.gelu(gate, approximate="tanh").mul_(up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activate(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, mlp: nn.Module | None = None):
        """`mlp`: this layer's MLP when not the config's DenseMLP (a mixture of experts, which
        takes its input normed with the norm's weight: pre_mlp_norm keeps it, see weights.py)."""
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        has_pre, has_out = cfg.norm_layout != "post", cfg.norm_layout != "pre"
        # before each sublayer: weights folded into qkv_proj / gate_up_proj (see models/weights.py)
        self.input_layernorm = RMSNorm(hidden, eps, has_weight=False) if has_pre else None
        self.pre_mlp_norm = RMSNorm(hidden, eps, has_weight=False) if has_pre else None
        # on each sublayer's output, before the residual add
        self.attn_out_norm = RMSNorm(hidden, eps) if has_out else None
        self.mlp_out_norm = RMSNorm(hidden, eps) if has_out else None
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, hidden, bias=cfg.o_proj_bias)
        self.qk_norm = cfg.qk_norm
        norm_dims = {"head": (cfg.head_dim, cfg.head_dim), "projection": (self.q_size, self.kv_size)}.get(cfg.qk_norm)
        self.q_norm = RMSNorm(norm_dims[0], eps) if norm_dims else None
        self.k_norm = RMSNorm(norm_dims[1], eps) if norm_dims else None
        # the MLP seam: any module [T, hidden] -> [T, hidden]; a mixture-of-experts block
        # (models/moe.py) takes this place on the MoE families' sparse layers, loaded by its own
        # `load_weights(tensors, layer_prefix, quantize_to=, quant_mode=)`
        self.mlp: nn.Module = mlp if mlp is not None else DenseMLP(cfg)
        # Granite's residual_multiplier where the output products could not absorb it (quantized)
        self.output_scale = 1.0
        self.tp: TPGroup | None = None  # tensor parallel: o_proj and down_proj give partial sums

    @property
    def gate_up_proj(self) -> Linear:
        """The dense MLP's fused gate/up product (DecodeStack and the weight arena read it here)."""
        assert isinstance(self.mlp, DenseMLP)
        return self.mlp.gate_up_proj

    @property
    def down_proj(self) -> Linear:
        assert isinstance(self.mlp, DenseMLP)
        return self.mlp.down_proj

    def _output(self, linear: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + linear(x); under tensor parallelism the sum over ranks of their partial
        products, rank 0's carrying the residual."""
        if self.tp is None:
            return linear.forward_add(x, residual)
        out = linear.forward_add(x, residual) if self.tp.rank == 0 else linear(x)
        self.tp.all_reduce(out)
        return out

    def _add(self, linear: Linear, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm | None) -> torch.Tensor:
        """residual + scale * norm(linear(x)) (no norm, no scale: one GEMM onto the residual)."""
        if norm is None and self.output_scale == 1.0:
            return self._output(linear, x, residual)
        out = linear(x)
        if self.tp is not None:
            self.tp.all_reduce(out)
        if norm is not None:
            out = norm(out)
        if self.output_scale != 1.0:
            out = out * self.output_scale
        return residual + out

    def forward(
        self, residual: torch.Tensor, rope: torch.Tensor | None, attn: BaseAttentionBackend, batch: ForwardBatch
    ) -> torch.Tensor:
        """The residual stream `[num_tokens, hidden]` after this layer; `rope`: this layer's
        rotary factors (None: a layer without RoPE)."""
        x = residual if self.input_layernorm is None else self.input_layernorm(residual)
        n = x.shape[0]
        attn_out = self._attention(x, rope, attn, batch)
        residual = self._add(self.o_proj, attn_out.reshape(n, self.q_size), residual, self.attn_out_norm)
        x = residual if self.pre_mlp_norm is None else self.pre_mlp_norm(residual)
        mlp = self.mlp
        if isinstance(mlp, DenseMLP):
            return self._add(mlp.down_proj, mlp.activate(x), residual, self.mlp_out_norm)
        out = mlp(x)  # a block with its own output product (e.g. mixture of experts)
        if self.tp is not None:  # each rank's experts give a partial sum (tp_sharding.py)
            self.tp.all_reduce(out)
        if self.output_scale != 1.0:
            out = out * self.output_scale
        return residual + (out if self.mlp_out_norm is None else self.mlp_out_norm(out))

    def _attention(
        self, x: torch.Tensor, rope: torch.Tensor | None, attn: BaseAttentionBackend, batch: ForwardBatch
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        heads, qk_size = self.num_heads + self.num_kv_heads, self.q_size + self.kv_size
        if self.qk_norm == "projection" and self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(qkv[:, : self.q_size].contiguous())
            k = self.k_norm(qkv[:, self.q_size : qk_size].contiguous())
            qk = torch.cat([q, k], dim=1).view(n, heads, self.head_dim)
        else:
            qk = qkv[:, :qk_size].view(n, heads, self.head_dim)
            if self.q_norm is not None and self.k_norm is not None:
                qk = torch.cat(
                    [self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])], dim=1
                )
        qk = RotaryEmbedding.apply(qk, rope) if rope is not None else qk.contiguous()
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, qk_size:].view(n, self.num_kv_heads, self.head_dim)
        return attn.forward(q, k, v, self.layer_id, batch)
