"""The shapes of the forwards the scheduler builds for W2 (32 prompts arriving together, sharing a
system prompt and one of a few task sentences): as few prefill forwards as the chunk budget
allows once shared prefixes are computed once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radixlm.runtime.bench.workloads import w2_prompts
from radixlm.runtime.engine import Engine
from radixlm.runtime.scheduler.admission import IN_BATCH_SHARED_PREFIX_THRESHOLD

CHUNK = 2048


def test_w2_prefills_in_three_forwards_computing_each_shared_prefix_once(tiny_model_dir: Path) -> None:
    engine = Engine(str(tiny_model_dir), max_total_tokens=16384, chunked_prefill_size=CHUNK, random_seed=0)
    forwards: list[tuple[str, int, int]] = []
    run = engine.runner.forward

    def recording(batch: Any) -> Any:
        forwards.append((batch.mode.value, batch.batch_size, sum(batch.extend_lens_list)))
        return run(batch)

    engine.runner.forward = recording  # type: ignore[method-assign]
    try:
        prompts = w2_prompts()
        engine.generate(prompt=prompts, sampling_params={"max_new_tokens": 2, "temperature": 0, "ignore_eos": True})
        prompt_tokens = sum(len(engine.tokenizer.encode(p)) for p in prompts)
        extends = [(size, tokens) for mode, size, tokens in forwards if mode == "extend"]
        computed = sum(tokens for _, tokens in extends)
        # The first forward holds back prompts that share >= IN_BATCH_SHARED_PREFIX_THRESHOLD new
        # tokens with one admitted in it; later forwards read those prefixes from the cache and
        # fill the budget (decodes of the first ones ride along: a row each).
        assert len(extends) <= 3, extends
        assert all(tokens <= CHUNK + size for size, tokens in extends), extends
        assert prompt_tokens - computed > IN_BATCH_SHARED_PREFIX_THRESHOLD * 16, (prompt_tokens, computed)
        # the scheduler's own step records (the server logs them at debug level) tell the same story
        records = list(engine.scheduler.recent_steps)
        assert engine.scheduler.num_forwards == len(records) == len(forwards)
        assert [(r.num_extends + r.num_decodes, r.num_extend_tokens + r.num_decodes)
                for r in records if r.num_extends] == extends
        assert all(r.secs > 0 and r.start > 0 for r in records)
    finally:
        engine.shutdown()


def test_identical_prompts_prefill_in_two_forwards(tiny_model_dir: Path) -> None:
    """24 copies of one prompt (`n` samples, or a client's retries): the first forward computes the
    prompt once, the second admits every other copy together (each computes only its last token,
    the rest read from the cache), rather than one copy per step."""
    with Engine(str(tiny_model_dir), max_total_tokens=8192, random_seed=0) as engine:
        prompt = "The same question, asked by many clients at once: " * 4
        before = engine.scheduler.num_forwards
        outs = engine.generate(prompt=[prompt] * 24, sampling_params={"max_new_tokens": 3, "temperature": 0,
                                                                    "ignore_eos": True})
        records = list(engine.scheduler.recent_steps)[-(engine.scheduler.num_forwards - before):]
    assert len({o["text"] for o in outs}) == 1
    extends = [(r.num_extends, r.num_extend_tokens) for r in records if r.num_extends]
    prompt_len = outs[0]["meta_info"]["prompt_tokens"]
    assert extends == [(1, prompt_len), (23, 23)], extends
