"""The fused MoE experts kernel (kernels/csrc/kernels/moe_experts.cpp) at every ISA level this CPU
runs (the `ext` fixture), for every weight format an expert can have (float32 panels, bf16 pair
panels, Q8_0 / Q4_0 / Q4_1 / Q4_K / Q5_K / Q6_K quant groups, weight-only and int8): against the
same experts run one linear layer at a time through the level's own kernels (packed_linear,
bf16_linear, q_linear, silu_mul), at 1, 5 and 33 tokens and on 1-3 threads; bad input is refused
with a message, never read out of bounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from radixlm.kernels import cpu_linear, quant

# (gate_up's weights, down's, quant mode, H, I): I a multiple of 64 (float32, bf16) or 32; K-quants need
# H (gate_up) or I (down) a multiple of 256. Q4_K with a Q6_K down is Q4_K_M's usual mix (and its int8
# mode what a GGUF decodes in on an int8-dot CPU).
CASES = [
    ("float32", "float32", "float32", 128, 64),
    ("bfloat16", "bfloat16", "float32", 96, 64),
    ("q8_0", "q8_0", "float32", 64, 96),
    ("q8_0", "q4_0", "int8", 64, 64),
    ("q4_0", "q4_0", "float32", 96, 64),
    ("q4_1", "q4_1", "int8_row", 64, 32),
    ("q4_k", "q4_k", "float32", 256, 256),
    ("q4_k", "q6_k", "float32", 256, 256),
    ("q4_k", "q4_k", "int8", 256, 256),
    ("q4_k", "q6_k", "int8", 256, 256),  # x quantized once for gate_up; the activations per slice for Q6_K down
    ("q5_k", "q5_k", "float32", 256, 256),
    ("q6_k", "q8_0", "float32", 256, 64),
]
NUM_EXPERTS, TOP_K = 6, 3


def _packed(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """An HF [out, in] float weight in the kernels' layout for `fmt`."""
    if fmt == "float32":
        return cpu_linear.pack(w.t().contiguous())
    if fmt == "bfloat16":
        return cpu_linear.pack_pairs(w.t().contiguous().bfloat16())
    return quant.pack(quant.quantize(w, fmt))


def _experts(fmts: tuple[str, str], hidden: int, inter: int, seed: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                                                                 torch.Tensor, torch.Tensor]:
    """Each expert's packed (gate_up, down), and one arena holding them all (at uneven offsets) with
    the offsets [E, 2]."""
    g = torch.Generator().manual_seed(seed)
    packed = [(_packed(torch.randn(2 * inter, hidden, generator=g) * 0.1, fmts[0]),
               _packed(torch.randn(hidden, inter, generator=g) * 0.1, fmts[1])) for _ in range(NUM_EXPERTS)]
    chunks, offsets, at = [], [], 0
    for pair in packed:
        row = []
        for p in pair:
            raw = p.contiguous().view(torch.uint8).reshape(-1)
            chunks += [torch.zeros(8, dtype=torch.uint8), raw]  # a gap: offsets, not sizes, place them
            at += 8
            row.append(at)
            at += raw.numel()
        offsets.append(row)
    return packed, torch.cat(chunks), torch.tensor(offsets, dtype=torch.int64)


def _linear(ext: Any, fmt: str, mode: int, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The level's own product of x [M, K] and a packed weight, padded columns included."""
    if fmt == "float32":
        return ext.packed_linear(x, packed, None, None)
    if fmt == "bfloat16":
        return ext.bf16_linear(x, packed, None, None, -1)
    return ext.q_linear(x, packed, mode, None, None)


def _reference(ext: Any, fmts: tuple[str, str], mode: int, packed: list, x: torch.Tensor, ids: torch.Tensor,
               weights: torch.Tensor, inter: int) -> torch.Tensor:
    """Each (token, choice) through the expert's own layers, summed in the choices' order."""
    hidden = x.shape[1]
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            gate_up, down = packed[int(ids[t, j])]
            act = ext.silu_mul(_linear(ext, fmts[0], mode, x[t:t + 1], gate_up)[:, :2 * inter].contiguous())
            y[t] += _linear(ext, fmts[1], mode, act, down)[0, :hidden] * weights[t, j]
    return y


def _routing(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=g)[:TOP_K] for _ in range(tokens)])
    return ids, torch.rand(tokens, TOP_K, generator=g)


def _kind(fmts: tuple[str, str]) -> tuple[int, int, int]:
    """(kind, gate_up's block bytes, down's) as moe_experts takes them."""
    if fmts[0] in ("float32", "bfloat16"):
        return ("float32", "bfloat16").index(fmts[0]), 0, 0
    return 2, quant.block_bytes(fmts[0]), quant.block_bytes(fmts[1])


@pytest.mark.parametrize(("gate_up", "down", "mode", "hidden", "inter"), CASES,
                         ids=["-".join(c[:3]) for c in CASES])
