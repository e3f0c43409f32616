"""The in-process Engine over the scheduler, radix cache and sampler, on a tiny random model.

After every test the KV pool must be back to full once the cache is flushed, and every slot
owned exactly once meanwhile (the `clean_pool` fixture): a leaked slot fails the test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from radixlm_testing import assert_engine_clean

from radixlm.runtime.engine import Engine

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Once upon a time",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
]
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}


assert_clean = assert_engine_clean


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    return tiny_engine


@pytest.fixture(autouse=True)
def clean_pool(request: pytest.FixtureRequest) -> Any:
    yield
    for name in ("engine", "small_engine"):
        if name in request.fixturenames:
            assert_clean(request.getfixturevalue(name))


def texts(results: Any) -> list[list[int]]:
    return [r["output_ids"] for r in results]


def test_single_and_batch_shapes(engine: Engine) -> None:
    one = engine.generate(prompt="Hello", sampling_params={"max_new_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert isinstance(one, dict) and isinstance(one["text"], str) and len(one["output_ids"]) == 5
    meta = one["meta_info"]
    assert meta["completion_tokens"] == 5 and meta["prompt_tokens"] > 0
    assert meta["finish_reason"] == {"type": "length", "matched": 5}
    many = engine.generate(prompt=PROMPTS, sampling_params=GREEDY)
    assert isinstance(many, list) and len(many) == len(PROMPTS)
    by_ids = engine.generate(input_ids=[[1, 2, 3], [4, 5]], sampling_params=GREEDY)
    assert [r["meta_info"]["prompt_tokens"] for r in by_ids] == [3, 2]


def test_batched_equals_sequential(engine: Engine) -> None:
    sequential = [engine.generate(prompt=p, sampling_params=GREEDY)["output_ids"] for p in PROMPTS]
    engine.flush_cache()
    assert texts(engine.generate(prompt=PROMPTS, sampling_params=GREEDY)) == sequential


def test_second_identical_request_hits_cache(engine: Engine) -> None:
    first = engine.generate(prompt=PROMPTS[2], sampling_params=GREEDY)
    second = engine.generate(prompt=PROMPTS[2], sampling_params=GREEDY)
    n = first["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] >= n - 1
    assert second["output_ids"] == first["output_ids"]
    assert engine.get_server_info()["radix_cache"]["tree_tokens"] > 0


def test_shared_new_prefix_computed_once(engine: Engine) -> None:
    shared = "A long shared preamble about the history of tea, spices and trade routes. " * 4
    prompts = [shared + q for q in ("What about ships?", "What about camels?", "What about taxes?")]
    results = engine.generate(prompt=prompts, sampling_params=GREEDY)
    cached = sorted(r["meta_info"]["cached_tokens"] for r in results)
    assert cached[0] == 0 and cached[1] >= 40 and cached[2] >= 40


def test_n_copies_share_the_prompt(engine: Engine) -> None:
    results = engine.generate(prompt=PROMPTS[0], sampling_params={**GREEDY, "n": 3})
    assert len(results) == 3
    n = results[0]["meta_info"]["prompt_tokens"]
    assert sorted(r["meta_info"]["cached_tokens"] for r in results)[1:] == [n - 1, n - 1]
    assert results[0]["output_ids"] == results[1]["output_ids"] == results[2]["output_ids"]


def test_stop_conditions(engine: Engine) -> None:
    base = engine.generate(prompt=PROMPTS[1], sampling_params=GREEDY)
    ids = base["output_ids"]
    stop_tok = engine.generate(prompt=PROMPTS[1], sampling_params={**GREEDY, "stop_token_ids": [ids[3]]})
    assert stop_tok["output_ids"] == ids[: ids.index(ids[3]) + 1]
    assert stop_tok["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[3]}
    text = base["text"]
    stop_str = next(text[i : i + 3] for i in range(len(text) // 2, len(text) - 3) if text[i : i + 3].strip())
    got = engine.generate(prompt=PROMPTS[1], sampling_params={**GREEDY, "stop": [stop_str]})
    assert got["text"] == text[: text.index(stop_str)]
    assert got["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_str}
    eos = engine.model_config.eos_token_ids[0]
    forced = engine.generate(input_ids=[1, 2, 3], sampling_params={"temperature": 0, "max_new_tokens": 3, "min_new_tokens": 3, "stop_token_ids": [eos]})
    assert len(forced["output_ids"]) == 3


def test_seed_reproducible(engine: Engine) -> None:
    params = {"temperature": 1.0, "max_new_tokens": 16, "seed": 42, "ignore_eos": True}
    a = engine.generate(prompt=PROMPTS[1], sampling_params=params)
    b = engine.generate(prompt=[PROMPTS[0], PROMPTS[1]], sampling_params=[{**params, "seed": 7}, params])[1]
    assert a["output_ids"] == b["output_ids"]


def test_logprobs_shapes(engine: Engine) -> None:
    out = engine.generate(prompt=PROMPTS[1], sampling_params=GREEDY, return_logprob=True, top_logprobs_num=3)
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == 24
    for (lp, tok, text), top, got in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], out["output_ids"]):
        assert text is None  # return_text_in_logprobs not asked for
        assert tok == got and lp <= 0.0
        assert len(top) == 3 and top[0][1] == tok and abs(top[0][0] - lp) < 1e-5  # greedy: top-1


def test_invalid_input_is_rejected(engine: Engine) -> None:
    with pytest.raises(ValueError, match="empty"):
        engine.generate(input_ids=[])  # "" is taken: it starts from BOS (else EOS)
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[1] * 600)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(prompt="hi", sampling_params={"max_new_tokens": -1})
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompt="hi", sampling_params={"top_p": 1.5})
    with pytest.raises(ValueError, match="bogus"):
        engine.generate(prompt="hi", sampling_params={"bogus": 1})
    with pytest.raises(ValueError, match="not token ids"):
        engine.generate(input_ids=[1, 10**7])


def test_stream_and_abort_by_closing(engine: Engine) -> None:
    full = engine.generate(prompt=PROMPTS[3], sampling_params=GREEDY)
    chunks = list(engine.generate(prompt=PROMPTS[3], sampling_params=GREEDY, stream=True))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))
    stream = engine.generate(prompt=PROMPTS[3], sampling_params={**GREEDY, "max_new_tokens": 200}, stream=True)
    next(stream)
    next(stream)
    stream.close()  # the consumer goes away: the request is aborted and its KV freed
    engine.generate(prompt="x", sampling_params={"max_new_tokens": 1})
    assert engine.get_server_info()["num_running_reqs"] == 0


def test_stream_logprobs_and_batches(engine: Engine) -> None:
    """Engine streams have the server's shape: each chunk's logprob entries are new, a batch
    stream tags chunks with their index."""
    args = {"sampling_params": GREEDY, "return_logprob": True, "top_logprobs_num": 2}
    full = engine.generate(prompt=PROMPTS[2], **args)
    entries: list[Any] = []
    for chunk in engine.generate(prompt=PROMPTS[2], stream=True, **args):
        entries += chunk["meta_info"]["output_token_logprobs"]
        assert chunk["meta_info"]["output_token_logprobs_length"] == len(entries) == chunk["meta_info"]["completion_tokens"]
    assert [e[1] for e in entries] == [e[1] for e in full["meta_info"]["output_token_logprobs"]]
    texts_by_index: dict[int, str] = {}
    for chunk in engine.generate(prompt=PROMPTS[:2], sampling_params=GREEDY, stream=True):
        texts_by_index[chunk["index"]] = chunk["text"]
    assert [texts_by_index[0], texts_by_index[1]] == [r["text"] for r in engine.generate(prompt=PROMPTS[:2], sampling_params=GREEDY)]


def test_incremental_streaming_output(tiny_model_dir: Any) -> None:
    """--incremental-streaming-output: each chunk's text and output_ids are only its new ones."""
    eng = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=1024, incremental_streaming_output=True)
    try:
        full = eng.generate(prompt=PROMPTS[0], sampling_params=GREEDY)
        chunks = list(eng.generate(prompt=PROMPTS[0], sampling_params=GREEDY, stream=True))
        assert "".join(c["text"] for c in chunks) == full["text"]
        assert [i for c in chunks for i in c["output_ids"]] == full["output_ids"]
        assert len(chunks) > 1
    finally:
        eng.shutdown()


