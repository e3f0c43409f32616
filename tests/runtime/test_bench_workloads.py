"""The benchmark workloads built from their data files (runtime/bench/data/): the W prompts are
byte-identical to the peer measurements' (../shared/bench/workloads.py, outside this repository),
pinned by their digest; the F programs' inputs have the shapes the programs take."""

from __future__ import annotations

import hashlib
import json

from radixlm.runtime.bench import copy_extraction as w6
from radixlm.runtime.bench import frontend_workloads as fw
from radixlm.runtime.bench import workloads as wl

# sha256 of every W prompt, as the peers' workloads.py builds them (checked against it when pinned)
W6_PROMPTS_SHA256 = "5803e6d12842d5093f6788c9776e034bc7bb1f7180c4b497a2ce8aeecf8aa775"
W_PROMPTS_SHA256 = "1189e10dc67b3940706f3c1898f3b4f56e02f30b595b5355ebb74d0be98c07bb"


def w_prompts_digest() -> str:
    prefix, w3_prompts = wl.w3_workload()
    parts = [wl.W1_PROMPT, *wl.w2_prompts(), *w3_prompts, prefix,
             *(json.dumps(case, sort_keys=True) for case in wl.w4_cases()), wl.w5_text(),
             json.dumps(wl.W4_SCHEMA, sort_keys=True)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def test_w_prompts_are_the_peers() -> None:
    assert w_prompts_digest() == W_PROMPTS_SHA256
    assert len(wl.w2_prompts()) == 32 and len(wl.w3_workload()[1]) == 32 and len(wl.w4_cases()) == 16


def test_f_inputs_have_the_programs_shapes() -> None:
    questions = fw.f1_questions(16)
    assert all(len(q["endings"]) == fw.F1_NUM_CHOICES and 0 <= q["answer"] < fw.F1_NUM_CHOICES for q in questions)
    assert fw.f1_few_shot().startswith(fw.F1_HEADER)
    assert [len(w.batch) for w in (fw.f2_workload(6), fw.f3_workload(8, 4), fw.f4_workload())] == [6, 8, 16]
    assert all("{topic}" in turn or "{" not in turn for turn in fw.F3_TURNS)


def test_w6_fields_are_spans_of_their_passage(default_model_dir) -> None:
    """W6 (ours, not the peers'): every truth value is copied from its passage, the truth as JSON
    fits the token limit and passes the checker and the schema; the prompts are pinned."""
    import jsonschema
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    cases = w6.cases()
    assert len(cases) == w6.NUM_CASES == 16 and cases == w6.cases()
    assert len({c["truth"]["quote"] for c in cases}) == 16 and len({c["truth"]["reference"] for c in cases}) == 16
    for case in cases:
        document = case["prompt"].split("Document:\n", 1)[1]
        assert all(value in document for value in case["truth"].values()), case
        answer = json.dumps(case["truth"], indent=2)
        jsonschema.validate(json.loads(answer), w6.SCHEMA)
        assert w6.check(answer, case["truth"]) == (True, True, len(w6.FIELDS))
        assert len(tokenizer.encode(answer)) < w6.MAX_TOKENS
    assert w6.check("{}", cases[0]["truth"]) == (True, False, 0) and w6.check("{", cases[0]["truth"])[0] is False
    digest = hashlib.sha256("\x00".join(c["prompt"] for c in cases).encode()).hexdigest()
    assert digest == W6_PROMPTS_SHA256
