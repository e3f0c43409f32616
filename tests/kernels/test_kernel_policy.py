"""The kernel policy's per-level choices (runtime/model/kernel_policy.py), at every ISA level this
CPU runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from radixlm.kernels import cpu_linear
from radixlm.runtime.model import kernel_policy


@pytest.fixture
def chosen(ext: Any, monkeypatch: pytest.MonkeyPatch) -> kernel_policy.CpuIsa:
    """The runtime's choice of level replaced by `ext`'s for this test."""
    features = ext.cpu_features()
    level = kernel_policy.CpuIsa(features["isa"], frozenset(name for name, on in features.items() if on is True))
    monkeypatch.setitem(kernel_policy._chosen, "isa", level)
    return level


def test_bf16_products_take_our_kernel_at_every_size_without_bf16_hardware(
        ext: Any, chosen: kernel_policy.CpuIsa, tmp_path: Path) -> None:
    """Where the CPU multiplies bf16 only by emulation (torch's oneDNN too), our emulated bf16 GEMM
    takes every row of a bfloat16 model's products, a prefill's included, and the prefill stays
    as close to the float32 model as bf16 weights allow; with bf16 hardware the measured row
    limits of cpu_linear.BF16_MAX_ROWS hold."""
    from radixlm_testing import runner_extend, save_tiny_model
    from safetensors.torch import load_file

    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig

    save_tiny_model(tmp_path, "llama", vocab_size=512)
    cfg = ModelConfig.from_dir(tmp_path)
    prompt = [(11 * i) % 500 + 3 for i in range(40)]  # 40 rows: past the emulated path's 16
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        runner = ModelRunner(cfg, RunnerConfig(dtype, "torch", 256, 4, cfg.context_len),
                             load_file(tmp_path / "model.safetensors"))
        linear = runner.model.layers[0].qkv_proj
        if dtype == torch.bfloat16:
            path = cpu_linear.bf16_path(ext)
            want = sys.maxsize if path == "emulated" and not chosen.bf16_in_hardware else cpu_linear.BF16_MAX_ROWS[path]
            assert linear.max_rows == want
        row = runner.req_to_token_pool.alloc()
        logits[dtype] = runner_extend(runner, [row], [0], [prompt]).float()
    err = (torch.log_softmax(logits[torch.bfloat16], -1) - torch.log_softmax(logits[torch.float32], -1)).abs().max()
    assert err.item() < 0.1, err.item()


def test_attention_kernels_by_pool_and_bf16_path(ext: Any) -> None:
    """The paged attention's long paths, one rule for decode steps and the attention backend: a
    float32 pool takes the flash kernels (float32 FMAs) at every level; a bf16 pool the flash
    kernels on the vdpbf16ps path, AMX tiles on the AMX one, neither where vdpbf16ps is emulated."""
    choose = kernel_policy.attention_kernels
    for head_dim in (64, 128):
        assert choose(ext, torch.float32, "emulated", head_dim) == kernel_policy.AttentionKernels(amx=False, flash=True)
        assert choose(ext, torch.bfloat16, "emulated", head_dim) == kernel_policy.AttentionKernels(amx=False, flash=False)
        if "avx512bf16" in cpu_linear.available_bf16_paths(ext):
            assert choose(ext, torch.bfloat16, "avx512bf16", head_dim).flash
        if "amx" in cpu_linear.available_bf16_paths(ext):
            assert choose(ext, torch.bfloat16, "amx", head_dim) == kernel_policy.AttentionKernels(
                amx=cpu_linear.amx_attention_supported(ext, head_dim), flash=False)
    assert not choose(ext, torch.float32, "emulated", 80).flash  # a head size the flash kernels do not take