def test_async_generate_concurrent(engine: Engine) -> None:
    async def main() -> list[Any]:
        return await asyncio.gather(*(engine.async_generate(prompt=p, sampling_params=GREEDY) for p in PROMPTS))

    results = asyncio.run(main())
    sequential = [engine.generate(prompt=p, sampling_params=GREEDY)["output_ids"] for p in PROMPTS]
    assert [r["output_ids"] for r in results] == sequential


def test_server_info(engine: Engine) -> None:
    info = engine.get_server_info()
    assert info["max_total_num_tokens"] == 4096  # every key: tests/test_public_names.py
    assert info["radix_cache"]["tree_tokens"] == info["radix_cache"]["evictable_tokens"]  # nothing runs
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0


@pytest.mark.parametrize(
    "options",
    [
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 16},
        {"schedule_policy": "fcfs"},
        {"schedule_policy": "lof"},
        {"schedule_policy": "dfs-weight"},
        {"schedule_policy": "random"},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_options_keep_greedy_output(engine: Engine, tiny_model_dir: Path, options: dict[str, Any]) -> None:
    want = texts(engine.generate(prompt=PROMPTS, sampling_params=GREEDY))
    other = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, **options)
    try:
        assert texts(other.generate(prompt=PROMPTS, sampling_params=GREEDY)) == want
        assert_clean(other)
    finally:
        other.shutdown()


