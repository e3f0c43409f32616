"""SGLang's whole request schema (issue 16): every field of SGLang's `GenerateReqInput`, its
`SamplingParams` and its OpenAI `CompletionRequest` / `ChatCompletionRequest` (read from the
pinned sglang wheel's source, not imported) is a field of our request models, and its SGLang
default is accepted; a feature we do not have is a 400 saying so; a field nobody defines is
still refused as unknown."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerHandle

from radixlm.runtime.api.errors import RequestError
from radixlm.runtime.api.protocol import (
    ChatRequest,
    CompletionRequest,
    GenerateReqInput,
    SamplingParamsInput,
    parse_body,
)

# Reasoning separation owns these (they are another change's fields).
REASONING = {"separate_reasoning", "stream_reasoning", "reasoning_effort", "thinking", "require_reasoning",
             "max_thinking_tokens"}
# A body each field is tried in; the field's own default is added to it.
BODIES: dict[str, dict[str, Any]] = {
    "generate": {"text": "hi"}, "sampling": {}, "completion": {"prompt": "hi"},
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
}
MODELS = {"generate": GenerateReqInput, "sampling": SamplingParamsInput, "completion": CompletionRequest,
          "chat": ChatRequest}
NO_DEFAULT = object()


def class_fields(tree: ast.Module, name: str) -> dict[str, Any]:
    """name -> default (a Python value, or NO_DEFAULT when it is not a literal) of a class's
    annotated fields, its bases' first (those defined in the same module)."""
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    out: dict[str, Any] = {}
    for base in classes[name].bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out.update(class_fields(tree, base.id))
    for node in classes[name].body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and "Internal fields" in str(node.value):
            break
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_"):
            out[node.target.id] = default_of(node.value)
    return out


def internal_after(source: str, class_name: str) -> set[str]:
    """SamplingParams' fields after its '# --- Internal fields' comment (not part of the API)."""
    start = source.index(f"class {class_name}")
    internal = source.index("# --- Internal fields", start)
    end = source.index("\n    def ", internal)
    return {line.split(":")[0].strip() for line in source[internal:end].splitlines()[1:] if ":" in line}


def default_of(value: ast.expr | None) -> Any:
    if value is None:
        return NO_DEFAULT
    if isinstance(value, ast.Call):  # field(default=...) / Field(default=...)
        for keyword in value.keywords:
            if keyword.arg == "default":
                return default_of(keyword.value)
        return NO_DEFAULT
    try:
        return ast.literal_eval(value)
    except ValueError:
        return NO_DEFAULT


@pytest.fixture(scope="module")
def sglang_fields(sglang_paths: tuple[Path, Path]) -> dict[str, dict[str, Any]]:
    root = sglang_paths[0] / "sglang" / "srt"
    io_struct = ast.parse((root / "managers" / "io_struct.py").read_text())
    sampling_source = (root / "sampling" / "sampling_params.py").read_text()
    openai = ast.parse((root / "entrypoints" / "openai" / "protocol.py").read_text())
    sampling = class_fields(ast.parse(sampling_source), "SamplingParams")
    for name in internal_after(sampling_source, "SamplingParams"):
        sampling.pop(name, None)
    fields = {"generate": class_fields(io_struct, "GenerateReqInput"), "sampling": sampling,
              "completion": class_fields(openai, "CompletionRequest"), "chat": class_fields(openai, "ChatCompletionRequest")}
    return {kind: {k: v for k, v in names.items() if k not in REASONING} for kind, names in fields.items()}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_sglang_field_is_ours(sglang_fields: dict[str, dict[str, Any]], kind: str) -> None:
    assert len(sglang_fields[kind]) >= 10  # the source was read
    missing = sorted(set(sglang_fields[kind]) - set(MODELS[kind].model_fields))
    assert missing == []


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_each_sglang_default_is_accepted(sglang_fields: dict[str, dict[str, Any]], kind: str) -> None:
    tried = 0
    for name, default in sglang_fields[kind].items():
        if default is NO_DEFAULT or name in BODIES[kind]:
            continue
        body = {**BODIES[kind], name: default}
        parse_body(MODELS[kind], body)  # raises RequestError (a 400) if refused
        tried += 1
    assert tried >= len(sglang_fields[kind]) // 2


def test_what_the_router_sends_is_accepted() -> None:
    """The bodies sglang-router 0.3.2 forwards (seen on the wire), reasoning fields aside."""
    parse_body(GenerateReqInput, {
        "text": "hi", "model": None, "sampling_params": {"max_new_tokens": 4}, "return_text_in_logprobs": False,
        "stream": True, "log_metrics": True, "return_hidden_states": False, "background": False, "no_logs": False,
        "return_bytes": False, "return_entropy": False})
    parse_body(CompletionRequest, {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": False, "echo": False,
                                   "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
                                   "return_hidden_states": False})
    parse_body(ChatRequest, {"messages": [{"role": "user", "content": "hi"}], "model": "unknown", "logprobs": False,
                             "max_completion_tokens": 4, "stream": True, "no_stop_trim": False, "ignore_eos": False,
                             "continue_final_message": False, "skip_special_tokens": True,
                             "return_hidden_states": False})


