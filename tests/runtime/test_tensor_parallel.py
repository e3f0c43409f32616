"""`--tp-size 2` against tp 1 on tiny models whose head counts divide by 2: fp32 logits within 1e-5
for prefill, extend (over a cached prefix) and decode, over the shared-memory all-reduce and over
gloo's, with our CPU kernels and with torch ops, float and block-quantized weights; the same greedy
outputs through the Engine; sizes that do not divide refused with a clear message.

Rank 1 is a real process (`python -m radixlm.runtime.model.tensor_parallel`) joined over
torch.distributed (gloo on 127.0.0.1); what each path did is read from its counters."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from radixlm_testing import (
    FAMILY_CONFIGS,
    TINY_CONFIGS,
    process_alive,
    runner_decode,
    runner_extend,
    save_tiny_model,
    wait_until,
)

from radixlm.kernels.quant import QuantizedTensor, quantize
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig
from radixlm.runtime.model.shm_all_reduce import ShmAllReduce
from radixlm.runtime.model.tp_sharding import (
    ShardedWeights,
    check_tp_size,
    column_slice,
    shard_config,
    valid_tp_sizes,
)

ATOL = 1e-5
# every kind with 4 query heads over 2 KV heads (qwen3 and llama3-rope have 1 KV head by default)
KINDS = {kind: {"num_key_value_heads": 2} for kind in ("llama", "qwen2", "qwen3", "llama3-rope")}
# a mixture of experts whose halves the fused experts' kernel tiles (64 of each expert's 128)
KINDS["qwen3_moe"] = {"num_key_value_heads": 2, "moe_intermediate_size": 128}


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    """A tp rank 0 takes its share of the cores; give them back to the tests that follow."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    dirs = {}
    for kind, overrides in KINDS.items():
        dirs[kind] = tmp_path_factory.mktemp(f"tp-{kind}")
        save_tiny_model(dirs[kind], kind, **overrides)
    dirs["odd-vocab"] = tmp_path_factory.mktemp("tp-odd-vocab")  # lm_head replicated, not split
    save_tiny_model(dirs["odd-vocab"], "llama", vocab_size=255)
    return dirs


# every kind on the default path (our kernels, shared-memory all-reduce); the other paths on llama
CASES = [(kind, True, True) for kind in [*sorted(KINDS), "odd-vocab"]] + [
    ("llama", True, False), ("llama", False, True), ("llama", False, False)]


def runner_cfg(model_dir: Path, **kw: object) -> RunnerConfig:
    cfg = ModelConfig.from_dir(model_dir)
    return RunnerConfig(torch.float32, "torch", 2000, 16, cfg.context_len, **kw)  # type: ignore[arg-type]


SEQS = [list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [5, 9] * 12]


def three_passes(runner: ModelRunner) -> list[torch.Tensor]:
    """Prefill of three prompts, an extend of each over its cached prefix, a decode step: every
    new token's logits. Slots are taken after a hole, so they are not contiguous."""
    hole = runner.kv_pool.alloc(37)
    rows = [runner.req_to_token_pool.alloc() for _ in SEQS]
    first = [10, 4, 7]
    prefill = runner_extend(runner, rows, [0, 0, 0], [s[:n] for s, n in zip(SEQS, first)])
    runner.kv_pool.free(hole)
    ends = [len(s) - 1 for s in SEQS]
    extend = runner_extend(runner, rows, first, [s[n:e] for s, n, e in zip(SEQS, first, ends)])
    decode = runner_decode(runner, rows, SEQS, ends)
    return [prefill, extend, decode]


@pytest.mark.parametrize(("kind", "cpu_kernels", "shm"), CASES, ids=[
    f"{kind}-{'cpu-kernels' if kernels else 'torch-ops'}-{'shm' if shm else 'gloo'}" for kind, kernels, shm in CASES])
