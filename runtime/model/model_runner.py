"""ModelRunner: owns the weights, the KV pool, the request->token pool and the attention backend,
and executes one prepared ForwardBatch. No scheduling logic lives here."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.kernels.quant import QuantizedTensor
from radixlm.runtime.config.envs import RADIXLM_ADAPTIVE_THREADS
from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.attention.base import LayerAttention, create_attention_backend
from radixlm.runtime.model.cpu_threads import ThreadGovernor
from radixlm.runtime.model.forward_batch import ForwardBatch
from radixlm.runtime.model.kernel_policy import choose, load_cpu_kernels
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.models.llama import LlamaForCausalLM
from radixlm.runtime.model.tensor_parallel import TPGroup, TPWorkers
from radixlm.runtime.model.tp_sharding import ShardedWeights, check_tp_size, shard_config, vocab_part

logger = logging.getLogger(__name__)

# Tensor parallel on CPU: all-reduces and logit gathers of up to this many bytes per rank go through
# shared memory (tensor_parallel.ShmAllReduce), larger ones through gloo. 16 MiB holds a 2,048-token
# prefill's hidden states (hidden 2,048, float32) and 16 decode rows of a 150k vocabulary's logits;
# the /dev/shm file is sparse, so only pages used take memory.
SHM_ALL_REDUCE_BYTES = 16 << 20


@dataclass(frozen=True)
class RunnerConfig:
    dtype: torch.dtype
    attention_backend: str
    max_total_num_tokens: int  # the KV pool's size in tokens (SGLang's name; --max-total-tokens resolved)
    max_running_requests: int
    context_len: int
    device: str = "cpu"
    cpu_kernels: bool = True  # the C++ decode kernels on CPU with torch attention (kernels/cpu_linear.py)
    # linear weights: none (all in dtype), auto (a converted GGUF's quantized tensors kept, if it has
    # any), gguf (kept; an error without), or a format float weights are quantized to at load
    quantization: str = "none"
    quant_mode: str = "float32"  # how quantized layers multiply (kernels/quant.py MODES)
    kv_dtype: torch.dtype | None = None  # the KV pool's; None: dtype
    adaptive_threads: bool = True  # CPU: threads = the cores other processes leave free (cpu_threads.py)
    bf16_path: str | None = None  # our bf16 GEMM's path (kernel_policy.choose); None: kernel_policy.bf16_path's
    deterministic: bool = False  # --enable-deterministic-inference: batch-invariant attention

    @classmethod
    def from_server_args(cls, args: ServerArgs, model_cfg: ModelConfig, quantized: bool = False) -> RunnerConfig:
        """Resolve `auto` values: context length, the KV pool size from available memory, and what
        the kernel policy chooses for a model with (`quantized`) or without quantized weights:
        dtypes, quantization, quantized mode, bf16 GEMM path (kernel_policy.choose)."""
        context_len = min(args.context_length or model_cfg.context_len, model_cfg.context_len)
        choices = choose(args, quantized)
        per_token = KVPool.bytes_per_token(model_cfg.num_layers, model_cfg.num_kv_heads, model_cfg.head_dim,
                                           choices.kv_dtype)
        max_total_num_tokens = args.max_total_tokens or max(
            1024, int(_available_memory_bytes() * args.mem_fraction_static) // per_token
        )
        return cls(
            dtype=choices.dtype,
            kv_dtype=choices.kv_dtype,
            attention_backend=args.resolved_attention_backend,
            max_total_num_tokens=max_total_num_tokens,
            max_running_requests=args.max_running_requests,
            context_len=min(context_len, max_total_num_tokens),
            device=args.device,
            cpu_kernels=not args.disable_cpu_kernels,
            adaptive_threads=not args.disable_adaptive_threads and RADIXLM_ADAPTIVE_THREADS.get() != "0",
            quantization=choices.quantization,
            quant_mode=choices.quant_mode,
            bf16_path=choices.bf16_path,
            deterministic=args.enable_deterministic_inference,
        )

    @property
    def quantize_to(self) -> str | None:
        return self.quantization if self.quantization not in ("none", "auto", "gguf") else None


class ModelRunner:
    """With `tp` (tensor_parallel.TPGroup), this rank's shard: 1/tp of the heads, of the MLP and of
    the KV pool; rank 0 (whose `tp_workers` are ranks 1..N-1) broadcasts each forward to the others."""

    def __init__(self, model_cfg: ModelConfig, runner_cfg: RunnerConfig, state_dict: Mapping[str, object],
                 tp: TPGroup | None = None, tp_workers: TPWorkers | None = None):
        self.model_cfg = model_cfg
        self.cfg = runner_cfg
        self.tp, self.tp_workers = tp, tp_workers
        start = time.perf_counter()
        shard_cfg, lm_head_rows = model_cfg, None
        if tp is not None:
            shard_cfg, lm_head_rows = shard_config(model_cfg, tp.size), vocab_part(model_cfg, tp.size)
            state_dict = ShardedWeights(state_dict, model_cfg, tp.rank, tp.size)  # type: ignore[arg-type]
        with torch.device("meta"):
            model = LlamaForCausalLM(shard_cfg, lm_head_rows, runner_cfg.context_len)
        model = model.to_empty(device=runner_cfg.device)
        if runner_cfg.device != "cpu" and (runner_cfg.quantize_to or any(
                isinstance(w, QuantizedTensor) for w in state_dict.values())):
            raise ValueError("quantized weights run on CPU only (in our C++ CPU kernels); use --quantization none")
        model.load_weights(state_dict, runner_cfg.quantize_to, runner_cfg.quant_mode)
        self.model = model.to(runner_cfg.dtype).eval()
        self.model.set_tensor_parallel(tp)
        self.quantized_layers = sum(1 for m in model.modules() if getattr(m, "qweight", None) is not None)
        self.kv_pool = KVPool(
            runner_cfg.max_total_num_tokens,
            model_cfg.num_layers,
            shard_cfg.num_kv_heads,
            model_cfg.head_dim,
            runner_cfg.kv_dtype or runner_cfg.dtype,
            runner_cfg.device,
        )
        self.req_to_token_pool = ReqToTokenPool(
            runner_cfg.max_running_requests, runner_cfg.context_len, runner_cfg.device
        )
        if tp_workers is not None:
            self.req_to_token_pool.write_log = []  # sent to the other ranks with the next forward
        # the C++ decode path writes K/V and attends itself, in the torch backend's slot layout
        self.cpu_kernels = (
            runner_cfg.cpu_kernels and runner_cfg.device == "cpu" and runner_cfg.attention_backend == "torch"
            and self.model.use_cpu_kernels(self.kv_pool.k_buffer, self.kv_pool.v_buffer, runner_cfg.bf16_path)
        )
        if runner_cfg.deterministic and self.model.decode_stack is not None:
            # its paged attention then never cascades (the flash flag's only use on one-token rows)
            self.model.decode_stack.flash_attention = False
        self.threads = ThreadGovernor() if runner_cfg.adaptive_threads and runner_cfg.device == "cpu" else None
        self.attn_backend = create_attention_backend(
            runner_cfg.attention_backend, self.kv_pool, self.req_to_token_pool, model_cfg.scaling,
            load_cpu_kernels() if self.cpu_kernels else None, runner_cfg.bf16_path, layer_attention(model_cfg),
            runner_cfg.deterministic,
        )
        logger.info(
            "model loaded in %.1fs: %s%s, dtype %s%s%s, KV pool %d tokens (%s)",
            time.perf_counter() - start,
            model_cfg.architecture,
            "" if tp is None else f" (tensor-parallel rank {tp.rank} of {tp.size})",
            runner_cfg.dtype,
            f", {self.quantized_layers} quantized linear layers ({runner_cfg.quant_mode})" if self.quantized_layers else "",
            self._kernels_note(),
            runner_cfg.max_total_num_tokens,
            self.kv_pool.dtype,
        )

    def _kernels_note(self) -> str:
        if not self.cpu_kernels:
            return ""
        if self.model.decode_stack is not None:
            return " (C++ CPU decode kernels)"
        lacks = self.model.decode_stack_misfit() or "this head size or shared-memory sum"
        return f" (C++ CPU kernels; decode steps layer by layer: DecodeStack lacks {lacks})"

    @classmethod
    def from_dir(cls, model_dir: Path, runner_cfg: RunnerConfig, tp_size: int = 1,
                 shm_all_reduce_bytes: int = SHM_ALL_REDUCE_BYTES) -> ModelRunner:
        """The runner of rank 0; with `tp_size` > 1 it starts ranks 1..tp_size-1 as processes, whose
        all-reduces of up to `shm_all_reduce_bytes` go through shared memory (0: all through gloo)."""
        model_cfg = ModelConfig.from_dir(model_dir)
        if tp_size == 1:
            return cls(model_cfg, runner_cfg, weights_of(model_dir, runner_cfg.quantization))
        check_tp_size(model_cfg, tp_size)
        # each rank its share of the cores, fixed (a rank that waits for cores stalls every all-reduce)
        torch.set_num_threads(max(1, torch.get_num_threads() // tp_size))
        runner_cfg = dataclasses.replace(runner_cfg, adaptive_threads=False)
        workers = TPWorkers(model_dir, runner_cfg, tp_size, shm_all_reduce_bytes)
        try:
            runner = cls(model_cfg, runner_cfg, weights_of(model_dir, runner_cfg.quantization), workers.group, workers)
            workers.wait_ready()
        except BaseException:
            workers.close()
            raise
        return runner

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (a no-op without tensor parallelism) and the
        thread governor's sampling."""
        if self.threads is not None:
            self.threads.close()
        if self.tp_workers is not None:
            self.tp_workers.close()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits `[len(batch.logits_indices), vocab]` (on tensor-parallel ranks other than
        0: an empty tensor, as only rank 0 samples)."""
        if self.tp_workers is None:
            return self._forward(batch)
        log = self.req_to_token_pool.write_log
        assert log is not None
        try:
            self.tp_workers.send_step(batch, list(log))
            log.clear()
            return self._forward(batch)
        except RuntimeError as e:
            raise self.tp_workers.failure(e) from e

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.threads is not None:
            self.threads.update(batch.num_tokens)
        if not self.model.runs_in_decode_stack(batch):
            self.attn_backend.init_forward_metadata(batch)
        return self.model(batch, self.attn_backend)


def layer_attention(cfg: ModelConfig) -> list[LayerAttention]:
    """How each of the model's layers attends (its scale, window and soft-cap)."""
    return [LayerAttention(cfg.scaling, cfg.layer(i).sliding_window, cfg.attn_logit_softcap)
            for i in range(cfg.num_layers)]


