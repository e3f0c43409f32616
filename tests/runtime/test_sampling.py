"""SamplingParams validation and the batched sampler (statistical checks use fixed seeds)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from radixlm.runtime.sampling.sampler import (
    SamplingBatch,
    apply_penalties_,
    argmax_rows,
    count_tokens,
    has_penalties,
    mix_seed,
    sample,
    top_logprobs,
)
from radixlm.runtime.sampling.sampling_params import InvalidSamplingParams, SamplingParams

# ---------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    ("d", "field"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"presence_penalty": float("-inf")}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 2.1}, "repetition_penalty"),
        ({"n": 0}, "n"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"skip_special_tokens": "yes"}, "skip_special_tokens"),
        ({"spaces_between_special_tokens": 0}, "spaces_between_special_tokens"),
        ({"no_stop_trim": "false"}, "no_stop_trim"),
        ({"stop": ""}, "stop"),
        ({"stop": ["a", ""]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": ["2"]}, "stop_token_ids"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"regex": 5}, "regex"),
        ({"regex": "a", "json_schema": "{}"}, "json_schema"),
    ],
)
def test_invalid_params_name_the_field(d: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSamplingParams, match=rf"\b{field}\b"):
        SamplingParams.from_dict(d)


def test_error_message_format() -> None:
    with pytest.raises(
        InvalidSamplingParams, match=r"^sampling_params\.top_p must be in \(0, 1\], got 1\.5$"
    ):
        SamplingParams.from_dict({"top_p": 1.5})
    with pytest.raises(InvalidSamplingParams, match="max_new_tokens must be >= 0"):
        SamplingParams(max_new_tokens=-3)
    assert issubclass(InvalidSamplingParams, ValueError)


def test_unknown_field_rejected() -> None:
    with pytest.raises(InvalidSamplingParams, match="unknown sampling parameter 'foo'"):
        SamplingParams.from_dict({"temperature": 0.5, "foo": 1})
    with pytest.raises(InvalidSamplingParams, match="must be an object"):
        SamplingParams.from_dict([("temperature", 1.0)])  # type: ignore[arg-type]


def test_defaults_and_nulls() -> None:
    assert SamplingParams.from_dict(None) == SamplingParams() == SamplingParams.from_dict({})
    p = SamplingParams.from_dict({"temperature": None, "top_k": None, "stop": None, "seed": None})
    assert p == SamplingParams()
    assert SamplingParams.from_dict({"max_new_tokens": None}).max_new_tokens is None
    assert SamplingParams().max_new_tokens == 128 and SamplingParams().top_k == -1


def test_normalization() -> None:
    p = SamplingParams.from_dict({"stop": "\n", "stop_token_ids": [7, 3, 7], "temperature": 0, "regex": ""})
    assert p.stop == ("\n",) and p.stop_token_ids == (7, 3)
    assert isinstance(p.temperature, float) and p.regex is None
    assert SamplingParams.from_dict({"stop": ["a", "b"]}).stop == ("a", "b")
    assert SamplingParams.from_dict({"sampling_seed": 9}).seed == 9  # SGLang's spelling
    with pytest.raises(InvalidSamplingParams, match="seed"):
        SamplingParams.from_dict({"sampling_seed": 9, "seed": 9})


def test_is_greedy() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(top_k=1, temperature=1.3).is_greedy
    assert not SamplingParams(temperature=0.01).is_greedy


@pytest.mark.parametrize(
    "d",
    [
        {},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "stop": ["</s>", "\n\n"]},
        {"frequency_penalty": -1.0, "presence_penalty": 2.0, "repetition_penalty": 1.3, "n": 3},
        {
            "max_new_tokens": None,
            "min_new_tokens": 2,
            "stop_token_ids": [2, 5],
            "seed": -4,
            "ignore_eos": True,
        },
        {"json_schema": '{"type": "object"}', "no_stop_trim": True, "skip_special_tokens": False},
    ],
)
def test_round_trip(d: dict[str, Any]) -> None:
    p = SamplingParams.from_dict(d)
    assert SamplingParams.from_dict(p.to_dict()) == p
    for key, value in d.items():
        assert p.to_dict()[key] == value


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 0.5  # type: ignore[misc]


# ---------------------------------------------------------------- sampler helpers

V = 8


def build(
    params: list[SamplingParams], output_ids: list[list[int]] | None = None, **kw: Any
) -> SamplingBatch:
    """The batch of requests that generated `output_ids` so far (their penalty counts recounted)."""
    output_ids = output_ids if output_ids is not None else [[] for _ in params]
    vocab_size = kw.pop("vocab_size", V)
    counts = [count_tokens(ids, vocab_size) if has_penalties(p) else None for p, ids in zip(params, output_ids)]
    return SamplingBatch.build(
        params, [len(ids) for ids in output_ids], vocab_size, "cpu", output_token_counts=counts, **kw
    )


def draw_many(logits_row: torch.Tensor, p: SamplingParams, num: int = 4000, **kw: Any) -> torch.Tensor:
    """`num` independent draws of one request: one batch of `num` identical rows."""
    logits = logits_row.expand(num, -1).contiguous()
    batch = build([p] * num, vocab_size=logits.shape[1])
    return sample(logits, batch, generator=torch.Generator().manual_seed(1234), **kw).next_ids


PEAKED = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


# ---------------------------------------------------------------- sampler


def test_greedy_equals_argmax_without_randomness() -> None:
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    batch = build([SamplingParams(temperature=0.0)] * 5)
    generator = torch.Generator().manual_seed(7)
    state = generator.get_state()
    out = sample(logits, batch, generator=generator)
    assert torch.equal(out.next_ids, logits.argmax(-1)) and out.logprobs is None
    assert torch.equal(generator.get_state(), state)


def test_argmax_rows_is_torchs_argmax() -> None:
    """The numpy path (float32 on CPU) and the torch one pick as `argmax(dim=-1)`: the first
    index of the maximum, the first NaN of a row with NaNs, index 0 of an all -inf row."""
    x = torch.randn(33, 49_152, generator=torch.Generator().manual_seed(3))
    x[1, 17] = x[1, 4_000] = x[1].max() + 1  # a tie: the first
    x[2, 300] = x[2, 200] = float("nan")
    x[3] = float("-inf")
    x[4, 5] = float("inf")
    for t in (x, x[:, :1_000], x[::2, 7:], x.to(torch.bfloat16), x[:1]):
        got = argmax_rows(t)
        assert got.dtype == torch.int64 and torch.equal(got, t.argmax(dim=-1))
    with torch.inference_mode():  # as the scheduler calls it
        assert torch.equal(argmax_rows(x.clone()), x.argmax(dim=-1))


def test_temperature_matches_softmax_statistically() -> None:
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0])
    temperature, num = 0.7, 20000
    ids = draw_many(logits, SamplingParams(temperature=temperature), num)
    observed = torch.bincount(ids, minlength=6).double()
    expected = torch.softmax(logits.double() / temperature, -1) * num
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    assert chi_square < 20.5  # df=5, p=0.001


def test_top_k_one_equals_greedy() -> None:
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(1))
    out = sample(logits, build([SamplingParams(temperature=1.5, top_k=1)] * 6))
    assert torch.equal(out.next_ids, logits.argmax(-1))


def test_top_k_restricts_support() -> None:
    logits = torch.tensor([0.1, 2.0, 0.3, 1.9, 1.8, 0.0, -1.0, 0.2])
    ids = draw_many(logits, SamplingParams(temperature=2.0, top_k=3))
    assert set(ids.tolist()) == {1, 3, 4}


def test_top_k_mixed_with_rows_without_top_k() -> None:
    logits = (-0.1 * torch.arange(V, dtype=torch.float32)).expand(400, -1)  # top 2 = {0, 1}
    params = [SamplingParams(top_k=2) if i % 2 else SamplingParams() for i in range(400)]
    ids = sample(logits, build(params), generator=torch.Generator().manual_seed(3)).next_ids
    assert set(ids[1::2].tolist()) <= {0, 1} and len(set(ids[0::2].tolist())) == V


@pytest.mark.parametrize(
    ("top_p", "nucleus"), [(0.7, {0, 1}), (0.85, {0, 1, 2}), (1e-6, {0}), (1.0, {0, 1, 2, 3})]
)
def test_top_p_restricts_to_nucleus(top_p: float, nucleus: set[int]) -> None:
    ids = draw_many(PEAKED, SamplingParams(top_p=top_p))
    assert set(ids.tolist()) == nucleus


@pytest.mark.parametrize(("min_p", "kept"), [(0.35, {0, 1}), (0.2, {0, 1, 2}), (1.0, {0})])
def test_min_p(min_p: float, kept: set[int]) -> None:
    ids = draw_many(PEAKED, SamplingParams(min_p=min_p))
    assert set(ids.tolist()) == kept


def test_penalty_function_exact() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0], [1.0, 1.0, -1.0, 4.0]])
    counts = torch.tensor([[2.0, 1.0, 0.0, 0.0], [0.0, 3.0, 1.0, 0.0]])
    freq = torch.tensor([[0.5], [0.0]])
    pres = torch.tensor([[0.25], [1.0]])
    rep = torch.tensor([[2.0], [1.0]])
    out = apply_penalties_(logits.clone(), counts, freq, pres, rep)
    # row 0: token0 2-1-0.25=0.75 -> /2; token1 -1-0.5-0.25=-1.75 -> *2; unseen tokens untouched
    # row 1: presence only: tokens 1 and 2 lose 1.0
    expected = torch.tensor([[0.375, -3.5, 0.5, -3.0], [1.0, 0.0, -2.0, 4.0]])
    assert torch.allclose(out, expected)


def test_penalties_through_sample_use_output_tokens() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    greedy = {"temperature": 0.0}
    assert sample(logits, build([SamplingParams(**greedy)], [[0]])).next_ids.item() == 0
    for extra in ({"repetition_penalty": 1.1}, {"frequency_penalty": 0.2}, {"presence_penalty": 0.2}):
        batch = build([SamplingParams(**greedy, **extra)], [[0]])
        assert sample(logits, batch).next_ids.item() == 1, extra
    assert torch.equal(logits[0, :2], torch.tensor([3.0, 2.9]))  # input not modified


def test_counts_are_gathered_with_extra_ids_on_top() -> None:
    """A request's counts are read, never written; draft rows count earlier draft tokens on top."""
    p = SamplingParams(temperature=0.0, frequency_penalty=0.5)
    own = count_tokens([1, 1, 3], V)
    assert own.tolist() == [0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    free = SamplingParams(temperature=0.0)
    batch = SamplingBatch.build(
        [p, p, p, free], [3, 4, 5, 0], V, output_token_counts=[own, own, own, None],
        extra_counted_ids=[[], [3], [3, 5], []],
    )
    assert batch.output_token_counts is not None
    want = [count_tokens(ids, V) for ids in ([1, 1, 3], [1, 1, 3, 3], [1, 1, 3, 3, 5], [])]
    assert torch.equal(batch.output_token_counts, torch.stack(want))
    assert torch.equal(own, count_tokens([1, 1, 3], V))
    with pytest.raises(ValueError, match="penalties"):
        SamplingBatch.build([p, free], [0, 0], V, output_token_counts=[None, None])
    with pytest.raises(ValueError, match="penalties"):
        SamplingBatch.build([p], [0], V)
    assert SamplingBatch.build([free], [9], V).output_token_counts is None  # no penalty: no counts


def test_rows_without_penalties_ignore_counts() -> None:
    """Gathering zeros for a penalty-free row (as the scheduler does) changes nothing."""
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5), SamplingParams(seed=4)]
    outputs = [[2, 2, 5], [0, 1, 7, 7]]
    zeros = build(params, outputs)
    recounted = SamplingBatch.build(
        params, [3, 4], V, output_token_counts=[count_tokens(ids, V) for ids in outputs]
    )
    a = sample(logits, zeros, return_logprob=True)
    b = sample(logits, recounted, return_logprob=True)
    assert torch.equal(a.next_ids, b.next_ids) and torch.equal(a.vocab_logprobs, b.vocab_logprobs)


