"""Our decoder for every family (Llama incl. SmolLM2, Mistral, Qwen2, Qwen3, Gemma 2/3 text,
Phi-3 / Phi-4-mini, OLMo 2, Granite, SmolLM3, and the mixtures of experts Qwen3-MoE, Mixtral,
OLMoE) over the paged KV pool; ModelConfig's options shape its layers (models/decoder_layer.py),
and a MoE model's sparse layers take a SparseMoeBlock (models/moe.py) for their MLP.

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
  dominates a small model's decode step. DecodeStack implements the Llama/Qwen layer, and a
  sparse layer's mixture of experts where the fused experts kernel takes it (the router, top-k
  and FusedExperts inside its layer loop: a MoE decode step is one C++ call too); a model with
  any option it lacks (`decode_stack_misfit`) decodes layer by layer, its products
  still in the packed kernels; one with sliding windows leaves it while a window cuts a context.
  Prefill-sized steps take the kernels' fused row-wise
  RMSNorm and SiLU x up (one pass each, float32 arithmetic) instead of torch's multi-pass ones.
- Block-quantized weights (kernels/quant.py: GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K / Q5_K / Q6_K kept from the file, or
  quantized at load) stay quantized: such a Linear holds only its packed blocks and always runs
  our quantized kernel (weight-only float32, or int8 x int8), DecodeStack included; its
  RMSNorm keeps its weight; a quantized embedding dequantizes only the rows it looks up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.kernels import cpu_linear, quant
from radixlm.runtime.model import kernel_policy, linear_method
from radixlm.runtime.model.attention.base import BaseAttentionBackend
from radixlm.runtime.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.model.kernel_policy import attention_kernels, cpu_isa, load_cpu_kernels
from radixlm.runtime.model.linear_method import in_one_arena
from radixlm.runtime.model.model_config import ModelConfig, RopeConfig
from radixlm.runtime.model.models.decoder_layer import DecoderLayer, DenseMLP
from radixlm.runtime.model.models.layers import (
    Linear,
    QuantizedEmbedding,
    RMSNorm,
    native_repack,
    release_freed_memory,
)
from radixlm.runtime.model.models.moe import SparseMoeBlock
from radixlm.runtime.model.models.rotary import RotaryEmbedding

__all__ = ["DecoderLayer", "Linear", "LlamaForCausalLM", "QuantizedEmbedding", "RMSNorm"]

if TYPE_CHECKING:
    from radixlm.runtime.model.tensor_parallel import TPGroup

# _place_weights gives the pages of the weights it copied back every this many bytes (layers.release_freed_memory)
TRIM_BYTES = 256 << 20


class LlamaForCausalLM(nn.Module):
    """Every family's decoder (ModelConfig's options shape its layers; the name is the first
    family's)."""

    def __init__(self, cfg: ModelConfig, lm_head_rows: int | None = None, max_positions: int | None = None):
        """`lm_head_rows`: a tensor-parallel rank's share of the vocabulary (default: all of it);
        `max_positions`: the longest sequence it will run (default: the model's context length),
        which sizes the rotary tables (a 128k-token model served at 8k keeps 8k rows)."""
        super().__init__()
        self.cfg = cfg
        # built on the meta device and loaded after: no random init (nn.Embedding's normal_ on a meta
        # tensor goes through torch's reference ops, whose first call imports torch._dynamo: ~1 s)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, self._experts(cfg, i)) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, has_weight=False)  # folded into lm_head
        # its own transposed copy even when tied: the embedding lookup wants [vocab, hidden] rows
        self.lm_head = Linear(cfg.hidden_size, lm_head_rows or cfg.vocab_size, bias=False)
        # one rotary table per distinct rope (Gemma 3: global and local); layer i takes
        # rotaries[layer_rope[i]], or none (SmolLM3's no-rope layers: None)
        ropes: list[RopeConfig] = [cfg.rope]
        for i in range(cfg.num_layers):
            rope = cfg.layer(i).rope
            if rope is not None and rope not in ropes:
                ropes.append(rope)
        with torch.device("cpu"):  # tables, not parameters: real even when the layers are built on meta
            positions = min(cfg.context_len, max_positions or cfg.context_len)
            self.rotaries = [RotaryEmbedding(cfg.head_dim, positions, rope) for rope in ropes]
        self.rotary = self.rotaries[0]
        self.layer_rope = [None if cfg.layer(i).rope is None else ropes.index(cfg.layer(i).rope)  # type: ignore[arg-type]
                           for i in range(cfg.num_layers)]
        windows = [w for w in (cfg.layer(i).sliding_window for i in range(cfg.num_layers)) if w is not None]
        self.min_window = min(windows) if windows else None
        self.decode_stack: object | None = None  # cpu_linear's DecodeStack once use_cpu_kernels ran
        self.decode_stack_rows = 1 << 62  # the most rows its mixtures of experts take (FusedExperts.max_rows)
        self.tp: TPGroup | None = None

    @staticmethod
    def _experts(cfg: ModelConfig, layer_id: int) -> SparseMoeBlock | None:
        """Layer `layer_id`'s mixture of experts, or None (the config's dense MLP)."""
        if cfg.moe is None or not cfg.moe.is_sparse_layer(layer_id):
            return None
        return SparseMoeBlock(cfg.moe, cfg.hidden_size)

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
        residual = self._embed(batch.input_ids)
        ropes = self._rope_factors(batch)
        for layer, rope in zip(self.layers, self.layer_rope, strict=True):
            residual = layer(residual, None if rope is None else ropes[rope], attn, batch)
        return self._logits(residual, batch)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if self.cfg.embedding_scale != 1.0:  # scaled in the model's dtype, as transformers does
            hidden = hidden * torch.tensor(self.cfg.embedding_scale, dtype=hidden.dtype)
        return hidden

    def _rope_factors(self, batch: ForwardBatch) -> list[torch.Tensor]:
        """Each rotary table's factors for the batch's tokens (longrope: by their request's length)."""
        seq_lens = None
        if any(rotary.is_longrope for rotary in self.rotaries):
            seq_lens = torch.repeat_interleave(batch.seq_lens, batch.extend_lens)
        return [rotary.freqs_for(batch.positions, seq_lens) for rotary in self.rotaries]

    def _logits(self, residual: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits of `batch.logits_indices`' rows (tensor parallel: on rank 0; empty elsewhere)."""
        split = self.tp is not None and self.lm_head.out_features != self.cfg.vocab_size
        if self.tp is not None and not split and self.tp.rank != 0:
            return residual.new_empty(0)  # rank 0 alone samples
        logits = self.lm_head(self.norm(residual[batch.logits_indices])).float()
        if split:  # each rank its rows of the vocabulary
            assert self.tp is not None
            logits = self.tp.gather_columns(logits)
        cfg = self.cfg
        if cfg.logits_scaling != 1.0:
            logits = logits / cfg.logits_scaling
        if cfg.final_logit_softcap is not None:
            logits = torch.tanh(logits / cfg.final_logit_softcap) * cfg.final_logit_softcap
        return logits

    def runs_in_decode_stack(self, batch: ForwardBatch) -> bool:
        """Whether `forward` runs this batch in DecodeStack, which reads the slot layout itself
        (the attention backend's per-forward metadata is then not needed); it has no sliding
        window, so only while no window cuts the batch's contexts."""
        return (
            self.decode_stack is not None and batch.mode is ForwardMode.DECODE
            and batch.batch_size <= min(self.lm_head.max_rows, self.decode_stack_rows)
            and (self.min_window is None or max(batch.seq_lens_list) <= self.min_window)
            # tensor parallel: the residual stream's rows fit the shared-memory sum's slots
            and (self.tp is None or batch.batch_size * self._padded_hidden() * 4 <= self.tp.shm.max_bytes)  # type: ignore[union-attr]
        )

    def _padded_hidden(self) -> int:
        return -(-self.cfg.hidden_size // cpu_linear.PANEL) * cpu_linear.PANEL

    def _forward_decode_stack(self, batch: ForwardBatch, attn: BaseAttentionBackend) -> torch.Tensor:
        hidden = self._embed(batch.input_ids).float()
        rope = torch.view_as_real(self._rope_factors(batch)[0])  # [B, 1, head_dim/2, (cos, sin)]
        residual = self.decode_stack.forward(  # type: ignore[attr-defined]
            hidden, rope, batch.out_cache_loc, attn.req_to_token, batch.req_pool_indices, batch.seq_lens
        )
        return self._logits(residual, batch)

    def decode_stack_misfit(self) -> str | None:
        """What of this model DecodeStack (the C++ Llama/Qwen layer) does not implement, or None."""
        cfg = self.cfg
        misfits = {
            "norms on the sublayers' outputs": cfg.norm_layout != "pre",
            "an activation other than SiLU": cfg.hidden_act != "silu",
            "q/k norms over the whole projection": cfg.qk_norm == "projection",
            "MLP biases": cfg.mlp_bias,
            "attention logit soft-capping": cfg.attn_logit_softcap is not None,
            "layers with different or no rotary embeddings": any(r != 0 for r in self.layer_rope),
            "an MLP other than the dense one or a mixture of experts in the fused kernel":
                any(not isinstance(layer.mlp, DenseMLP) and not self._stack_takes_experts(layer.mlp)
                    for layer in self.layers),
            "a residual multiplier the quantized output products could not absorb":
                any(layer.output_scale != 1.0 for layer in self.layers),  # type: ignore[union-attr]
        }
        found = [what for what, present in misfits.items() if present]
        return ", ".join(found) if found else None

    @staticmethod
    def _stack_takes_experts(mlp: nn.Module) -> bool:
        """Whether DecodeStack runs this block: a mixture of experts the fused kernel takes (its
        SparseMoeBlock.fused, set once use_cpu_kernels placed the experts)."""
        return isinstance(mlp, SparseMoeBlock) and mlp.fused is not None

    def use_cpu_kernels(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor],
                        bf16_path: str | None = None) -> bool:
        """Route decode-sized products of every linear layer through the packed C++ kernels and
        decode steps through DecodeStack over these KV pool buffers (where the paged attention
        kernel takes the head size and DecodeStack implements every option of the model); False
        (nothing changed) where the kernels cannot run here."""
        ext, chosen = load_cpu_kernels(), cpu_isa()
        if ext is None or chosen is None:
            return False
        bf16_path = bf16_path or kernel_policy.bf16_path(ext)
        for module in self.modules():
            if isinstance(module, Linear):
                module.use_packed(ext, bf16_path, chosen)
            elif isinstance(module, RMSNorm):
                module.use_kernel(ext)
            elif isinstance(module, (DenseMLP, SparseMoeBlock, QuantizedEmbedding)):
                module.ext = ext
        self._place_weights()
        for module in self.modules():
            if isinstance(module, SparseMoeBlock):
                module.fuse_experts()  # over the experts' weights where _place_weights put them
        cfg = self.cfg
        if cfg.head_dim not in cpu_linear.PAGED_ATTENTION_HEAD_DIMS or (
                self.tp is not None and self.tp.native_shm is None) or self.decode_stack_misfit() is not None:
            # DecodeStack attends through the paged kernel, and under tensor parallelism sums its
            # layers' outputs through the C++ shared-memory all-reduce: else decode steps stay per-layer ops
            return True
        stack = ext.DecodeStack(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
            cfg.rms_norm_eps, cfg.scaling,
        )
        def f32(norm: RMSNorm | None) -> torch.Tensor | None:
            return None if norm is None or norm.weight is None else norm.weight.detach().float().contiguous()

        modes = set()
        for layer, k_buf, v_buf in zip(self.layers, k_buffers, v_buffers, strict=True):
            assert isinstance(layer, DecoderLayer)
            o = layer.o_proj.method
            assert o is not None
            products = [*layer.qkv_proj.kernel_linears(), layer.o_proj]
            experts, gate_up, down, gate_up_parts = None, None, None, []
            if isinstance(layer.mlp, SparseMoeBlock):  # a sparse layer: its router and fused experts
                experts = self._stack_experts(ext, layer.mlp)
            else:
                gate_up, gate_up_parts = self._stack_product(layer.gate_up_proj)
                down = layer.down_proj.method.packed  # type: ignore[union-attr]
                products += [*layer.gate_up_proj.kernel_linears(), layer.down_proj]
            qkv, qkv_parts = self._stack_product(layer.qkv_proj)
            qkv_bias = layer.qkv_proj.method.bias if layer.qkv_proj.method is not None else \
                linear_method.padded_bias(layer.qkv_proj.bias)  # parts: the whole layer's, after theirs
            stack.add_layer(
                qkv, qkv_bias, o.packed, o.bias, gate_up, down,
                f32(layer.q_norm), f32(layer.k_norm), k_buf, v_buf, f32(layer.input_layernorm),
                f32(layer.pre_mlp_norm), experts, qkv_parts, gate_up_parts,
            )
            modes |= {lin.method.quant_mode for lin in products if lin.method.quant_mode is not None}  # type: ignore[union-attr]
            if isinstance(layer.mlp, SparseMoeBlock):
                assert layer.mlp.fused is not None
                self.decode_stack_rows = min(self.decode_stack_rows, layer.mlp.fused.max_rows)
        stack.bf16_path = cpu_linear.BF16_PATHS.index(bf16_path)
        stack.flash_attention = attention_kernels(ext, k_buffers[0].dtype, bf16_path, cfg.head_dim).flash
        if self.tp is not None:
            stack.set_tensor_parallel(self.tp.native_shm)
        if modes:
            (stack.quant_mode,) = modes  # one mode per model
        self.decode_stack = stack
        return True

    @staticmethod
    def _stack_product(linear: Linear) -> tuple[torch.Tensor | None, list[tuple[torch.Tensor, int]]]:
        """DecodeStack's view of a fused input product: (its packed weight, []) or, where it comes
        in parts of different quantized formats, (None, each part's (packed weight, columns))."""
        if linear.parts is None:
            assert linear.method is not None
            return linear.method.packed, []
        return None, [(part.method.packed, part.out_features) for part in linear.kernel_linears()]  # type: ignore[union-attr]

    @staticmethod
    def _stack_experts(ext: object, block: SparseMoeBlock) -> object:
        """DecodeStack's view of a sparse layer: the router (float32, HF's [E, hidden]) and the
        fused kernel's experts, routed as the block routes (SparseMoeBlock.route)."""
        fused, options = block.fused, block.options
        assert fused is not None
        return ext.DecodeExperts(  # type: ignore[attr-defined]
            block.gate.detach().float().contiguous(), fused.arena, fused.offsets, fused.inter, fused.kind,
            *fused.block_bytes, fused.mode, fused.bf16_path, options.top_k, options.norm_topk_prob,
        )

    def _place_weights(self) -> None:
        """Every kernel weight in one huge-page allocation, in the order a decode step reads them
        (layer by layer, then the lm_head); a tied quantized embedding follows the lm_head's blocks."""
        # a layer registers qkv_proj, o_proj, then its MLP's products: the order a step reads them
        linears = [lin for layer in self.layers for lin in layer.modules() if isinstance(lin, Linear) and lin.parts is None]
        linears.append(self.lm_head)
        tied = isinstance(self.embed_tokens, QuantizedEmbedding) and self.embed_tokens.packed is self.lm_head.qweight
        copied = 0
        for lin, method in zip(linears, in_one_arena([lin.method for lin in linears]), strict=True):
            lin.place(method)
            copied += method.packed.nbytes
            if copied >= TRIM_BYTES:  # the old copies' pages back to the OS as we go
                release_freed_memory()
                copied = 0
        release_freed_memory()
        if tied:
            self.share_embedding_with_lm_head()

    def quantize_embedding(self, weight: quant.QuantizedTensor) -> None:
        self.embed_tokens = QuantizedEmbedding(quant.pack(weight, native_repack(load_cpu_kernels())))

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