@pytest.mark.parametrize(("model", "body", "field"), [
    (GenerateReqInput, {"text": "hi", "return_hidden_states": True}, "return_hidden_states"),
    (GenerateReqInput, {"text": "hi", "image_data": "http://127.0.0.1:1/cat.png"}, "image_data"),
    (GenerateReqInput, {"text": "hi", "lora_path": "adapter"}, "lora_path"),
    (GenerateReqInput, {"text": "hi", "disagg_prefill_dp_rank": 1}, "disagg_prefill_dp_rank"),
    (GenerateReqInput, {"text": "hi", "extra_key": "tenant-a"}, "extra_key"),
    (GenerateReqInput, {"text": "hi", "sampling_params": {"logit_bias": {"5": 1.0}}}, "sampling_params.logit_bias"),
    (GenerateReqInput, {"text": "hi", "sampling_params": {"beam_width": 4}}, "sampling_params.beam_width"),
    (CompletionRequest, {"prompt": "hi", "best_of": 3}, "best_of"),
    (CompletionRequest, {"prompt": "hi", "return_hidden_states": "last"}, "return_hidden_states"),
    (ChatRequest, {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}, "return_token_ids"),
])
def test_a_feature_we_lack_is_a_400_naming_it(model: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError, match=rf"^{field} is not supported here \(") as e:
        parse_body(model, body)
    assert e.value.status_code == 400


@pytest.mark.parametrize("model,body", [
    (GenerateReqInput, {"text": "hi", "return_hidden_states": False, "data_parallel_rank": 0, "image_data": [],
                        "session_id": "s1", "priority": 3, "log_metrics": False, "sampling_params": {"beam_width": 1}}),
    (CompletionRequest, {"prompt": "hi", "best_of": 1, "routed_dp_rank": 0, "custom_labels": {"team": "a"}}),
    (ChatRequest, {"messages": [{"role": "user", "content": "hi"}], "return_flat_raw_top_logprobs_b64": False,
                   "sampling_logprobs_mode": "selected", "use_audio_in_video": True}),
])
def test_defaults_and_no_op_values_are_accepted(model: Any, body: dict[str, Any]) -> None:
    parse_body(model, body)


@pytest.mark.parametrize("model,body", [
    (GenerateReqInput, {"text": "hi", "return_hidden_state": False}),
    (GenerateReqInput, {"text": "hi", "sampling_params": {"max_tokens": 3}}),
    (CompletionRequest, {"prompt": "hi", "max_new_tokens": 3}),
    (ChatRequest, {"messages": [{"role": "user", "content": "hi"}], "return_hidden": True}),
])
def test_a_field_nobody_defines_is_still_unknown(model: Any, body: dict[str, Any]) -> None:
    with pytest.raises(RequestError, match="unknown"):
        parse_body(model, body)


# ---------------------------------------------------------------- the SGLang fields implemented here
def test_completion_response_format_stop_regex_and_no_stop_trim(tiny_server: ServerHandle) -> None:
    """A completion takes `response_format` (as chat does), `stop_regex` and `no_stop_trim`."""
    body = {"prompt": "Spell:", "max_tokens": 12, "temperature": 0,
            "response_format": {"type": "regex", "regex": "ab{5}"}}
    assert completion_text(tiny_server, body) == "abbbbb"
    assert completion_text(tiny_server, {**body, "stop_regex": "b{2}"}) == "a"  # cut before the match
    assert completion_text(tiny_server, {**body, "stop_regex": "b{2}", "no_stop_trim": True}) == "abb"


def test_chat_continue_final_message(tiny_server: ServerHandle) -> None:
    """The last (assistant) message is continued: no end of turn and no generation prompt after it."""
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    usage = {}
    for cont in (False, True):
        resp = httpx.post(tiny_server.url + "/v1/chat/completions", timeout=120, json={
            "messages": messages, "max_tokens": 1, "continue_final_message": cont})
        assert resp.status_code == 200, resp.text
        usage[cont] = resp.json()["usage"]["prompt_tokens"]
    assert usage[True] < usage[False]


def test_chat_template_kwargs_reach_the_template(tiny_model_dir: Path) -> None:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ suffix | default('') }}"
    tokenizer = Tokenizer(tiny_model_dir, chat_template=template)
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, template_kwargs={"suffix": "!"}) == "hi!"
    assert tokenizer.apply_chat_template(messages) == "hi"


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    from radixlm.formats.tool_formats import tool_call_reader
    from radixlm.runtime.server.chat_common import split_calls

    text = ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n'
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert [c.name for c in split_calls(text, {"f", "g"}, tool_call_reader("hermes"))[1]] == ["f", "g"]
    assert [c.name for c in split_calls(text, {"f", "g"}, tool_call_reader("hermes"), is_parallel=False)[1]] == ["f"]


def test_logprob_options_one_per_prompt(tiny_server: ServerHandle) -> None:
    """SGLang's batch form: return_logprob, logprob_start_len and top_logprobs_num as lists."""
    resp = httpx.post(tiny_server.url + "/generate", timeout=120, json={
        "text": ["one two three", "four five six"], "sampling_params": {"max_new_tokens": 2},
        "return_logprob": [True, False], "top_logprobs_num": [2, 0], "logprob_start_len": [0, -1]})
    assert resp.status_code == 200, resp.text
    first, second = (r["meta_info"] for r in resp.json())
    assert len(first["output_token_logprobs"]) == 2 and all(len(t) == 2 for t in first["output_top_logprobs"])
    assert first["input_token_logprobs"]
    assert "output_token_logprobs" not in second or not second["output_token_logprobs"]


def test_log_metrics_false_and_health_checks_stay_out_of_metrics(tiny_server: ServerHandle) -> None:
    def requests_total() -> float:
        text = httpx.get(tiny_server.url + "/metrics", timeout=60).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("radixlm_requests_total"))

    before = requests_total()
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(tiny_server.url + "/generate", json={**body, "log_metrics": False}, timeout=120).status_code == 200
    assert httpx.get(tiny_server.url + "/health_generate", timeout=120).status_code == 200
    assert requests_total() == before
    assert httpx.post(tiny_server.url + "/generate", json=body, timeout=120).status_code == 200
    assert requests_total() == before + 1


def completion_text(server: ServerHandle, body: dict[str, Any]) -> str:
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])