def test_tp2_logits_match_tp1(tiny_dirs: dict[str, Path], kind: str, cpu_kernels: bool, shm: bool) -> None:
    tiny_dir = tiny_dirs[kind]
    cfg = runner_cfg(tiny_dir, cpu_kernels=cpu_kernels)
    want = three_passes(ModelRunner.from_dir(tiny_dir, cfg))
    tp = ModelRunner.from_dir(tiny_dir, cfg, tp_size=2, shm_all_reduce_bytes=1 << 20 if shm else 0)
    try:
        got = three_passes(tp)
        assert tp.tp is not None
        # the decode step runs in DecodeStack (summing through the C++ side of the shared memory)
        # where our kernels and the shared memory both serve
        in_stack = cpu_kernels and shm
        assert (tp.model.decode_stack is not None) == in_stack
        num_layers = ModelConfig.from_dir(tiny_dir).num_layers
        # one all-reduce after attention, one after the MLP, in each of the three passes
        assert tp.tp.num_all_reduces == (2 if in_stack else 3) * 2 * num_layers
        split = kind != "odd-vocab"
        assert tp.model.lm_head.out_features == (128 if split else 255)  # each rank half the vocabulary
        shm_calls = 0 if tp.tp.shm is None else tp.tp.shm.seq  # both sides' calls, + a logit gather per pass
        assert shm_calls == ((3 * 2 * num_layers + 3 * split) if shm else 0)
        assert tp.kv_pool.k_buffer[0].shape[1] == 1  # half the KV heads
    finally:
        tp.close()
    for name, g, w in zip(("prefill", "extend", "decode"), got, want):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() <= ATOL, name


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_tp2_block_quantized_weights(tmp_path: Path, mode: str) -> None:
    """q8_0 at load, int8 activations and weight-only: each rank's o_proj and down_proj keep their
    blocks (the cut falls between them) and tp 2 gives tp 1's logits."""
    save_tiny_model(tmp_path, "llama")
    cfg = runner_cfg(tmp_path, quantization="q8_0", quant_mode=mode)
    want = three_passes(ModelRunner.from_dir(tmp_path, cfg))
    tp = ModelRunner.from_dir(tmp_path, cfg, tp_size=2)
    try:
        got = three_passes(tp)
        assert tp.quantized_layers == 4 * 2
    finally:
        tp.close()
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() <= 1e-4


def test_tp2_bfloat16_is_as_close_to_fp32_as_tp1(tmp_path: Path) -> None:
    save_tiny_model(tmp_path, "llama")
    exact = three_passes(ModelRunner.from_dir(tmp_path, runner_cfg(tmp_path)))
    bf16 = RunnerConfig(torch.bfloat16, "torch", 2000, 16, ModelConfig.from_dir(tmp_path).context_len)
    tp1 = three_passes(ModelRunner.from_dir(tmp_path, bf16))
    tp = ModelRunner.from_dir(tmp_path, bf16, tp_size=2)
    try:
        tp2 = three_passes(tp)
    finally:
        tp.close()
    for e, one, two in zip(exact, tp1, tp2):
        tp1_err = (one - e).abs().max().item()
        assert (two - e).abs().max().item() <= 2 * tp1_err + 0.02


def test_sharded_weights_split_by_kv_group_and_keep_quantized_blocks(tmp_path: Path) -> None:
    save_tiny_model(tmp_path, "qwen2")  # q/k/v biases
    cfg = ModelConfig.from_dir(tmp_path)
    from safetensors.torch import load_file

    full = load_file(tmp_path / "model.safetensors")
    d = cfg.head_dim
    for rank in range(2):
        shard = ShardedWeights(full, cfg, rank, 2)
        q = full["model.layers.0.self_attn.q_proj.weight"]
        assert torch.equal(shard["model.layers.0.self_attn.q_proj.weight"], q[rank * 2 * d: (rank + 1) * 2 * d])
        k_bias = full["model.layers.0.self_attn.k_proj.bias"]
        assert torch.equal(shard["model.layers.0.self_attn.k_proj.bias"], k_bias[rank * d: (rank + 1) * d])
        down = full["model.layers.0.mlp.down_proj.weight"]
        assert torch.equal(shard["model.layers.0.mlp.down_proj.weight"], down[:, rank * 64: (rank + 1) * 64])
        assert shard["model.embed_tokens.weight"] is full["model.embed_tokens.weight"]  # replicated
    tied_cfg = dataclasses.replace(cfg, tie_word_embeddings=True)
    untied = {name: w for name, w in full.items() if name != "lm_head.weight"}  # as a tied checkpoint has
    tied = ShardedWeights(untied, tied_cfg, 1, 2)  # a tied head: rank 1's is the embedding's second half
    assert "lm_head.weight" in tied and list(tied).count("lm_head.weight") == 1 and len(tied) == len(full)
    assert torch.equal(tied["lm_head.weight"], full["model.embed_tokens.weight"][128:])
    quantized = {"w": quantize(torch.randn(8, 128), "q4_1")}  # a cut between blocks keeps them
    aligned = column_slice(quantized["w"], 64, 128)
    assert isinstance(aligned, QuantizedTensor) and aligned.k == 64
    assert torch.equal(aligned.dequantize(), quantized["w"].dequantize()[:, 64:])
    cut = column_slice(quantized["w"], 48, 96)
    assert isinstance(cut, torch.Tensor) and torch.equal(cut, quantized["w"].dequantize()[:, 48:96])


