"""The bf16 GEMM (kernels/csrc/kernels/bf16_gemm.cpp) on each of its paths: AMX tiles, AVX512-BF16
vdpbf16ps, and vdpbf16ps emulated over the vector layer, at every ISA level this CPU runs. Every
level runs the emulation (with its own tile shape; the same packing and epilogue as the native
vector path) and checks it bit for bit against a scalar model of the instruction; the paths a
level runs here are checked against it and against torch; the dispatch follows the CPU's flags
and the level (the hardware paths only in the avx512 build). (Engine-level runs on each path:
test_cpu_linear.py.) The torch-free driver (tests/kernels/csrc/test_bf16_gemm.cpp) checks each path
a build runs against the same model of vdpbf16ps and float64, with the same bits on 1-3 threads,
natively per x86 build and for aarch64 (the emulated path over NEON) under qemu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from levels import bf16_path_runs, level_params
from test_vec_layer import (  # the C++ drivers' build and run
    ARM_LEVELS,
    NATIVE_BUILDS,
    REPO,
    _arm_case,
    _native_case,
)

from radixlm.kernels import cpu_linear


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_dispatch_follows_the_cpu_flags_and_the_level(ext: Any) -> None:
    """The hardware paths exist only in the avx512 build, and run where the CPU has them (AMX:
    where the OS also lets this process use tiles); the emulation runs everywhere."""
    flags = _cpu_flags()
    features = ext.cpu_features()
    avx512 = features["build"] == "avx512"
    assert features["avx512_bf16"] == (avx512 and "avx512_bf16" in flags)
    assert not features["amx_bf16"] or (avx512 and {"amx_tile", "amx_bf16"} <= flags)
    expected = ["emulated"] + ["avx512bf16"] * features["avx512_bf16"] + ["amx"] * features["amx_bf16"]
    assert cpu_linear.available_bf16_paths(ext) == expected
    assert cpu_linear.bf16_path(ext) == expected[-1]
    assert cpu_linear.resolve_bf16_path(ext, None) == expected[-1]
    assert cpu_linear.resolve_bf16_path(ext, "emulated") == "emulated"
    with pytest.raises(ValueError, match="known paths: emulated, avx512bf16, amx"):
        cpu_linear.resolve_bf16_path(ext, "avx2")
    # bf16 weights go through our kernel for up to 64 rows with AMX, 512 with vdpbf16ps, 16
    # emulated; float32 products always
    assert cpu_linear.kernel_max_rows(torch.bfloat16, "amx") == 64
    assert cpu_linear.kernel_max_rows(torch.bfloat16, "avx512bf16") == 512
    assert cpu_linear.kernel_max_rows(torch.bfloat16, "emulated") == 16
    assert cpu_linear.kernel_max_rows(torch.float32, "amx") > 1 << 30


@pytest.mark.parametrize(("ext", "_"), level_params(
    [("a missing path",)], lambda module, _: set(cpu_linear.available_bf16_paths(module)) != set(cpu_linear.BF16_PATHS)),
    indirect=["ext"])
def test_a_path_the_level_cannot_run_is_refused(ext: Any, _: str) -> None:
    """By the C++ side too (a path index passed past resolve_bf16_path), naming what it needs (at
    each level that lacks a path here)."""
    missing = [path for path in cpu_linear.BF16_PATHS if path not in cpu_linear.available_bf16_paths(ext)]
    w = cpu_linear.pack_pairs(torch.randn(64, 64))
    for path, needs in [("avx512bf16", "AVX512-BF16"), ("amx", "AMX")]:
        if path in missing:
            with pytest.raises(RuntimeError, match=needs):
                cpu_linear.bf16_linear(ext, torch.randn(2, 64), w, 64, path=path)
            with pytest.raises(ValueError, match="cannot run here"):
                cpu_linear.resolve_bf16_path(ext, path)


def test_pair_packing_layout() -> None:
    w = torch.arange(5 * 70, dtype=torch.float32).reshape(5, 70)  # K=5 -> 32 rows, N=70 -> 128 columns
    packed = cpu_linear.pack_pairs(w)
    assert packed.shape == (4, 16, 32, 2) and packed.dtype == torch.bfloat16
    wb = w.bfloat16()
    for k, n in [(0, 0), (1, 0), (4, 69), (3, 33), (2, 64)]:
        assert packed[n // 32, k // 2, n % 32, k % 2] == wb[k, n]
    assert packed[2, 2, 6, 1] == 0 and packed[3, 0, 0, 0] == 0  # k = 5 and n = 102: padding


def _vdpbf16ps_model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [K, N] (both bf16, K even) as vdpbf16ps sums it, in float32 scalars: per
    k-pair, the odd product is added first, then the even one; each addition rounds once (a
    product of two bf16 values is exact in float32)."""
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], w.shape[1])
    for p in range(x.shape[1] // 2):
        acc = acc + xf[:, 2 * p + 1 : 2 * p + 2] * wf[2 * p + 1]
        acc = acc + xf[:, 2 * p : 2 * p + 1] * wf[2 * p]
    return acc


@pytest.mark.parametrize(("ext", "path"), level_params([("emulated",), ("avx512bf16",)], bf16_path_runs), indirect=["ext"])
@pytest.mark.parametrize("m", [1, 2, 3, 11])
def test_vector_paths_sum_exactly_as_vdpbf16ps(ext: Any, path: str, m: int) -> None:
    """Every tile width a level's passes take (passes of 1-2 rows span whole panels, of more rows
    narrower tiles where a level has few registers: bf16_gemm.cpp's Bf16Tile) sums each column
    exactly as the instruction."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(m, 96, generator=gen).bfloat16()
    w = (torch.randn(96, 64, generator=gen) * 0.1).bfloat16()
    out = cpu_linear.bf16_linear(ext, x.float(), cpu_linear.pack_pairs(w), 64, path=path)
    assert torch.equal(out, _vdpbf16ps_model(x, w))


@pytest.mark.parametrize(("ext", "path"), level_params([(p,) for p in cpu_linear.BF16_PATHS], bf16_path_runs),
                         indirect=["ext"])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 576, 960), (1, 576, 576), (5, 64, 100), (16, 96, 64), (17, 576, 576),
                                           (33, 1536, 64), (130, 100, 192), (300, 64, 128)])
@pytest.mark.parametrize("extras", ["none", "both"])
def test_paths_match_torch(ext: Any, path: str, m: int, k: int, n: int, extras: str) -> None:
    """Row tails (not a multiple of 8, 16 or 32), K tails (not a multiple of 32), N tails, several
    row chunks (> 128 rows), bias and residual: each path equals float32 arithmetic on the
    bf16-rounded inputs up to the order of the float32 sums."""
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    w = torch.randn(k, n, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if extras == "both" else None
    residual = torch.randn(m, n, generator=gen) if extras == "both" else None
    out = cpu_linear.bf16_linear(ext, x, cpu_linear.pack_pairs(w), n, residual, bias, path=path)
    ref = x.bfloat16().double() @ w.bfloat16().double()
    if bias is not None:
        ref += bias.double()
    if residual is not None:
        ref += residual.double()
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=2e-5 * (k ** 0.5), rtol=1e-5)


@pytest.mark.parametrize(("ext", "path"), level_params([("emulated",), ("avx512bf16",)], bf16_path_runs), indirect=["ext"])
def test_every_split_of_the_panels_gives_the_same_bits(ext: Any, path: str, on_thread_counts: Any) -> None:
    """A product of few rows gives each thread an equal run of panels, computed two at a time
    and a lone one at an odd run's end: 18 panels (576 columns) split 9 : 9, or 6 : 6 : 6 on three
    threads. Each column's sum is the same sequence of vdpbf16ps steps however the panels fall,
    so every thread count gives the same bits (and the single-thread run is checked exactly)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 576, generator=gen).bfloat16()
    w = (torch.randn(576, 576, generator=gen) * 0.05).bfloat16()
    packed = cpu_linear.pack_pairs(w)
    outs = on_thread_counts(lambda: cpu_linear.bf16_linear(ext, x.float(), packed, 576, path=path))
    assert torch.equal(outs[0], _vdpbf16ps_model(x, w))
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