def test_fused_experts_match_the_layers(ext: Any, on_thread_counts: Callable, gate_up: str, down: str, mode: str,
                                        hidden: int, inter: int) -> None:
    fmts = (gate_up, down)
    packed, arena, offsets = _experts(fmts, hidden, inter, seed=1)
    kind, gate_up_bytes, down_bytes = _kind(fmts)
    code = quant.MODES[mode]
    for tokens in (1, 5, 33):
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens))
        ids, weights = _routing(tokens, seed=tokens)
        expected = _reference(ext, fmts, code, packed, x, ids, weights, inter)
        args = (x, ids, weights, arena, offsets, inter, kind, gate_up_bytes, down_bytes, code, -1)
        outs = on_thread_counts(lambda args=args: ext.moe_experts(*args))
        for out in outs:
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])  # the same bits on any thread count


def test_fused_experts_refuse_bad_input(ext: Any) -> None:
    packed, arena, offsets = _experts(("q8_0", "q8_0"), 64, 64, seed=2)
    kind, block_bytes, _ = _kind(("q8_0", "q8_0"))
    x = torch.randn(2, 64)
    ids, weights = _routing(2, seed=0)
    assert ext.moe_experts(x[:0], ids[:0], weights[:0], arena, offsets, 64, kind, block_bytes, block_bytes, 0, -1).shape == (0, 64)
    with pytest.raises(RuntimeError, match="out of range"):
        ext.moe_experts(x, ids + NUM_EXPERTS, weights, arena, offsets, 64, kind, block_bytes, block_bytes, 0, -1)
    with pytest.raises(RuntimeError, match="runs past the arena"):
        ext.moe_experts(x, ids, weights, arena[:-1], offsets, 64, kind, block_bytes, block_bytes, 0, -1)
    with pytest.raises(RuntimeError, match="multiple of"):
        ext.moe_experts(x, ids, weights, arena, offsets, 48, kind, block_bytes, block_bytes, 0, -1)
    with pytest.raises(RuntimeError, match="weights must be"):
        ext.moe_experts(x, ids, weights[:, :1], arena, offsets, 64, kind, block_bytes, block_bytes, 0, -1)


def _decode_logits(path: Any, quantization: str | None, in_stack: bool, seqs: list[list[int]],
                   steps: int) -> list[torch.Tensor]:
    """Each decode step's logits of a runner over the tiny model at `path` (the runtime's kernel
    level), its prompts' last `steps` tokens decoded one step at a time, through DecodeStack or,
    with it taken away, layer by layer."""
    from radixlm_testing import runner_decode, runner_extend
    from safetensors.torch import load_file

    from radixlm.runtime.model.model_config import ModelConfig
    from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig

    cfg = ModelConfig.from_dir(path)
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, len(seqs) + 1, cfg.context_len,
                                           quantization=quantization), load_file(path / "model.safetensors"))
    assert runner.model.decode_stack is not None, runner.model.decode_stack_misfit()
    if not in_stack:
        runner.model.decode_stack = None
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    start = [len(s) - steps for s in seqs]
    runner_extend(runner, rows, [0] * len(seqs), [s[:n] for s, n in zip(seqs, start)], all_logits=False)
    return [runner_decode(runner, rows, seqs, [n + i for n in start]) for i in range(steps)]


@pytest.mark.parametrize(("kind", "quantization"), [("qwen3_moe", None), ("mixtral", "q8_0")])
def test_decode_steps_of_a_moe_model_run_in_decode_stack(tmp_path: Any, kind: str, quantization: str | None) -> None:
    """A mixture-of-experts model's decode step is one DecodeStack call (the router, top-k and the
    fused experts inside its layer loop), for widths the fused kernel tiles: float32 logits within
    1e-4 of transformers' (Qwen3-MoE: top-k renormalised, a dense layer beside the sparse one), and
    a quantized model's (Mixtral, Q8_0 experts) within 1e-4 of its own layer-by-layer decode."""
    from radixlm_testing import save_tiny_model

    hf = save_tiny_model(tmp_path, kind, **({"moe_intermediate_size": 64} if kind == "qwen3_moe" else
                                            {"intermediate_size": 64}))
    seqs = [[(5 * i + 3 * j) % 250 + 1 for i in range(n)] for j, n in enumerate((9, 17, 12))]
    got = _decode_logits(tmp_path, quantization, True, seqs, steps=3)
    if quantization is None:
        with torch.no_grad():
            full = [hf(torch.tensor([s])).logits[0] for s in seqs]
        want = [torch.stack([f[len(s) - 3 + i] for f, s in zip(full, seqs)]) for i in range(3)]
    else:
        want = _decode_logits(tmp_path, quantization, False, seqs, steps=3)
    for step, (g, w) in enumerate(zip(got, want)):
        assert (g - w).abs().max().item() <= 1e-4, step