def quantizes(model_dir: Path, quantization: str) -> bool:
    """Whether a model loaded with this (resolved) quantization has quantized layers."""
    from radixlm.runtime.model.model_files import QUANTIZED_INDEX

    return quantization not in ("none", "auto", "gguf") or (
        quantization != "none" and (Path(model_dir) / QUANTIZED_INDEX).is_file())


def weights_of(model_dir: Path, quantization: str) -> Mapping[str, object]:
    """The model's weights by HF name, each read when the model takes it: float tensors, and a
    converted GGUF's quantized tensors from the GGUF file (model_files.load_quantized): kept as
    blocks (kernels.quant.QuantizedTensor) with quantization auto / gguf, else dequantized to
    float32 one at a time."""
    from radixlm.runtime.model.gguf_tensors import DequantizedTensors
    from radixlm.runtime.model.model_files import ModelLoadError, load_quantized, load_state_dict

    state = load_state_dict(model_dir)
    blocks = load_quantized(model_dir)
    if quantization == "gguf" and not blocks:
        raise ModelLoadError(f"{model_dir}: --quantization gguf, but the model has no GGUF-quantized "
                             "(Q8_0 / Q4_0 / Q4_1 / Q4_K / Q5_K / Q6_K) weights")
    if not blocks:
        return state
    kept = blocks if quantization in ("auto", "gguf") else DequantizedTensors(blocks)
    return ChainMap(kept, state)  # type: ignore[arg-type]


def _available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (CPU); 8 GiB if it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30
