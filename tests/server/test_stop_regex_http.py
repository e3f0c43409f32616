"""`sampling_params.stop_regex` through the native HTTP API on the tiny model: the output is cut
before the first match (after it with no_stop_trim), `finish_reason` names the matched text,
streaming agrees, and a bad pattern is a 400 naming the field. The outputs are kept to a/b
letters by a regex constraint, with a seed, so a run without stop_regex is the reference.
Then the real `sglang` frontend and `import radixlm as sgl` run one program that uses
`stop_regex` and SGLang's choice-method objects, with the same results."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from conftest import ServerHandle
from radixlm_testing import first_regex_match
from test_native_api import sse_events
from test_sglang_frontend import under_sglang_and_radixlm

LETTERS = {"regex": "[ab]{24}", "temperature": 1.0, "seed": 7, "max_new_tokens": 40}


def generate(server: ServerHandle, **params: Any) -> dict[str, Any]:
    response = httpx.post(server.url + "/generate", json={"text": "Letters:", "sampling_params": {**LETTERS, **params}},
                          timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_stop_regex_cuts_where_the_text_first_matches(tiny_server: ServerHandle) -> None:
    full = generate(tiny_server)["text"]
    assert re.fullmatch("[ab]{24}", full)
    pattern = f"{full[9]}[ab]+?{full[12]}"  # matches at 9 at the latest
    match = first_regex_match(full, pattern)
    assert match is not None
    start, end = match
    cut = generate(tiny_server, stop_regex=pattern)
    assert cut["text"] == full[:start]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": full[start:end]}
    kept = generate(tiny_server, stop_regex=[pattern, "c+"], no_stop_trim=True)
    assert kept["text"] == full[:end] and kept["meta_info"]["completion_tokens"] < cut["meta_info"]["completion_tokens"] + 4
    body = {"text": "Letters:", "sampling_params": {**LETTERS, "stop_regex": pattern}, "stream": True}
    chunks = sse_events(tiny_server, body)[:-1]
    assert chunks[-1]["text"] == cut["text"] and chunks[-1]["meta_info"]["finish_reason"]["matched"] == full[start:end]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))  # nothing emitted was cut


def test_a_bad_stop_regex_is_a_400_naming_it(tiny_server: ServerHandle) -> None:
    for pattern, reason in [("(", "does not parse"), ("a*", "empty string"), ("(?=a)b", "lookaround"), (7, "string")]:
        response = httpx.post(tiny_server.url + "/generate", timeout=60,
                              json={"text": "x", "sampling_params": {"stop_regex": pattern}})
        assert response.status_code == 400, response.text
        assert "stop_regex" in response.text and reason in response.text


PROGRAM = r'''
import json, sys
sys.path.insert(0, sys.argv[2])
sys.path.append(sys.argv[3])
import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

@sgl.function
def letters(s, question):
    s += question + "\n"
    s += "Letters:" + sgl.gen("x", max_tokens=40, regex="[ab]{24}", stop_regex="ba+b", temperature=0)
    s += "\nPick:" + sgl.select("pick", choices=[" a", " bb", " ab"], choices_method=sgl.greedy_token_selection)
    return len(s["x"])

sgl.set_default_backend(RuntimeEndpoint(sys.argv[1]))
state = letters.run(question="Say letters.")
print(json.dumps({"x": state["x"], "pick": state["pick"], "ret": state.ret_value, "text": state.text(),
                  "finish": state.get_meta_info("x")["finish_reason"]}))
'''


def test_the_same_program_under_sglang_and_radixlm(tiny_server: ServerHandle, sglang_paths: tuple[Path, Path]) -> None:
    theirs, ours = under_sglang_and_radixlm(PROGRAM, tiny_server.url, sglang_paths)
    assert ours == theirs
    if ours["finish"]["type"] == "stop":  # the greedy letters contain the pattern
        assert re.fullmatch("ba+b", ours["finish"]["matched"])
