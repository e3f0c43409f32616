"""One front door: the in-process Engine and the HTTP server take /generate's fields through the
same code (parse_generate, RequestValidator), so a bad input gets the same error text from
both, and `n` copies get the same seeds (the same samples) from both."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import ServerHandle

from radixlm.runtime.api.errors import RequestError
from radixlm.runtime.config.limits import MAX_BATCH, MAX_TOP_LOGPROBS_NUM

# /generate bodies that are refused; the tiny server and the tiny engine share the model and the
# 4,096-token pool, so the limits in the messages agree.
BAD_BODIES: dict[str, dict[str, Any]] = {
    "empty prompt": {"input_ids": []},  # "" is taken: it starts from BOS (else EOS)
    "text and input_ids": {"text": "a", "input_ids": [1]},
    "neither text nor input_ids": {"sampling_params": {}},
    "text of the wrong type": {"text": 5},
    "prompt over the context": {"input_ids": [1] * 600},
    "not a token id": {"input_ids": [1, 99_999_999]},
    "negative max_new_tokens": {"text": "hi", "sampling_params": {"max_new_tokens": -1}},
    "max_new_tokens over the context": {"text": "hi", "sampling_params": {"max_new_tokens": 600}},
    "top_p out of range": {"text": "hi", "sampling_params": {"top_p": 2.0}},
    "unknown sampling parameter": {"text": "hi", "sampling_params": {"bogus": 1}},
    "n of 0": {"text": "hi", "sampling_params": {"n": 0}},
    "seed of the wrong type": {"text": "hi", "sampling_params": {"seed": "x"}},
    "bad regex": {"text": "hi", "sampling_params": {"regex": "(unclosed"}},
    "bad json schema": {"text": "hi", "sampling_params": {"json_schema": "{not json"}},
    "bad ebnf": {"text": "hi", "sampling_params": {"ebnf": "root ::= \"a"}},
    "stop token id out of the vocabulary": {"text": "hi", "sampling_params": {"stop_token_ids": [10**7]}},
    "too many top logprobs": {"text": "hi", "return_logprob": True, "top_logprobs_num": MAX_TOP_LOGPROBS_NUM + 1},
    "logprob_start_len past the prompt": {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5},
    "return_logprob not a bool": {"text": "hi", "return_logprob": "yes"},
    "sampling_params count mismatch": {"text": ["a", "b"], "sampling_params": [{}]},
    "batch too large": {"text": ["a"] * (MAX_BATCH + 1)},
    "one rid for a batch": {"text": ["a", "b"], "rid": "x"},
}


def engine_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The Engine's keywords for a /generate body (`text` is the Engine's `prompt`)."""
    kwargs = dict(body)
    if "text" in kwargs:
        kwargs["prompt"] = kwargs.pop("text")
    return kwargs


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_both_doors_refuse_with_the_same_text(case: str, tiny_server: ServerHandle, tiny_engine: Any) -> None:
    body = BAD_BODIES[case]
    response = httpx.post(tiny_server.url + "/generate", json=body, timeout=60)
    assert response.status_code == 400, response.text
    server_message = response.json()["error"]["message"]
    with pytest.raises(RequestError) as refused:
        tiny_engine.generate(**engine_kwargs(body))
    assert str(refused.value) == server_message
    assert not tiny_engine.scheduler.has_work  # nothing was queued by the refused call


def test_both_doors_give_n_copies_the_same_seeds(tiny_server: ServerHandle, tiny_engine: Any) -> None:
    body = {"text": "Once upon", "sampling_params": {"n": 3, "seed": 11, "temperature": 1.0, "max_new_tokens": 6,
                                                     "ignore_eos": True}}
    served = httpx.post(tiny_server.url + "/generate", json=body, timeout=120).json()
    local = tiny_engine.generate(**engine_kwargs(body))
    assert [r["output_ids"] for r in served] == [r["output_ids"] for r in local]
    assert len({tuple(r["output_ids"]) for r in local}) > 1  # the copies' seeds differ


def test_both_doors_shape_results_alike(tiny_server: ServerHandle, tiny_engine: Any) -> None:
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    served = httpx.post(tiny_server.url + "/generate", json=body, timeout=120).json()
    local = tiny_engine.generate(**engine_kwargs(body))
    assert served["text"] == local["text"] and served["output_ids"] == local["output_ids"]
    volatile = {"id", "e2e_latency", "cached_tokens"}
    assert sorted(served["meta_info"]) == sorted(local["meta_info"])
    for key in set(served["meta_info"]) - volatile - {"output_token_logprobs", "output_top_logprobs"}:
        assert served["meta_info"][key] == local["meta_info"][key], key
    for got, want in zip(served["meta_info"]["output_token_logprobs"], local["meta_info"]["output_token_logprobs"]):
        assert got[1:] == want[1:] and got[0] == pytest.approx(want[0], abs=1e-4)