def test_min_new_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    p = SamplingParams(temperature=0.0, min_new_tokens=2, stop_token_ids=[1])
    eos = [{0}]
    assert sample(logits, build([p], [[]], eos_token_ids=eos)).next_ids.item() == 2
    assert sample(logits, build([p], [[4]], eos_token_ids=eos)).next_ids.item() == 2
    assert sample(logits, build([p], [[4, 4]], eos_token_ids=eos)).next_ids.item() == 0
    sampled = SamplingParams(min_new_tokens=1)
    ids = draw_many(logits[0], sampled, 2000).tolist()  # no eos ids given: nothing masked
    assert 0 in ids
    batch = build([sampled] * 2000, eos_token_ids=[{0}] * 2000)
    ids = sample(logits.expand(2000, -1), batch, generator=torch.Generator().manual_seed(5)).next_ids
    assert 0 not in ids.tolist()


def seeded_sequence(position: int, others: list[SamplingParams], steps: int = 30) -> list[int]:
    """Tokens a seeded request samples over `steps` steps, sitting at `position` among `others`."""
    target = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    params = others[:position] + [target] + others[position:]
    logits_gen = torch.Generator().manual_seed(99)
    tokens: list[int] = []
    for _ in range(steps):
        logits = torch.randn(len(params), V, generator=logits_gen)
        logits[position] = torch.linspace(-1.0, 1.0, V)
        output_ids = [list(tokens) if i == position else [1] * i for i in range(len(params))]
        batch = build(params, output_ids)
        tokens.append(
            int(
                sample(logits, batch, generator=torch.Generator().manual_seed(len(tokens))).next_ids[position]
            )
        )
    return tokens


