"""The C++ CPU kernels (kernels/csrc): the packed linear kernel against torch at every ISA level
this CPU runs (each level has its own tile shape: kernels/csrc/kernels/packed_gemm.h), and
bfloat16 models running through it and through DecodeStack against the float32 torch path. (The
float32 runner with these kernels is checked against transformers in
tests/runtime/test_model_runner.py.) DecodeStack also runs without torch in a C++ driver
(tests/kernels/csrc/test_decode_stack.cpp: a tiny model against float64, every weight format, both
pools, tensor parallel over two threads), natively per x86 build and for aarch64 under qemu."""

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


@pytest.fixture
def runner_at_level(ext: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The model runner's kernels at `ext`'s level for this test (the runtime's choice, made once
    per process in kernel_policy, is replaced for its duration); gives the level's name."""
    from radixlm.runtime.model import kernel_policy

    features = ext.cpu_features()
    allowed = frozenset(name for name, on in features.items() if on is True)
    monkeypatch.setitem(kernel_policy._chosen, "isa", kernel_policy.CpuIsa(features["isa"], allowed))
    return features["isa"]


@pytest.mark.parametrize(("k", "n", "m"), [(576, 960, 1), (576, 960, 2), (64, 192, 3), (576, 960, 4), (1536, 576, 7),
                                           (64, 100, 16), (96, 64, 5), (576, 576, 13), (100, 3072, 37), (64, 192, 300)])
@pytest.mark.parametrize("extras", ["none", "bias", "residual", "both"])
def test_packed_linear_matches_torch(ext: Any, k: int, n: int, m: int, extras: str) -> None:
    """Rows in passes of 1 up to the level's tile rows (13 at 6: 5 + 4 + 4, each half of the rows
    its own unit where there are few panels: 576 columns are 9), each pass as wide as the level's
    registers allow for its rows (packed_gemm.h's PackedTile: 64, 32 or 16 columns), K and N
    tails, a prefill-sized product."""
    gen = torch.Generator().manual_seed(k * n + m)
    w = torch.randn(k, n, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if extras in ("bias", "both") else None
    residual = torch.randn(m, n, generator=gen) if extras in ("residual", "both") else None
    out = cpu_linear.packed_linear(ext, x, cpu_linear.pack(w), n, residual, bias)
    ref = x @ w
    if bias is not None:
        ref += bias
    if residual is not None:
        ref += residual
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("n", [576, 320])
def test_every_split_of_the_columns_gives_the_same_bits(ext: Any, n: int, on_thread_counts: Any) -> None:
    """A product of few rows splits its columns in 32-column halves of panels between threads
    (9 panels on 2 threads: 4.5 each; 5 panels on 3 threads: halves at both ends of a run), with
    bias and residual. Each column's sum is the same sequence of FMAs however the columns fall,
    so every thread count gives the same bits."""
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(576, n, generator=gen) * 0.05
    x = torch.randn(3, 576, generator=gen)
    bias, residual = torch.randn(n, generator=gen), torch.randn(3, n, generator=gen)
    packed = cpu_linear.pack(w)
    outs = on_thread_counts(lambda: cpu_linear.packed_linear(ext, x, packed, n, residual, bias))
    torch.testing.assert_close(outs[0], x @ w + bias + residual, atol=1e-4, rtol=0)
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


def test_residual_with_a_row_stride(ext: Any) -> None:
    w = torch.randn(64, 128) * 0.1
    x = torch.randn(3, 64)
    wide = torch.randn(3, 256)
    residual = wide[:, :128]  # rows 256 apart
    out = cpu_linear.packed_linear(ext, x, cpu_linear.pack(w), 128, residual)
    torch.testing.assert_close(out, x @ w + residual, atol=1e-4, rtol=0)


def test_bfloat16_engine_decodes_through_the_kernel(tiny_model_dir: Path) -> None:
    """End to end at the process's own level (the levels' kernels: the other tests here)."""
    from radixlm.runtime.engine import Engine

    prompt_ids = list(range(100, 112))  # 12 tokens: the prefill, too, takes the kernel's path
    logprobs = {}
    for name, kwargs in {"fp32": {"dtype": "float32", "disable_cpu_kernels": True}, "kernel": {"dtype": "bfloat16"},
                         "torch": {"dtype": "bfloat16", "disable_cpu_kernels": True}}.items():
        engine = Engine(str(tiny_model_dir), max_total_tokens=512, random_seed=0, **kwargs)
        try:
            assert engine.runner.cpu_kernels == (name == "kernel")
            out = engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": 0},
                                  return_logprob=True, logprob_start_len=0)
            logprobs[name] = torch.tensor([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
        finally:
            engine.shutdown()
    kernel_err = (logprobs["kernel"] - logprobs["fp32"]).abs().max().item()
    torch_err = (logprobs["torch"] - logprobs["fp32"]).abs().max().item()
    assert kernel_err < 0.05, kernel_err
    assert kernel_err <= torch_err * 1.5 + 1e-3  # fp32 arithmetic on bf16 weights: no worse than bf16 torch


@pytest.mark.parametrize(("ext", "path"), level_params([(p,) for p in cpu_linear.BF16_PATHS], bf16_path_runs),
                         indirect=["ext"])
def test_bfloat16_decode_stack_against_float32(ext: Any, runner_at_level: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A prompt's extend (32 new tokens: the AMX attention path where it runs) and then teacher-
    forced decode steps (batched, different lengths) of a bfloat16 model through DecodeStack, on
    each ISA level and bf16 GEMM path this CPU runs, stay as close to the float32 model as
    bfloat16 torch ops do, or closer."""
    monkeypatch.setenv("RADIXLM_BF16_PATH", path)
    from radixlm_testing import runner_decode, runner_extend, save_tiny_model
    from safetensors.torch import load_file

    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig

    save_tiny_model(tmp_path, "qwen3", vocab_size=512, head_dim=64)  # q/k norms, GQA 4, AMX-sized heads
    cfg = ModelConfig.from_dir(tmp_path)
    seqs = [list(range(7, 47)), [5, 3, 9, 11, 2, 8, 13, 21, 34, 55]]
    start = [len(s) - 8 for s in seqs]
    logprobs = {}
    for name, dtype, kernels in [("fp32", torch.float32, False), ("kernel", torch.bfloat16, True),
                                 ("torch", torch.bfloat16, False)]:
        runner = ModelRunner(cfg, RunnerConfig(dtype, "torch", 512, 4, cfg.context_len, cpu_kernels=kernels),
                             load_file(tmp_path / "model.safetensors"))
        assert runner.cpu_kernels == kernels
        if kernels:
            assert type(runner.model.decode_stack).__module__ == ext.__name__  # the level under test
            assert runner.model.decode_stack.bf16_path == cpu_linear.BF16_PATHS.index(path)
            assert runner.attn_backend.amx == (path == "amx")
        rows = [runner.req_to_token_pool.alloc() for _ in seqs]
        prompt = runner_extend(runner, rows, [0, 0], [s[:n] for s, n in zip(seqs, start)], all_logits=False)
        steps = [torch.log_softmax(prompt.float(), dim=-1)]
        for step in range(8):
            logits = runner_decode(runner, rows, seqs, [n + step for n in start])
            steps.append(torch.log_softmax(logits.float(), dim=-1))
        logprobs[name] = torch.stack(steps)
    kernel_err = (logprobs["kernel"] - logprobs["fp32"]).abs().max().item()
    torch_err = (logprobs["torch"] - logprobs["fp32"]).abs().max().item()
    assert kernel_err < 0.1, kernel_err
    assert kernel_err <= torch_err * 1.5 + 1e-3, (kernel_err, torch_err)


def test_decodes_sharing_a_long_prefix_take_the_cascade(ext: Any, runner_at_level: str, tmp_path: Path) -> None:
    """A float32 decode batch whose requests share a cached prefix (the same KV slots, as the radix
    cache gives them) attends through the cascade kernel in DecodeStack at every ISA level (float32
    FMAs over a float32 pool), and its logits match transformers'."""
    from radixlm_testing import runner_decode, runner_extend, save_tiny_model
    from safetensors.torch import load_file

    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig

    hf = save_tiny_model(tmp_path, "llama", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, intermediate_size=192)
    cfg = ModelConfig.from_dir(tmp_path)
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 1024, 8, cfg.context_len),
                         load_file(tmp_path / "model.safetensors"))
    assert type(runner.model.decode_stack).__module__ == ext.__name__  # the level under test
    prefix = [(7 * i) % 250 + 3 for i in range(96)]  # at least kCascadeMinShared (64) shared positions
    seqs = [prefix + [11, 12, 13, 14], prefix + [21, 22, 23, 24, 25], prefix + [31, 32, 33], prefix + [41, 42, 43, 44]]
    with torch.no_grad():
        ref = [hf(torch.tensor([s])).logits[0] for s in seqs]
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    runner_extend(runner, rows[:1], [0], [prefix], all_logits=False)
    shared = runner.req_to_token_pool.req_to_token[rows[0], : len(prefix)].clone()
    for row in rows[1:]:
        runner.req_to_token_pool.write(row, 0, shared)
    decode_from = [len(s) - 2 for s in seqs]
    runner_extend(runner, rows, [len(prefix)] * len(seqs), [s[len(prefix):d] for s, d in zip(seqs, decode_from)],
                  all_logits=False)
    before = ext.num_cascade_calls()
    for step in range(2):
        pos = [d + step for d in decode_from]
        got = runner_decode(runner, rows, seqs, pos)
        want = torch.stack([r[p] for r, p in zip(ref, pos)])
        assert (got - want).abs().max().item() <= 1e-4, step
    assert ext.num_cascade_calls() - before == 2 * cfg.num_layers  # each layer of each step


# DecodeStack's driver links it with every kernel it calls, torch-free (kernels/parallel.h on OpenMP)
STACK_DRIVER = ["-DRADIXLM_NO_TORCH", "-fopenmp",
                *(str(REPO / "kernels" / "csrc" / "kernels" / name)
                  for name in ("decode_stack.cpp", "paged_attention.cpp", "flash_attention.cpp", "amx_attention.cpp",
                               "bf16_gemm.cpp", "quant_gemm.cpp", "kquant_gemm.cpp", "moe_experts.cpp", "rows.cpp"))]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_decode_stack_driver_native(level: str, tmp_path: Path) -> None:
    _native_case(level, "test_decode_stack.cpp", rf"decode_stack {level}: \d+ checks passed", tmp_path, STACK_DRIVER)


@pytest.mark.parametrize("test_id", list(ARM_LEVELS))
def test_decode_stack_driver_aarch64(test_id: str, tmp_path: Path) -> None:
    """The neon builds' int8 modes run the dot variant qemu's `max` CPU has (dotprod in the second)."""
    closing = rf"decode_stack {ARM_LEVELS[test_id][0]}: \d+ checks passed"
    _arm_case(test_id, "test_decode_stack.cpp", closing, tmp_path, STACK_DRIVER)


# a Q4_K_M file's mixes: v in Q6_K beside q/k in Q4_K; here up in Q5_K beside gate in Q4_K too, at a
# width (288) that is not a whole number of 64-column panels, so the parts' padding overlaps
MIXED_FORMATS = {"q_proj": "q4_k", "k_proj": "q4_k", "v_proj": "q6_k", "o_proj": "q4_k", "gate_proj": "q4_k",
                 "up_proj": "q5_k", "down_proj": "q8_0"}


def test_decode_stack_takes_products_in_parts(tmp_path: Path) -> None:
    """q/k/v and gate/up whose parts come in different quantized formats (Linear.parts) run in
    DecodeStack, q/k/v's bias added over all the parts: its decode steps (batched, different
    lengths) within 1e-5 of the same model's layer by layer."""
    from radixlm_testing import runner_decode, runner_extend, save_tiny_model
    from safetensors.torch import load_file

    from radixlm.kernels import quant
    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig

    save_tiny_model(tmp_path, "qwen2", hidden_size=256, intermediate_size=288, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64)  # Qwen2: q/k/v biases
    cfg = ModelConfig.from_dir(tmp_path)
    floats = load_file(tmp_path / "model.safetensors")
    weights = {name: quant.quantize(w, MIXED_FORMATS[name.split(".")[-2]])
               if name.split(".")[-2] in MIXED_FORMATS and name.endswith("weight") else w
               for name, w in floats.items()}
    seqs = [list(range(3, 30)), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    logits = []
    for in_stack in (True, False):
        runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len, quantization="gguf"),
                             weights)
        qkv, gate_up = runner.model.layers[0].qkv_proj, runner.model.layers[0].mlp.gate_up_proj
        assert qkv.parts is not None and len(qkv.parts) == 2 and gate_up.parts is not None
        assert runner.model.decode_stack is not None, runner.model.decode_stack_misfit()
        if not in_stack:
            runner.model.decode_stack = None
        rows = [runner.req_to_token_pool.alloc() for _ in seqs]
        start = [len(s) - 3 for s in seqs]
        runner_extend(runner, rows, [0, 0], [s[:n] for s, n in zip(seqs, start)], all_logits=False)
        logits.append(torch.stack([runner_decode(runner, rows, seqs, [n + i for n in start]) for i in range(3)]))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