def test_bf16_input_gives_bf16_output_and_residual_may_be_strided(ext: Any) -> None:
    w = torch.randn(64, 128) * 0.1
    x = torch.randn(3, 64).bfloat16()
    wide = torch.randn(3, 256)
    out = cpu_linear.bf16_linear(ext, x, cpu_linear.pack_pairs(w), 128, wide[:, :128])
    assert out.dtype == torch.bfloat16
    ref = x.float() @ w.bfloat16().float() + wide[:, :128]
    torch.testing.assert_close(out.float(), ref, atol=2 ** -7 * ref.abs().max().item(), rtol=0)


# the driver links the GEMM alone, torch-free (kernels/parallel.h on OpenMP)
DRIVER = ["-DRADIXLM_NO_TORCH", "-fopenmp", str(REPO / "kernels" / "csrc" / "kernels" / "bf16_gemm.cpp")]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_driver_native(level: str, tmp_path: Path) -> None:
    _native_case(level, "test_bf16_gemm.cpp", rf"bf16_gemm {level}: \d+ checks passed", tmp_path, DRIVER)


@pytest.mark.parametrize("test_id", ["generic", "neon"])
def test_driver_aarch64(test_id: str, tmp_path: Path) -> None:
    closing = rf"bf16_gemm {ARM_LEVELS[test_id][0]}: \d+ checks passed \(paths: emulated\)"
    _arm_case(test_id, "test_bf16_gemm.cpp", closing, tmp_path, DRIVER)