def test_retraction_under_a_tiny_pool(engine: Engine, tiny_model_dir: Path) -> None:
    params = {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True}
    want = texts(engine.generate(prompt=PROMPTS, sampling_params=params))
    small = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=160, chunked_prefill_size=32)
    try:
        assert texts(small.generate(prompt=PROMPTS, sampling_params=params)) == want
        assert small.scheduler.num_retractions > 0
        assert_clean(small)
    finally:
        small.shutdown()


@pytest.mark.parametrize("chunk", [2048, 16])
def test_input_logprobs_agree_with_output_logprobs(tiny_model_dir: Path, chunk: int) -> None:
    """Teacher-forcing the generated tokens gives, as input logprobs, the output logprobs."""
    eng = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, chunked_prefill_size=chunk)
    try:
        first = eng.generate(prompt=PROMPTS[0], sampling_params=GREEDY, return_logprob=True, top_logprobs_num=2)
        prompt_ids = eng.tokenizer.encode(PROMPTS[0])
        full = prompt_ids + first["output_ids"]
        again = eng.generate(
            input_ids=full, sampling_params={"max_new_tokens": 1}, return_logprob=True,
            logprob_start_len=len(prompt_ids), top_logprobs_num=2,
        )
        got = again["meta_info"]["input_token_logprobs"]
        want = first["meta_info"]["output_token_logprobs"]  # position len(prompt) + i <-> output i
        assert [t for _, t, _ in got] == [t for _, t, _ in want] == first["output_ids"]
        assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(got, want))
        assert len(again["meta_info"]["input_top_logprobs"]) == len(got)
        whole = eng.generate(input_ids=full, sampling_params={"max_new_tokens": 1}, return_logprob=True, logprob_start_len=0)
        assert whole["meta_info"]["input_token_logprobs"][0] == [None, full[0], None]
        assert len(whole["meta_info"]["input_token_logprobs"]) == len(full)
        assert_clean(eng)
    finally:
        eng.shutdown()


def test_max_new_tokens_zero_only_prefills(engine: Engine) -> None:
    out = engine.generate(prompt=PROMPTS[2], sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    assert out["output_ids"] == [] and out["text"] == ""
    assert out["meta_info"]["finish_reason"] == {"type": "length", "matched": 0}
    assert len(out["meta_info"]["input_token_logprobs"]) == out["meta_info"]["prompt_tokens"]
    again = engine.generate(prompt=PROMPTS[2], sampling_params={"max_new_tokens": 4})
    assert again["meta_info"]["cached_tokens"] >= out["meta_info"]["prompt_tokens"] - 1
