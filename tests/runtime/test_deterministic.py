"""--enable-deterministic-inference on the default model as it ships (Q4_1 weights, int8
activations): four requests sharing a 90-token prefix (where the attention kernel's cascade would
otherwise serve their batch) decode to the same tokens and the same logprobs, to the bit, with
NGRAM speculation and without, and as when each runs alone after the shared prefix is cached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.attention.torch_backend import TorchAttentionBackend
from radixlm.runtime.scheduler.speculative import Drafter

RECORD = ("Record: Name: Alice Johnson. Email: alice.johnson@example.com. Date: 2024-03-15. Amount: $1,234.56. "
          "Company: Northwind Traders, 42 Harbour Road, Springfield. ") * 2
PROMPTS = [RECORD + f"Question {i}: repeat the record exactly.\nName:" for i in range(4)]
GREEDY = {"temperature": 0, "max_new_tokens": 24}


def _logprobs(outs: list[dict[str, Any]]) -> list[list[Any]]:
    return [o["meta_info"]["output_token_logprobs"] for o in outs]


def test_batched_outputs_do_not_depend_on_speculation_or_neighbours(default_model_dir: Path) -> None:
    with Engine(None, speculative_algorithm="NGRAM", enable_deterministic_inference=True) as engine:
        model = engine.runner.model
        assert engine.runner.quantized_layers and model.decode_stack is not None and not model.decode_stack.flash_attention
        sched = engine.scheduler
        backend = engine.runner.attn_backend
        assert isinstance(backend, TorchAttentionBackend) and backend.deterministic
        batched = {}
        for drafter in (sched.drafter, Drafter(None)):
            sched.drafter = drafter
            assert engine.flush_cache()
            batched[drafter.cfg is not None] = engine.generate(PROMPTS, [GREEDY] * 4, return_logprob=True)
        engine.generate(PROMPTS[0], GREEDY)  # the shared prefix cached, then one request at a time
        alone = [engine.generate(p, GREEDY, return_logprob=True) for p in PROMPTS[1:]]
    on, off = batched[True], batched[False]
    assert sum(o["meta_info"]["spec_num_correct_drafts"] for o in on) > 0  # drafts were accepted
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert _logprobs(on) == _logprobs(off)
    assert _logprobs(off)[1:] == _logprobs(alone)
