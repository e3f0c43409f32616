"""`--device cuda` is refused at startup, with a message naming what is missing, by every door
(ServerArgs, the in-process Engine, `radixlm serve`), before any model is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from radixlm.runtime.config.server_args import ServerArgs


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_server_args_refuse_cuda_naming_what_is_missing(device: str) -> None:
    with pytest.raises(ValueError, match="--device cuda is not supported yet") as info:
        ServerArgs(device=device)
    for missing in ("forward batch", "attention backend", "grammar masks", "sampler", "KV pool"):
        assert missing in str(info.value)


def test_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="device must be cpu, got 'tpu'"):
        ServerArgs(device="tpu")
    assert ServerArgs(device="cpu").device == "cpu"


def test_engine_refuses_cuda_before_loading_anything() -> None:
    from radixlm.runtime.engine import Engine

    with pytest.raises(ValueError, match="--device cuda is not supported yet"):
        Engine(model_path="/nonexistent/model", device="cuda")  # the path is never looked at


def test_serve_refuses_cuda_with_a_clear_message() -> None:
    proc = subprocess.run([sys.executable, "-m", "radixlm.runtime.server.serve", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--device cuda is not supported yet" in proc.stderr and "Traceback" not in proc.stderr


def test_auto_dtype_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dtype auto` on CPU: bfloat16 where the model layer's probe says bf16 products run faster
    (`cpu_linear.prefers_bf16`), float32 elsewhere (both branches, whatever this CPU is; the runner
    config asks the real probe); RADIXLM_CPU_AUTO_DTYPE overrides without probing; named dtypes are
    kept."""
    import tempfile

    import torch
    from radixlm_testing import save_tiny_model

    from radixlm.kernels import cpu_linear
    from radixlm.runtime.model.kernel_policy import cpu_isa, load_cpu_kernels
    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_runner import RunnerConfig

    def never() -> bool:
        raise AssertionError("the probe ran although the dtype was given")

    monkeypatch.delenv("RADIXLM_CPU_AUTO_DTYPE", raising=False)
    for prefers, expected in [(True, torch.bfloat16), (False, torch.float32)]:
        assert ServerArgs().torch_dtype(lambda prefers=prefers: prefers) == expected
        assert ServerArgs(dtype="float32").torch_dtype(never) == torch.float32
        assert ServerArgs(dtype="bfloat16").torch_dtype(never) == torch.bfloat16
    with tempfile.TemporaryDirectory() as d:
        save_tiny_model(Path(d), "llama")
        cfg = ModelConfig.from_dir(d)
    chosen = cpu_isa()
    measured = cpu_linear.prefers_bf16(chosen is not None and chosen.bf16_in_hardware, load_cpu_kernels)
    runner = RunnerConfig.from_server_args(ServerArgs(max_total_tokens=64), cfg)
    assert runner.dtype == (torch.bfloat16 if measured else torch.float32)
    monkeypatch.setenv("RADIXLM_CPU_AUTO_DTYPE", "float32")
    assert ServerArgs().torch_dtype(never) == torch.float32
    monkeypatch.setenv("RADIXLM_CPU_AUTO_DTYPE", "half")
    with pytest.raises(ValueError, match="RADIXLM_CPU_AUTO_DTYPE must be float32 or bfloat16, got 'half'"):
        ServerArgs().torch_dtype(never)


def test_auto_dtype_rule_measures_only_where_the_cpu_has_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefers_bf16`: no bf16 in hardware -> float32 without loading the kernels; with it, the measured
    speedup against BF16_AUTO_MIN_SPEEDUP (measured once per process), or bfloat16 when our
    kernels are off."""
    from radixlm.kernels import cpu_linear

    def never() -> None:
        raise AssertionError("the kernels were loaded on a CPU without AVX512-BF16")

    monkeypatch.setattr(cpu_linear, "_bf16_choice", {})
    assert cpu_linear.prefers_bf16(False, never) is False
    assert cpu_linear.prefers_bf16(True, lambda: None) is True
    ext = object()
    for speedup, expected in [(cpu_linear.BF16_AUTO_MIN_SPEEDUP + 0.5, True), (cpu_linear.BF16_AUTO_MIN_SPEEDUP - 0.3, False)]:
        monkeypatch.setattr(cpu_linear, "_bf16_choice", {})
        monkeypatch.setattr(cpu_linear, "bf16_speedup", lambda e, speedup=speedup: speedup)
        monkeypatch.setattr(cpu_linear, "bf16_path", lambda e: "avx512bf16")
        assert cpu_linear.prefers_bf16(True, lambda: ext) is expected
        monkeypatch.setattr(cpu_linear, "bf16_speedup", lambda e: never())
        assert cpu_linear.prefers_bf16(True, lambda: ext) is expected  # decided once


def test_bf16_speedup_is_measured_on_this_cpu() -> None:
    """The probe runs here on the bf16 path this CPU has (emulated where it lacks AVX512-BF16)
    and gives a finite ratio; no assertion on its size, which is the machine's fact."""
    import math

    from radixlm.kernels import cpu_linear
    from radixlm.runtime.model.kernel_policy import load_cpu_kernels

    ext = load_cpu_kernels()
    assert ext is not None, "the C++ CPU kernels run on every test machine (it has a compiler)"
    speedup = cpu_linear.bf16_speedup(ext, rows=8, k=64, n=128, repeats=2)
    assert math.isfinite(speedup) and speedup > 0
