"""Our Llama-family decoder (Llama incl. SmolLM2, Mistral, Qwen2, Qwen3) over the paged KV pool.

Layout choices made for a lean decode step (few, large ops):
- q/k/v projections are one fused matrix, gate/up another.
- The rows of q and k are permuted at load time from HF's "half-split" rotary layout to
  interleaved pairs, so RoPE is a single complex multiply on q and k together. q and k get the
  same permutation, so every q.k dot product, and hence attention, is unchanged; K lives in the
  pool in the permuted layout, which nothing outside this module reads.
- Only the rows in `batch.logits_indices` are projected to the vocabulary.
- The weights of the RMSNorms before qkv_proj, gate_up_proj and lm_head are folded into those
  layers' input rows (norm(x) * w @ W == norm(x) @ (w * W)); the residual adds are the
  accumulators of the o_proj / down_proj GEMMs.
- Where the C++ CPU kernels run (any CPU with a C++ compiler, at the ISA level kernels/isa.py
  picks) with the torch attention backend (`use_cpu_kernels`), products of up to
  `CpuIsa.kernel_max_rows` rows (every float32 product; bf16: 64 rows on AMX, 512 with
  vdpbf16ps, emulated 16 beside a CPU's bf16 hardware and every row without it) run in our packed C++ kernels (radixlm.kernels.cpu_linear: float32 FMA, or bf16 dot products), and a
  decode step of up to that many requests runs all its decoder layers in one C++ call
  (DecodeStack: the same math, float32 residual stream), which removes the per-op overhead that
  dominates a small model's decode step. Prefill-sized steps take the kernels' fused row-wise
  RMSNorm and SiLU x up (one pass each, float32 arithmetic) instead of torch's multi-pass ones.
- Block-quantized weights (kernels/quant.py: GGUF Q8_0 / Q4_0 / Q4_1 kept from the file, or
  quantized at load) stay quantized: such a Linear holds only its packed blocks and always runs
  our quantized kernel (weight-only float32, or int8 x int8), DecodeStack included; its
  RMSNorm keeps its weight; a quantized embedding dequantizes only the rows it looks up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_linear, quant
from radixlm.runtime.model import kernel_policy
from radixlm.runtime.model.attention.base import BaseAttentionBackend
from radixlm.runtime.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.model.kernel_policy import CpuIsa, attention_kernels, cpu_isa, load_cpu_kernels
from radixlm.runtime.model.linear_method import (
    CpuKernels,
    KernelLinear,
    float_method,
    in_one_arena,
    quantized_method,
)
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.models.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from radixlm.runtime.model.tensor_parallel import TPGroup


class Linear(nn.Module):
    """y = x @ weight_t (+ bias) with the weight stored transposed, `[in, out]`: on CPU, MKL's
    matrix-vector and small-batch products run markedly faster in this layout than
    `F.linear` on the HF `[out, in]` layout. Once the model takes the C++ kernels, products of up
    to `method.max_rows` rows go through its method (linear_method.py); a block-quantized layer
    (`quantize_`) holds only its packed blocks and its method takes every product."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.register_buffer("qweight", None)  # block-quantized weight (quantize_): then the only copy
        self.method: KernelLinear | None = None

    @property
    def max_rows(self) -> int:
        """Products of up to this many rows go through `method`."""
        return self.method.max_rows if self.method is not None else 0

    def quantize_(self, weight: quant.QuantizedTensor, mode: str) -> None:
        """Hold `weight` ([out, in], block-quantized) packed for our quantized kernel, in `mode`
        (kernels/quant.py MODES), instead of a float weight: every product runs that kernel."""
        ext = load_cpu_kernels()
        if ext is None:
            raise RuntimeError("quantized weights need the C++ CPU kernels, which cannot run here (no C++ compiler, or their build failed)")
        self.register_parameter("weight_t", None)
        self.register_buffer("qweight", quant.pack(weight))
        self.method = quantized_method(ext, self.qweight, self.out_features, self.bias, mode)

    def use_packed(self, ext: CpuKernels, bf16_path: str, chosen: CpuIsa) -> None:
        """Route products of up to `chosen.kernel_max_rows` rows through our kernel (bf16
        weights on GEMM path `bf16_path`); a quantized layer keeps its kernel."""
        if self.method is not None:  # quantized: its kernel already
            return
        weight_t = self.weight_t.detach()
        self.method = float_method(ext, weight_t, self.bias, bf16_path,
                                   chosen.kernel_max_rows(weight_t.dtype, bf16_path))

    def place(self, method: KernelLinear) -> None:
        """Take `method`, its weight moved (linear_method.in_one_arena); a quantized layer's
        blocks are that weight."""
        self.method = method
        if self.qweight is not None:
            self.qweight = method.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method is not None and x.shape[0] <= self.method.max_rows:
            return self.method.apply(x)
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + linear(x) in one GEMM (the residual is the accumulator)."""
        if self.method is not None and x.shape[0] <= self.method.max_rows:
            return self.method.apply(x, residual)
        out = torch.addmm(residual, x, self.weight_t)
        return out if self.bias is None else out.add_(self.bias)


class RMSNorm(nn.Module):
    """RMSNorm; `has_weight=False` where the checkpoint's norm weight is folded into the input
    rows of the linear layer that follows (one elementwise op less per norm)."""

    def __init__(self, dim: int, eps: float, has_weight: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if has_weight else None
        self.shape = (dim,)
        self.eps = eps
        self.ext: CpuKernels | None = None  # the C++ kernels' fused row-wise norm, once use_kernel ran
        self.weight_f32: torch.Tensor | None = None

    def set_weight(self, weight: torch.Tensor) -> None:
        """Give a weightless norm its weight (the layer after it is quantized and cannot absorb it)."""
        self.weight = nn.Parameter(weight.detach().clone().to(torch.float32))

    def use_kernel(self, ext: CpuKernels) -> None:
        self.ext = ext
        if self.weight is not None:
            self.weight_f32 = self.weight.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ext is not None and x.dim() == 2:
            return self.ext.rms_norm(x, self.weight_f32, self.eps)
        return F.rms_norm(x, self.shape, self.weight, self.eps)


class QuantizedEmbedding(nn.Module):
    """An embedding held as block-quantized rows (quant groups whose columns are the tokens, the
    layout of a tied lm_head, which can share them): a lookup dequantizes only its rows, in the
    model's dtype (that of `self.dtype_marker`, which follows `.to()`). With the C++ kernels
    (`use_cpu_kernels`) a lookup is one call (`q_columns`: a decode step's one row in ~2.5 us,
    where the torch ops of `quant.unpack_columns` take ~60 us); both give GGUF's values."""

    def __init__(self, packed: torch.Tensor):
        super().__init__()
        self.register_buffer("packed", packed)
        self.dtype_marker = nn.Parameter(torch.empty(0))
        self.ext: CpuKernels | None = None  # the C++ kernels, once use_cpu_kernels ran

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if self.ext is not None:  # set by use_cpu_kernels, on CPU only
            rows = self.ext.q_columns(self.packed, flat.to(torch.int64).contiguous())
        else:
            rows = quant.unpack_columns(self.packed, flat)
        return rows.to(self.dtype_marker.dtype).reshape(*ids.shape, rows.shape[-1])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # their weights live in qkv_proj / gate_up_proj (see models/weights.py)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, has_weight=False)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, has_weight=False)
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.has_qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.has_qk_norm else None
        self.ext: CpuKernels | None = None  # the C++ kernels' fused SiLU x up, once use_cpu_kernels ran
        self.tp: TPGroup | None = None  # tensor parallel: o_proj and down_proj give partial sums

    def _output(self, linear: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + linear(x); under tensor parallelism the sum over ranks of their partial
        products, rank 0's carrying the residual."""
        if self.tp is None:
            return linear.forward_add(x, residual)
        out = linear.forward_add(x, residual) if self.tp.rank == 0 else linear(x)
        self.tp.all_reduce(out)
        return out

    def forward(
        self, residual: torch.Tensor, rope: torch.Tensor, attn: BaseAttentionBackend, batch: ForwardBatch
    ) -> torch.Tensor:
        """The residual stream `[num_tokens, hidden]` after this layer (both sublayers' outputs
        are added by their output GEMMs)."""
        x = self.input_layernorm(residual)
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        qk = qkv[:, : self.q_size + self.kv_size].view(n, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat(
                [self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])], dim=1
            )
        qk = RotaryEmbedding.apply(qk, rope)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(n, self.num_kv_heads, self.head_dim)
        attn_out = attn.forward(q, k, v, self.layer_id, batch)
        residual = self._output(self.o_proj, attn_out.reshape(n, self.q_size), residual)
        x = self.post_attention_layernorm(residual)
        gate_up = self.gate_up_proj(x)
        if self.ext is not None:
            return self._output(self.down_proj, self.ext.silu_mul(gate_up), residual)
        gate, up = gate_up.chunk(2, dim=-1)
        return self._output(self.down_proj, F.silu(gate).mul_(up), residual)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, lm_head_rows: int | None = None):
        """`lm_head_rows`: a tensor-parallel rank's share of the vocabulary (default: all of it)."""
        super().__init__()
        self.cfg = cfg
        # built on the meta device and loaded after: no random init (nn.Embedding's normal_ on a meta
        # tensor goes through torch's reference ops, whose first call imports torch._dynamo: ~1 s)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, has_weight=False)  # folded into lm_head
        # its own transposed copy even when tied: the embedding lookup wants [vocab, hidden] rows
        self.lm_head = Linear(cfg.hidden_size, lm_head_rows or cfg.vocab_size, bias=False)
        with torch.device("cpu"):  # a table, not a parameter: real even when the layers are built on meta
            self.rotary = RotaryEmbedding(cfg.head_dim, cfg.context_len, cfg.rope)
        self.decode_stack: object | None = None  # cpu_linear's DecodeStack once use_cpu_kernels ran
        self.tp: TPGroup | None = None

    def set_tensor_parallel(self, tp: TPGroup | None) -> None:
        """This model is rank `tp.rank`'s shard (runtime/model/tensor_parallel.py): its layers
        all-reduce their output products, and only rank 0 projects to the vocabulary."""
        self.tp = tp
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.tp = tp

    def forward(self, batch: ForwardBatch, attn: BaseAttentionBackend) -> torch.Tensor:
        """Logits `[len(batch.logits_indices), vocab]`, float32."""
        if self.runs_in_decode_stack(batch):
            return self._forward_decode_stack(batch, attn)
        residual = self.embed_tokens(batch.input_ids)
        rope = self.rotary.freqs_for(batch.positions)
        for layer in self.layers:
            residual = layer(residual, rope, attn, batch)
        return self._logits(residual, batch)

    def _logits(self, residual: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits of `batch.logits_indices`' rows (tensor parallel: on rank 0; empty elsewhere)."""
        if self.tp is None:
            return self.lm_head(self.norm(residual[batch.logits_indices])).float()
        if self.lm_head.out_features != self.cfg.vocab_size:  # each rank its rows of the vocabulary
            return self.tp.gather_columns(self.lm_head(self.norm(residual[batch.logits_indices])).float())
        if self.tp.rank != 0:
            return residual.new_empty(0)  # rank 0 alone samples
        return self.lm_head(self.norm(residual[batch.logits_indices])).float()

    def runs_in_decode_stack(self, batch: ForwardBatch) -> bool:
        """Whether `forward` runs this batch in DecodeStack, which reads the slot layout itself
        (the attention backend's per-forward metadata is then not needed)."""
        return (
            self.decode_stack is not None and batch.mode is ForwardMode.DECODE
            and batch.batch_size <= self.lm_head.max_rows
            # tensor parallel: the residual stream's rows fit the shared-memory sum's slots
            and (self.tp is None or batch.batch_size * self._padded_hidden() * 4 <= self.tp.shm.max_bytes)  # type: ignore[union-attr]
        )

    def _padded_hidden(self) -> int:
        return -(-self.cfg.hidden_size // cpu_linear.PANEL) * cpu_linear.PANEL

    def _forward_decode_stack(self, batch: ForwardBatch, attn: BaseAttentionBackend) -> torch.Tensor:
        hidden = self.embed_tokens(batch.input_ids).float()
        rope = torch.view_as_real(self.rotary.freqs_for(batch.positions))  # [B, 1, head_dim/2, (cos, sin)]
        residual = self.decode_stack.forward(  # type: ignore[attr-defined]
            hidden, rope, batch.out_cache_loc, attn.req_to_token, batch.req_pool_indices, batch.seq_lens
        )
        return self._logits(residual, batch)

    def use_cpu_kernels(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor],
                        bf16_path: str | None = None) -> bool:
        """Route decode-sized products of every linear layer through the packed C++ kernels and
        decode steps through DecodeStack over these KV pool buffers (where the paged attention
        kernel takes the head size); False (nothing changed) where the kernels cannot run here."""
        ext, chosen = load_cpu_kernels(), cpu_isa()
        if ext is None or chosen is None:
            return False
        bf16_path = bf16_path or kernel_policy.bf16_path(ext)
        for module in self.modules():
            if isinstance(module, Linear):
                module.use_packed(ext, bf16_path, chosen)
            elif isinstance(module, RMSNorm):
                module.use_kernel(ext)
            elif isinstance(module, (DecoderLayer, QuantizedEmbedding)):
                module.ext = ext
        self._place_weights()
        cfg = self.cfg
        if cfg.head_dim not in cpu_linear.PAGED_ATTENTION_HEAD_DIMS or (
                self.tp is not None and self.tp.native_shm is None):
            # DecodeStack attends through the paged kernel, and under tensor parallelism sums its
            # layers' outputs through the C++ shared-memory all-reduce: else decode steps stay per-layer ops
            return True
        stack = ext.DecodeStack(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
            cfg.rms_norm_eps, cfg.head_dim**-0.5,
        )
        def f32(norm: RMSNorm | None) -> torch.Tensor | None:
            return None if norm is None or norm.weight is None else norm.weight.detach().float().contiguous()

        modes = set()
        for layer, k_buf, v_buf in zip(self.layers, k_buffers, v_buffers, strict=True):
            assert isinstance(layer, DecoderLayer)
            qkv, o, gate_up, down = (lin.method for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                            layer.down_proj))
            assert qkv is not None and o is not None and gate_up is not None and down is not None
            stack.add_layer(
                qkv.packed, qkv.bias, o.packed, o.bias, gate_up.packed, down.packed, f32(layer.q_norm),
                f32(layer.k_norm), k_buf, v_buf, f32(layer.input_layernorm), f32(layer.post_attention_layernorm),
            )
            modes |= {m.quant_mode for m in (qkv, o, gate_up, down) if m.quant_mode is not None}
        stack.bf16_path = cpu_linear.BF16_PATHS.index(bf16_path)
        stack.flash_attention = attention_kernels(ext, k_buffers[0].dtype, bf16_path, cfg.head_dim).flash
        if self.tp is not None:
            stack.set_tensor_parallel(self.tp.native_shm)
        if modes:
            (stack.quant_mode,) = modes  # one mode per model
        self.decode_stack = stack
        return True

    def _place_weights(self) -> None:
        """Every kernel weight in one huge-page allocation, in the order a decode step reads them
        (layer by layer, then the lm_head); a tied quantized embedding follows the lm_head's blocks."""
        linears = [lin for layer in self.layers for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                            layer.down_proj)] + [self.lm_head]
        tied = isinstance(self.embed_tokens, QuantizedEmbedding) and self.embed_tokens.packed is self.lm_head.qweight
        for lin, method in zip(linears, in_one_arena([lin.method for lin in linears]), strict=True):
            lin.place(method)
        if tied:
            self.share_embedding_with_lm_head()

    def quantize_embedding(self, weight: quant.QuantizedTensor) -> None:
        self.embed_tokens = QuantizedEmbedding(quant.pack(weight))

    def share_embedding_with_lm_head(self) -> None:
        """A tied, quantized embedding reads the lm_head's blocks: one copy of the weights."""
        assert isinstance(self.embed_tokens, QuantizedEmbedding) and self.lm_head.qweight is not None
        self.embed_tokens.packed = self.lm_head.qweight

    def load_weights(self, state_dict: Mapping[str, object], quantize_to: str | None = None,
                     quant_mode: str = "float32") -> None:
        """Load HF-named weights (fusing q/k/v and gate/up, permuting q/k rows for RoPE); values
        may be `quant.QuantizedTensor`s, kept quantized; see weights.load_llama_weights."""
        from radixlm.runtime.model.models.weights import load_llama_weights

        load_llama_weights(self, state_dict, quantize_to, quant_mode)  # type: ignore[arg-type]
        for module in self.modules():  # a quantized layer's bias is loaded after its blocks
            if isinstance(module, Linear) and module.method is not None:
                module.method = module.method.with_bias(module.bias)