def test_seed_reproducible_and_independent_of_batch() -> None:
    alone = seeded_sequence(0, [])
    assert alone == seeded_sequence(0, [])
    assert len(set(alone)) > 2  # the noise changes from step to step
    others = [SamplingParams(temperature=0.0), SamplingParams(top_k=3), SamplingParams(seed=1, min_p=0.1)]
    assert seeded_sequence(2, others) == alone
    assert seeded_sequence(3, others + [SamplingParams(top_k=2, repetition_penalty=1.5)]) == alone
    assert mix_seed(42, 0) != mix_seed(42, 1) != mix_seed(43, 1)


def test_different_seeds_differ() -> None:
    logits = torch.zeros(1, 1000)
    picks = {
        int(sample(logits, build([SamplingParams(seed=s)], vocab_size=1000)).next_ids.item())
        for s in range(10)
    }
    assert len(picks) > 5


def test_mixed_batch() -> None:
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(11))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9, top_k=2),
        SamplingParams(temperature=1.2, seed=5),
        SamplingParams(top_k=1, temperature=0.5),
    ]
    out = sample(logits, build(params), generator=torch.Generator().manual_seed(0), return_logprob=True)
    assert out.next_ids[0] == logits[0].argmax() and out.next_ids[3] == logits[3].argmax()
    assert out.next_ids[1].item() in set(logits[1].topk(2).indices.tolist())
    solo = sample(logits[2:3], build([params[2]]))
    assert out.next_ids[2] == solo.next_ids[0]
    assert (
        out.next_ids.dtype == torch.int64 and out.logprobs is not None and out.logprobs.dtype == torch.float32
    )


