"""`--device cuda` is refused at startup, with a message naming what is missing, by every door
(ServerArgs, the in-process Engine, `radixlm serve`), before any model is loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixlm.runtime.server_args import ServerArgs


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
    """`--dtype auto` on CPU: bfloat16 where the CPU has AVX512-BF16, float32 elsewhere (both
    branches, whatever this CPU is); RADIXLM_CPU_AUTO_DTYPE overrides; named dtypes are kept."""
    import torch

    from radixlm.kernels import cpu_linear

    monkeypatch.delenv("RADIXLM_CPU_AUTO_DTYPE", raising=False)
    with open("/proc/cpuinfo") as f:
        has_bf16 = "avx512_bf16" in f.read().split()
    assert ServerArgs().torch_dtype == (torch.bfloat16 if has_bf16 else torch.float32)
    for hardware, expected in [(True, torch.bfloat16), (False, torch.float32)]:
        monkeypatch.setattr(cpu_linear, "cpu_supports_bf16", lambda hardware=hardware: hardware)
        assert ServerArgs().torch_dtype == expected
        assert ServerArgs(dtype="float32").torch_dtype == torch.float32
        assert ServerArgs(dtype="bfloat16").torch_dtype == torch.bfloat16
    monkeypatch.setenv("RADIXLM_CPU_AUTO_DTYPE", "float32")
    assert ServerArgs().torch_dtype == torch.float32
    monkeypatch.setenv("RADIXLM_CPU_AUTO_DTYPE", "half")
    with pytest.raises(ValueError, match="RADIXLM_CPU_AUTO_DTYPE must be float32 or bfloat16, got 'half'"):
        _ = ServerArgs().torch_dtype
