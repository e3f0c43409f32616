"""Which C++ CPU kernels this process runs, decided in one place, once.

The CPU's features come from the probe (kernels/isa.py); RADIXLM_CPU_ISA caps the level (so one
machine runs every level below its own); the extension built for the chosen level is loaded
from the cache's `extensions/` folder. The choices that depend on the level are made here:
whether bfloat16 is multiplied in hardware (what `--dtype auto` may take), and whether
quantized layers multiply int8 x int8 by default (`--quantized-activations auto`).

    probe (cpuid / HWCAP) -> level (<= RADIXLM_CPU_ISA) -> its build of the kernels -> the model's layers
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import torch

from radixlm.kernels import cpu_linear, isa
from radixlm.runtime.config.envs import RADIXLM_BF16_PATH, RADIXLM_CPU_AUTO_DTYPE, RADIXLM_CPU_ISA
from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.model.model_files import cache_dir

logger = logging.getLogger(__name__)

# Features with which a quantized layer's int8 x int8 products (kernels/quant.py "int8") run
# faster than its float32-activation ones, so `--quantized-activations auto` takes int8: a
# vector int8 dot product (csrc/simd/dot_int8.h: vpdpbusd on zmm or ymm, vpmaddubsw on AVX2 /
# AVX-512BW, ARM's sdot). Measured per variant at the default model's decode step, 1 and 32
# rows: int8 1.4-2.3x float32's on each x86 level; at the generic level (plain C++) int8 loses
# at 32 rows, and plain NEON (no dotprod) is not measured, so both keep float32.
INT8_DOT_FEATURES = frozenset({"avx512_vnni", "avx512bw", "avx_vnni", "avx2", "dotprod"})


# At the generic level (plain C++: SSE2 on x86-64) torch's float32 GEMM (MKL) beats ours from 8
# rows up, and our quantized kernels lose to it on dequantized weights at every size past one row
# (`RADIXLM_CPU_ISA=generic python -m radixlm.runtime.bench.gemm 1 4 8 16 32 256`; the figures are
# in docs/cpu-support.md): there float32 products take ours up to this many rows only, and
# `--quantization auto` loads float weights.
GENERIC_FLOAT32_MAX_ROWS = 8


@dataclass(frozen=True)
class CpuIsa:
    """The ISA level this process's kernels run at and the features they may use there."""

    level: str
    features: frozenset[str]

    @property
    def bf16_in_hardware(self) -> bool:
        """bfloat16 products run in hardware (AVX512-BF16; every AMX CPU has it), not emulated."""
        return "avx512_bf16" in self.features

    @property
    def int8_dot_is_fast(self) -> bool:
        """Quantized layers run faster with int8 activations than with float32 ones here."""
        return bool(self.features & INT8_DOT_FEATURES)

    @property
    def quantized_kernels_are_fast(self) -> bool:
        """Our quantized kernels run a model faster than torch's float32 GEMM on its dequantized
        weights: at every vector level, not at the generic one (GENERIC_FLOAT32_MAX_ROWS)."""
        return self.level != "generic"

    def kernel_max_rows(self, dtype: torch.dtype, bf16_path: str) -> int:
        """Products of up to this many rows go through our kernels, the rest through torch's
        GEMM (cpu_linear.kernel_max_rows, measured against torch's oneDNN bf16 GEMM on CPUs with
        bf16 in hardware). Without it, torch's bf16 GEMM is emulated too and slower than ours at
        every size (docs/cpu-support.md, "Thresholds and the measurements behind them"), so ours
        take every row."""
        if dtype == torch.bfloat16 and bf16_path == "emulated" and not self.bf16_in_hardware:
            return sys.maxsize
        if dtype == torch.float32 and self.level == "generic":
            return GENERIC_FLOAT32_MAX_ROWS
        return cpu_linear.kernel_max_rows(dtype, bf16_path)


@dataclass(frozen=True)
class AttentionKernels:
    """Which of the paged attention kernel's long paths a model's attention may take."""

    amx: bool  # long extends over a bfloat16 pool on AMX tiles
    flash: bool  # long extends, and batches sharing a long prefix (the cascade), in the flash kernels


def attention_kernels(ext: cpu_linear.Extension, pool_dtype: torch.dtype, bf16_path: str,
                      head_dim: int) -> AttentionKernels:
    """The attention kernels for a KV pool of `pool_dtype` when bf16 products take GEMM path
    `bf16_path` (which RADIXLM_BF16_PATH may force: it names the instructions allowed). Over a
    bfloat16 pool: AMX tiles on the AMX path, the flash kernels on the vdpbf16ps one, neither on
    the emulated one (its vdpbf16ps is emulated too); over a float32 pool the flash kernels' float32
    FMAs at every level. Decode steps (DecodeStack) and the attention backend both ask here."""
    bf16_pool = pool_dtype == torch.bfloat16
    return AttentionKernels(
        amx=bf16_pool and bf16_path == "amx" and cpu_linear.amx_attention_supported(ext, head_dim),
        flash=(not bf16_pool or bf16_path == "avx512bf16") and cpu_linear.flash_attention_supported(ext, head_dim),
    )