def test_a_k_quant_is_cut_between_super_blocks_only() -> None:
    """A K-quant's blocks span 256 columns: a cut at a multiple of 256 keeps them, one at a
    multiple of 32 only dequantizes."""
    w = quantize(torch.randn(8, 768), "q4_k")
    aligned = column_slice(w, 256, 768)
    assert isinstance(aligned, QuantizedTensor) and aligned.k == 512
    assert torch.equal(aligned.dequantize(), w.dequantize()[:, 256:])
    cut = column_slice(w, 32, 256)
    assert isinstance(cut, torch.Tensor) and torch.equal(cut, w.dequantize()[:, 32:256])


def test_sizes_that_do_not_divide_are_refused(default_model_dir: Path) -> None:
    cfg = ModelConfig.from_dir(default_model_dir)  # 9 query heads, 3 KV heads
    assert valid_tp_sizes(cfg) == [1, 3]
    with pytest.raises(ValueError, match=r"--tp-size 2 does not divide this model's KV heads \(3\) and query heads "
                                         r"\(9\).*tp sizes that fit this model: 1, 3"):
        check_tp_size(cfg, 2)
    assert shard_config(cfg, 3).num_kv_heads == 1 and shard_config(cfg, 3).num_heads == 3
    with pytest.raises(ValueError, match="does not divide"):
        ModelRunner.from_dir(default_model_dir, runner_cfg(default_model_dir), tp_size=2)


def test_engine_tp2_same_greedy_outputs(tiny_model_dir: Path, tiny_engine: object) -> None:
    from radixlm.runtime.engine import Engine

    prompts = ["The capital of France is", "def fib(n):", "One, two, three, four,"]
    params = {"max_new_tokens": 24, "temperature": 0}
    want = [o["text"] for o in tiny_engine.generate(prompts, params)]  # type: ignore[attr-defined]
    engine = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, random_seed=0, tp_size=2)
    pids = engine.get_server_info()["tp_worker_pids"]
    try:
        assert [o["text"] for o in engine.generate(prompts, params)] == want
        assert engine.get_server_info()["tp_size"] == 2
    finally:
        engine.shutdown()
    assert len(pids) == 1
    wait_until(lambda: not process_alive(pids[0]), "rank 1 to exit after shutdown")


assert set(KINDS) <= set(TINY_CONFIGS) | set(FAMILY_CONFIGS)


def test_shm_all_reduce_sums_in_rank_order_and_gives_up_on_a_dead_rank(tmp_path: Path) -> None:
    """Two ranks in one process (rank 1 posts first, so rank 0 finds its flag set): the sum, then
    a call rank 1 never makes: rank 0's wait asks `check_peers`, whose error ends it."""
    path = tmp_path / "shm"
    ranks = [ShmAllReduce(path, 0, 2, 1 << 12, create=True), ShmAllReduce(path, 1, 2, 1 << 12, create=False)]
    a, b = torch.randn(3, 8), torch.randn(3, 8)
    ranks[1].slot(1, 1, b.numel() * 4).view(torch.float32).view(3, 8).copy_(b)  # rank 1's post of call 1
    ranks[1].flags[1] = 1
    got = a.clone()
    ranks[0].all_reduce(got)
    assert torch.equal(got, a + b)

    def dead() -> None:
        raise RuntimeError("tensor-parallel rank 1 exited with code -9")

    ranks[0].check_peers = dead
    with pytest.raises(RuntimeError, match="rank 1 exited"):
        ranks[0].all_reduce(torch.ones(3, 8))
    assert ranks[0].waits > 0  # it slept in the kernel, not only spun


def test_a_stopped_rank_fails_the_step_instead_of_hanging(tiny_model_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 stopped (SIGSTOP) never posts the receive of the next step: rank 0's send gives up
    after STEP_SEND_TIMEOUT (2 s here) with an error, and once rank 1 is gone the error names it."""
    from radixlm.runtime.model import tensor_parallel

    monkeypatch.setattr(tensor_parallel, "STEP_SEND_TIMEOUT", datetime.timedelta(seconds=2))
    runner = ModelRunner.from_dir(tiny_model_dir, runner_cfg(tiny_model_dir), 2)
    workers = runner.tp_workers
    assert workers is not None
    [rank1] = [p.pid for p in workers.procs]
    try:
        os.kill(rank1, signal.SIGSTOP)
        with pytest.raises(RuntimeError, match="[Tt]imed out") as gave_up:
            workers.group.broadcast_object(("noop",))
        assert "collective failed" in str(workers.failure(gave_up.value))  # rank 1 alive, stopped
        os.kill(rank1, signal.SIGKILL)
        assert "rank 1 exited with code -9" in str(workers.failure(gave_up.value))
    finally:
        with contextlib.suppress(ProcessLookupError):  # reaped already by failure()
            os.kill(rank1, signal.SIGKILL)
        runner.close()
    wait_until(lambda: not process_alive(rank1), "rank 1 gone")
