"""Our model runner against Hugging Face transformers on tiny random-weight models (fp32).

On an AVX-512 CPU the runner's decode steps go through the C++ DecodeStack (kernels/csrc) and its
few-row products through the packed kernel; `cpu_kernels=False` is the plain torch path. Both are
checked against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from radixlm_testing import TINY_CONFIGS, runner_decode, save_tiny_model
from radixlm_testing import runner_extend as extend
from safetensors.torch import load_file

from radixlm.kernels import cpu_linear
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.scheduler import Scheduler, SchedulerConfig

KINDS = sorted(TINY_CONFIGS)
ATOL = 1e-4


def make_runner(model_dir: Path, backend: str = "torch", pool_tokens: int = 2000, cpu_kernels: bool = True) -> ModelRunner:
    cfg = ModelConfig.from_dir(model_dir)
    runner_cfg = RunnerConfig(torch.float32, backend, pool_tokens, 16, cfg.context_len, cpu_kernels=cpu_kernels)
    runner = ModelRunner(cfg, runner_cfg, load_file(model_dir / "model.safetensors"))
    # the C++ path runs on every CPU (at its ISA level): it must really be the one under test
    assert runner.cpu_kernels == (cpu_kernels and backend == "torch")
    return runner


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


@pytest.fixture(params=KINDS)
def tiny(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    hf = save_tiny_model(tmp_path, request.param)
    return hf, tmp_path


def test_config_reads_variant_options(tmp_path: Path) -> None:
    save_tiny_model(tmp_path, "llama3-rope")
    cfg = ModelConfig.from_dir(tmp_path)
    assert cfg.rope.scaling_type == "llama3" and cfg.rope.factor == 8.0 and cfg.tie_word_embeddings


def test_prefill_logits_match_hf(tiny: tuple[torch.nn.Module, Path]) -> None:
    hf, path = tiny
    runner = make_runner(path)
    prompts = [[1, 5, 9, 33, 7, 100, 3, 250, 17], [4, 4, 2], [200]]
    rows = [runner.req_to_token_pool.alloc() for _ in prompts]
    logits = extend(runner, rows, [0, 0, 0], prompts)
    ref = torch.cat([hf_logits(hf, p) for p in prompts])
    assert (logits - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "torch-ops"])
def test_extend_over_cached_prefix_and_decode_match_hf(tiny: tuple[torch.nn.Module, Path], cpu_kernels: bool) -> None:
    hf, path = tiny
    runner = make_runner(path, cpu_kernels=cpu_kernels)
    seqs = [list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13, 14]]
    ref = [hf_logits(hf, s) for s in seqs]
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    prefix = [20, 3]
    extend(runner, rows, [0, 0], [s[:p] for s, p in zip(seqs, prefix)])
    # extend with a cached prefix: positions prefix .. len-3
    mid = [len(s) - 2 for s in seqs]
    got = extend(runner, rows, prefix, [s[p:m] for s, p, m in zip(seqs, prefix, mid)])
    want = torch.cat([r[p:m] for r, p, m in zip(ref, prefix, mid)])
    assert (got - want).abs().max().item() <= ATOL
    # two decode steps
    for step in range(2):
        pos = [m + step for m in mid]
        got = runner_decode(runner, rows, seqs, pos)
        want = torch.stack([r[p] for r, p in zip(ref, pos)])
        assert (got - want).abs().max().item() <= ATOL


def run_greedy(runner: ModelRunner, prompts: list[list[int]], steps: int) -> list[list[int]]:
    sched = Scheduler(runner, SchedulerConfig(runner.cfg.context_len, 16))
    params = SamplingParams(temperature=0.0, max_new_tokens=steps, ignore_eos=True)
    reqs = [Req(str(i), p, params, frozenset()) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add_request(r)
    while sched.has_work:
        sched.step()
    sched.check_integrity()
    sched.flush_cache()
    assert runner.kv_pool.num_free == runner.kv_pool.max_total_num_tokens
    return [r.output_ids for r in reqs]


def hf_greedy(hf: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_64_steps_batched_match_hf(tiny: tuple[torch.nn.Module, Path]) -> None:
    hf, path = tiny
    prompts = [[1, 2, 3], list(range(10, 31)), [99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89]]
    ours = run_greedy(make_runner(path), prompts, 64)
    for prompt, got in zip(prompts, ours):
        assert got == hf_greedy(hf, prompt, 64)


@pytest.mark.parametrize(
    "overrides",
    [
        # widths that are not multiples of the kernel's 64-column panels nor of its 16-float
        # vectors, and 3 query heads per KV head
        dict(hidden_size=72, num_attention_heads=6, num_key_value_heads=2, head_dim=12, intermediate_size=100),
        dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128, intermediate_size=192),
    ],
    ids=["odd-widths-gqa3", "head-dim-128"],
)
def test_decode_with_odd_shapes_and_scattered_slots_matches_hf(tmp_path: Path, overrides: dict[str, int]) -> None:
    """Decode steps of requests of different lengths whose KV slots are not consecutive."""
    hf = save_tiny_model(tmp_path, "qwen2", **overrides)  # qwen2: q/k/v biases too
    runner = make_runner(tmp_path)
    seqs = [list(range(5, 60)), [3, 1, 4, 1, 5, 9, 2, 6], list(range(200, 230))]
    ref = [hf_logits(hf, s) for s in seqs]
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    decode_from = [len(s) - 4 for s in seqs]
    held = runner.kv_pool.alloc(7)  # interleave: free every other slot, so the requests' slots scatter
    assert held is not None
    runner.kv_pool.free(held[::2].clone())
    extend(runner, rows, [0] * len(seqs), [s[:d] for s, d in zip(seqs, decode_from)], all_logits=False)
    for step in range(4):
        pos = [d + step for d in decode_from]
        got = runner_decode(runner, rows, seqs, pos)
        want = torch.stack([r[p] for r, p in zip(ref, pos)])
        assert (got - want).abs().max().item() <= ATOL, step


def test_triton_backend_matches_torch_backend(tmp_path: Path) -> None:
    """The model over the Triton kernels (interpreter) gives the torch backend's greedy tokens."""
    save_tiny_model(tmp_path, "qwen3")
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    want = run_greedy(make_runner(tmp_path, "torch"), prompts, 4)
    assert run_greedy(make_runner(tmp_path, "triton"), prompts, 4) == want


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("batch_size", [1, 7, 16, 17, 32, 64])
def test_prefill_extend_and_decode_batches_match_hf(tmp_path: Path, kind: str, batch_size: int) -> None:
    """fp32 logits within 1e-4 of transformers for a batch's prefill, its extend over the cached
    prefixes and three decode steps, over scattered pool slots, at batch sizes around the
    kernels' row blocks (6-row passes, halves of the rows split between threads; DecodeStack takes
    every float32 decode batch, the paged attention kernel the extends)."""
    hf = save_tiny_model(tmp_path, kind)
    cfg = ModelConfig.from_dir(tmp_path)
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 8192, batch_size + 1, cfg.context_len),
                         load_file(tmp_path / "model.safetensors"))
    gen = torch.Generator().manual_seed(batch_size)
    seqs = [torch.randint(0, 256, (int(torch.randint(12, 48, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(batch_size)]
    ref = [hf_logits(hf, s) for s in seqs]
    held = runner.kv_pool.alloc(2 * sum(len(s) for s in seqs))  # free every other slot: the requests' slots scatter
    assert held is not None
    runner.kv_pool.free(held[::2].clone())
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    cached = [len(s) - 9 for s in seqs]
    got = extend(runner, rows, [0] * batch_size, [s[:c] for s, c in zip(seqs, cached)])
    assert (got - torch.cat([r[:c] for r, c in zip(ref, cached)])).abs().max().item() <= ATOL
    mid = [len(s) - 3 for s in seqs]
    got = extend(runner, rows, cached, [s[c:m] for s, c, m in zip(seqs, cached, mid)])
    assert (got - torch.cat([r[c:m] for r, c, m in zip(ref, cached, mid)])).abs().max().item() <= ATOL
    for step in range(3):
        pos = [m + step for m in mid]
        got = runner_decode(runner, rows, seqs, pos)
        assert (got - torch.stack([r[p] for r, p in zip(ref, pos)])).abs().max().item() <= ATOL, step
    if runner.cpu_kernels:  # the paged kernel ran the extends, and the decodes DecodeStack could not take
        paged = runner.attn_backend.num_paged_forwards  # type: ignore[attr-defined]
        stack_rows = cpu_linear.kernel_max_rows(torch.float32, "emulated")
        assert paged == 2 + (3 if batch_size > stack_rows else 0), paged