def test_logprob_convention() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, top_k=2),
        SamplingParams(top_p=0.5),
    ]
    out = sample(logits, build(params), return_logprob=True)
    assert out.logprobs is not None and out.vocab_logprobs is not None
    temperatures = torch.tensor([[1.0], [0.5], [1.0]])  # greedy rows report temperature 1
    expected_vocab = torch.log_softmax(logits / temperatures, -1)  # before top-k / top-p
    assert torch.allclose(out.vocab_logprobs, expected_vocab, atol=1e-5)
    assert torch.allclose(out.logprobs, expected_vocab.gather(1, out.next_ids[:, None]).squeeze(1), atol=1e-5)
    greedy = sample(logits, build([SamplingParams(temperature=0.0)] * 3), return_logprob=True)
    assert torch.allclose(greedy.logprobs, torch.log_softmax(logits, -1).amax(-1), atol=1e-6)  # type: ignore[arg-type]


def test_vocab_mask_respected_at_temperature_one() -> None:
    num = 3000
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[[2, 5, 6]] = True
    logits = torch.zeros(num, V)
    logits[:, 0] = 10.0  # the favourite is masked out
    mask = allowed.expand(num, -1)
    out = sample(
        logits, build([SamplingParams()] * num), vocab_mask=mask, generator=torch.Generator().manual_seed(4)
    )
    assert set(out.next_ids.tolist()) == {2, 5, 6}
    greedy = sample(
        logits[:1], build([SamplingParams(temperature=0.0)]), vocab_mask=mask[:1], return_logprob=True
    )
    assert greedy.next_ids.item() == 2 and greedy.logprobs is not None
    assert math.isclose(greedy.logprobs.item(), math.log(1 / 3), rel_tol=1e-5)


def test_bfloat16_logits_and_shape_checks() -> None:
    logits = torch.randn(2, V).to(torch.bfloat16)
    assert sample(logits, build([SamplingParams()] * 2)).next_ids.shape == (2,)
    with pytest.raises(ValueError, match="logits"):
        sample(torch.zeros(3, V), build([SamplingParams()] * 2))
    with pytest.raises(ValueError, match="vocab_mask"):
        sample(torch.zeros(2, V), build([SamplingParams()] * 2), vocab_mask=torch.ones(2, V))


def test_top_logprobs() -> None:
    row = torch.log_softmax(torch.tensor([0.0, 3.0, 1.0, 2.0]), -1)
    values, ids = top_logprobs(row, 2)
    assert ids.tolist() == [1, 3] and torch.equal(values, row[[1, 3]])
    values, ids = top_logprobs(torch.stack([row, row.flip(0)]), 10)
    assert values.shape == (2, 4) and ids[1].tolist() == [2, 0, 1, 3]
    assert top_logprobs(row, 0)[1].numel() == 0
