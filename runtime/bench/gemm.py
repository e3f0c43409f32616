"""`python -m radixlm.runtime.bench.gemm [ROWS ...]`: one decode step's linear layers of the default
model's shape (30 layers of qkv 576x960, o 576x576, gate_up 576x3072, down 1536x576; distinct
weights, so they stream from memory as in a real step) through torch's GEMM and each of our
kernels this CPU runs (float32, bf16, and the block-quantized q8_0 / q4_1 ones in their
weight-only float32 and int8 modes), for each row count: milliseconds (median of 7), GFLOP/s and the weights'
GB/s. The figures behind `cpu_linear.kernel_max_rows`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial

from radixlm.runtime.config.envs import set_process_defaults

set_process_defaults()  # before torch loads (RADIXLM_CPU_ISA caps torch's kernels too)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from radixlm.kernels import cpu_linear, quant  # noqa: E402
from radixlm.runtime.model.kernel_policy import load_cpu_kernels  # noqa: E402

LAYERS, HIDDEN, INTERMEDIATE, QKV = 30, 576, 1536, 960
SHAPES = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTERMEDIATE), (INTERMEDIATE, HIDDEN)]


def _median_ms(step: Callable[[], object]) -> float:
    step()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[3] * 1e3


def _step(linear: Callable[[torch.Tensor, torch.Tensor], object], weights: list[list[torch.Tensor]],
          inputs: dict[int, torch.Tensor]) -> Callable[[], object]:
    """One step: every layer's four products of the inputs (by width) with `weights`."""
    return lambda: [linear(inputs[k], w) for layer in weights for w, (k, _) in zip(layer, SHAPES, strict=True)]


def _bf16(ext: cpu_linear.Extension, path: int, x: torch.Tensor, w: torch.Tensor) -> object:
    return ext.bf16_linear(x, w, None, None, path)


def main(argv: list[str]) -> None:
    ext = load_cpu_kernels()
    if ext is None:
        raise SystemExit("the C++ kernels cannot run here (see the log)")
    rows_list = [int(a) for a in argv] or [1, 4, 8, 16, 32, 64, 128, 512]
    weights = [[torch.randn(k, n) * 0.05 for k, n in SHAPES] for _ in range(LAYERS)]
    params = LAYERS * sum(k * n for k, n in SHAPES)
    torch_bf16 = [[w.t().contiguous().bfloat16() for w in layer] for layer in weights]
    torch_fp32 = [[w.t().contiguous() for w in layer] for layer in weights]
    fp32_panels = [[cpu_linear.pack(w) for w in layer] for layer in weights]
    pairs = [[cpu_linear.pack_pairs(w) for w in layer] for layer in weights]
    quantized = {fmt: [[quant.pack(quant.quantize(w.t(), fmt)) for w in layer] for layer in weights]
                 for fmt in ("q8_0", "q4_1")}
    modes = ["float32", "int8"]
    print(f"CPU: {ext.cpu_features()}; torch threads {torch.get_num_threads()}; {params / 1e6:.0f}M weights")
    read_ms = _median_ms(lambda: [w.sum() for layer in torch_fp32 for w in layer])
    print(f"read: the float32 weights summed by torch, {read_ms:.1f} ms, {params * 4 / read_ms / 1e6:.1f} GB/s")
    print("rows  kernel                ms   GFLOP/s  weights GB/s")
    for rows in rows_list:
        xs = {k: torch.randn(rows, k) for k in (HIDDEN, INTERMEDIATE)}
        xb = {k: v.bfloat16() for k, v in xs.items()}
        runs = {
            "torch fp32": (_step(F.linear, torch_fp32, xs), 4),
            "torch bf16": (_step(F.linear, torch_bf16, xb), 2),
            "ours fp32": (_step(lambda x, w: ext.packed_linear(x, w, None, None), fp32_panels, xs), 4),
        }
        for path in cpu_linear.available_bf16_paths(ext):
            index = cpu_linear.BF16_PATHS.index(path)
            run = partial(_bf16, ext, index)
            runs[f"ours bf16 {path}"] = (_step(run, pairs, xs), 2)
        for fmt, packed in quantized.items():
            for mode in modes:
                run = partial(ext.q_linear, mode=quant.MODES[mode])
                runs[f"ours {fmt} {mode}"] = (_step(run, packed, xs), quant.FORMATS[fmt][0] / quant.BLOCK)
        for name, (step, width) in runs.items():
            ms = _median_ms(step)
            print(f"{rows:4d}  {name:20s} {ms:6.1f} {2 * rows * params / ms / 1e6:8.0f} {params * width / ms / 1e6:8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