@dataclass(frozen=True)
class KernelChoices:
    """What a model runs as, turned once from the CPU's features and the flags (`choose`); the
    runner's config carries it to the model's layers and its attention backend."""

    dtype: torch.dtype  # the float weights' and the activations' dtype
    kv_dtype: torch.dtype  # the KV pool's
    quantization: str  # --quantization resolved; "none" where quantized weights load as float32
    quant_mode: str  # how quantized layers multiply (kernels/quant.py MODES)
    bf16_path: str | None  # our bf16 GEMM's path (cpu_linear.BF16_PATHS); None where our kernels do not run


def choose(args: ServerArgs, quantized: bool) -> KernelChoices:
    """The choices for a model whose checkpoint has quantized weights (`quantized`, as resolved
    --quantization keeps them) on `args.device`: quantized weights stay so where our kernels run
    them (`float_weights_instead`); with them, --dtype auto on CPU means float32 activations (our
    quantized kernels take and give float32; bf16 activations cost a conversion per product, 30% of
    a W5 prefill) over a bfloat16 KV pool where the CPU has AVX512-BF16 (the paged attention kernel
    then takes every extend); without, --dtype auto takes bfloat16 where a timed product says it
    pays (cpu_linear.prefers_bf16); int8 activations where the CPU has a fast int8 dot product."""
    quantization = args.resolved_quantization
    on_cpu = args.device == "cpu"
    chosen = cpu_isa() if on_cpu else None
    if quantized and on_cpu:
        why = float_weights_instead(args.quantization)
        if why is not None:
            logger.warning("--quantization auto: the model's quantized weights are loaded as float32 instead: %s "
                           "(~4-7x the memory)", why)
            quantized, quantization = False, "none"
    ext = load_cpu_kernels() if on_cpu and not args.disable_cpu_kernels else None
    bf16_in_hardware = chosen is not None and chosen.bf16_in_hardware
    if quantized and args.dtype == "auto" and on_cpu:
        dtype = torch.float32
        kv_dtype = torch.bfloat16 if bf16_in_hardware and RADIXLM_CPU_AUTO_DTYPE.get() != "float32" else torch.float32
    else:
        dtype = kv_dtype = args.torch_dtype(lambda: cpu_linear.prefers_bf16(bf16_in_hardware, lambda: ext))
    return KernelChoices(
        dtype=dtype, kv_dtype=kv_dtype, quantization=quantization,
        quant_mode=args.quant_mode(chosen is not None and chosen.int8_dot_is_fast),
        bf16_path=bf16_path(ext) if ext is not None else None,
    )


def bf16_path(ext: cpu_linear.Extension) -> str:
    """Our bf16 GEMM's path: the fastest this CPU runs, or RADIXLM_BF16_PATH's (a ValueError where
    the CPU cannot run it)."""
    return cpu_linear.resolve_bf16_path(ext, RADIXLM_BF16_PATH.get())


def float_weights_instead(requested: str) -> str | None:
    """Why a model's quantized weights load as float32 here under `--quantization requested`, or
    None where our quantized kernels run them: with `auto`, where no kernel can run (no compiler, a
    failed build) or at the generic level (torch's float32 GEMM is faster there); an explicit
    format where no kernel can run is a ValueError (refused at start, with the reason)."""
    chosen = cpu_isa()
    if chosen is None or load_cpu_kernels() is None:
        if requested != "auto":
            raise ValueError(f"--quantization {requested} needs the C++ CPU kernels, which cannot run here (no C++ "
                             "compiler, or their build failed: see the log above); use --quantization none")
        return "the C++ CPU kernels cannot run here (see the log above), so a decode step is slower too"
    if requested == "auto" and not chosen.quantized_kernels_are_fast:
        return f"at the {chosen.level} ISA level torch's float32 GEMM runs it faster than our quantized kernels"
    return None


_chosen: dict[str, CpuIsa | None] = {}


def cpu_isa() -> CpuIsa | None:
    """This process's ISA level (probed once), or None where no kernel can be built here."""
    if "isa" not in _chosen:
        features = isa.probe(cache_dir() / "extensions")
        if features is None:
            _chosen["isa"] = None
        else:
            level = isa.choose_level(features, RADIXLM_CPU_ISA.get())
            _chosen["isa"] = CpuIsa(level.name, frozenset(features.present & level.allows))
    return _chosen["isa"]


def load_cpu_kernels() -> cpu_linear.Extension | None:
    """The C++ CPU kernels built for this process's level (once, into the cache), or None where
    they cannot run (no compiler, a failed build: the reason is logged)."""
    chosen = cpu_isa()
    if chosen is None:
        return None
    return cpu_linear.load_level(cache_dir() / "extensions", chosen.level)
