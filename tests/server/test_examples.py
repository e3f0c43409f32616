"""The examples run end to end (tiny model / tiny server), so they cannot rot."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import jsonschema
from conftest import ServerHandle
from radixlm_testing import FALLBACK_DIGIT, REASONING_SCRIPT

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_offline_engine_example(tiny_model_dir: Path) -> None:
    out = run("offline_engine.py", "--model-path", str(tiny_model_dir), "--max-new-tokens", "8")
    assert "constrained: {" in out and "cached prompt tokens" in out


def test_openai_client_example(tiny_server: ServerHandle) -> None:
    out = run("openai_client.py", "--url", tiny_server.url)
    assert "json: {'capital':" in out and "tool call: get_weather {'city':" in out


# ---------------------------------------------------------------- the language examples (lang_*.py)
# Random weights give nonsense text, so these check the structure each example promises.


def load_example(script: str) -> types.ModuleType:
    """The example as a module (its constants and tools; main() does not run)."""
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), ROOT / "examples" / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_lang_reasoning_example(reasoning_server: ServerHandle) -> None:
    """On the scripted model, whose reasoning and answer are known: the output is exact."""
    out = run("lang_reasoning.py", "--url", reasoning_server.url)
    reasoning, _, answer = REASONING_SCRIPT
    assert out.splitlines() == [
        f"reasoning: {reasoning!r}", f"answer:    {answer!r}",
        f"number:    {FALLBACK_DIGIT!r}  (regex [0-9]+, after reasoning {reasoning!r})",
        f"chat:      reasoning_content={reasoning!r} content={answer!r}",
        f"/separate_reasoning: {{'text': {answer!r}, 'reasoning_text': {reasoning!r}}}",
    ]


def test_lang_few_shot_qa_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_few_shot_qa.py")
    out = run("lang_few_shot_qa.py", "--url", tiny_server.url, "--max-tokens", "6")
    answers = re.findall(r"^  -> (.*)  \((\d+) prompt tokens, (\d+) cached\)$", out, re.MULTILINE)
    assert len(answers) == len(example.QUESTIONS), out
    for question in example.QUESTIONS:
        assert f"{question}\n  -> " in out
    for answer, prompt_tokens, cached_tokens in answers:
        assert "\n" not in ast.literal_eval(answer)  # gen stopped at the newline
        assert 0 < int(cached_tokens) < int(prompt_tokens)  # the few-shot prefix came from the cache


def test_lang_multi_turn_chat_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_multi_turn_chat.py")
    out = run("lang_multi_turn_chat.py", "--url", tiny_server.url, "--max-tokens", "6")
    messages = [ast.literal_eval(line) for line in out.splitlines()]
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * len(example.TURNS)
    assert [m["content"] for m in messages if m["role"] == "user"] == example.TURNS
    assert all(isinstance(m["content"], str) for m in messages)


def test_lang_classify_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_classify.py")
    out = run("lang_classify.py", "--url", tiny_server.url)
    rows = re.findall(r"^(\w+) +\| (.+)\n +\| scores: (.+)$", out, re.MULTILINE)
    assert [text for _, text, _ in rows] == example.TEXTS, out
    for label, _, shown in rows:
        scores = {name: float(value) for name, value in (item.split("=") for item in shown.split())}
        assert list(scores) == example.LABELS
        assert scores[label] == max(scores.values())  # select took the best-scored label


def test_lang_tree_of_thought_example(tiny_server: ServerHandle) -> None:
    out = run("lang_tree_of_thought.py", "--url", tiny_server.url, "--branches", "3", "--max-tokens", "6")
    assert re.findall(r"^thought (\d+): ", out, re.MULTILINE) == ["1", "2", "3"], out  # join gathered 3
    best, shown = re.search(r"^best: (\d+)  \(scores: (.+)\)$", out, re.MULTILINE).groups()  # type: ignore[union-attr]
    scores = [float(x) for x in shown.split()]
    assert len(scores) == 3 and scores[int(best) - 1] == max(scores)
    assert re.search(r"^answer: ", out, re.MULTILINE)


def test_lang_json_extraction_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_json_extraction.py")
    out = run("lang_json_extraction.py", "--url", tiny_server.url)
    objects = [json.loads(line) for line in re.findall(r"^  -> (\{.*\})$", out, re.MULTILINE)]
    assert len(objects) == len(example.PASSAGES), out
    for obj in objects:
        jsonschema.validate(obj, example.PERSON_SCHEMA)
    assert f"{len(objects)}/{len(objects)} objects parse and validate" in out


def test_lang_react_agent_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_react_agent.py")
    # one step: the tools prompt and a tool call of up to 64 tokens nearly fill the tiny model's 512
    out = run("lang_react_agent.py", "--url", tiny_server.url, "--max-steps", "1", "--max-tokens", "6")
    calls = re.findall(r"^  tool call: (\w+) (.*)\n  observation: (.*)$", out, re.MULTILINE)
    assert calls, out  # the first step always calls a tool
    tools = {tool.__name__: tool for tool in example.TOOLS}
    for name, arguments, observation in calls:
        assert observation == str(tools[name](**json.loads(arguments)))  # run_tool ran the function
    assert re.search(r"^answer: ", out, re.MULTILINE)


def test_lang_typed_outputs_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_typed_outputs.py")
    out = run("lang_typed_outputs.py", "--url", tiny_server.url)
    for passage in example.PASSAGES:
        assert passage in out, out
    people = re.findall(r"^  -> Person\(name=.*, born=(\d+), field=.*\)  \(pydantic\)$", out, re.MULTILINE)
    events = re.findall(r"^  -> Event\(what=.*, year=-?\d+, kind=<Kind\.\w+: '(\w+)'>\)  \(dataclass\)$", out, re.MULTILINE)
    places = re.findall(r"^  -> (\{'place': .*, 'country': .*\})  \(TypedDict\)$", out, re.MULTILINE)
    assert len(people) == len(events) == len(places) == len(example.PASSAGES), out
    assert all(1000 <= int(born) <= 2100 for born in people)  # pydantic's bounds held
    assert all(kind in {k.value for k in example.Kind} for kind in events)
    raw = re.search(r"^raw text of the last person: (\{.*\})$", out, re.MULTILINE)
    assert raw is not None and set(json.loads(raw.group(1))) == {"name", "born", "field"}


def test_lang_traces_example(tiny_server: ServerHandle, tmp_path: Path) -> None:
    example = load_example("lang_traces.py")
    out_file = tmp_path / "traces.jsonl"
    out = run("lang_traces.py", "--url", tiny_server.url, "--out", str(out_file))
    runs = re.findall(r"^run \d \((\w+)\): (\d+) calls, (\d+) prompt tokens \((\d+) cached\), (\d+) completion", out,
                      re.MULTILINE)
    assert [city for city, *_ in runs] == example.CITIES, out
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(lines) == sum(int(calls) for _, calls, *_ in runs) == 4 * len(example.CITIES)
    assert f"wrote {len(lines)} calls to {out_file}" in out
    for city, _, prompt_tokens, cached_tokens, completion_tokens in runs:
        mine = [line for line in lines if line["sent"].get("prompt", "").find(city) >= 0]
        assert sum(line["prompt_tokens"] for line in mine) == int(prompt_tokens)
        assert sum(line["cached_tokens"] for line in mine) == int(cached_tokens) > 0  # forks reuse the prefix
        assert sum(line["completion_tokens"] or 0 for line in mine) == int(completion_tokens)  # select: None
        assert sorted((line["primitive"], line["name"], line["branch"]) for line in mine) == [
            ("gen", "dish", ""), ("gen", "idea", "0"), ("gen", "idea", "1"), ("select", "season", "")]


def test_lang_sglang_program_example(tiny_server: ServerHandle) -> None:
    example = load_example("lang_sglang_program.py")
    out = run("lang_sglang_program.py", "--url", tiny_server.url)
    picks = dict(re.findall(r"^(\w+) +-> '(.*)'$", out, re.MULTILINE))
    assert list(picks) == list(example.METHODS) and all(" " + p.strip() in example.CITIES for p in picks.values()), out
    samples = re.search(r"^3 samples: (\[.*\])$", out, re.MULTILINE)
    assert samples is not None and len(ast.literal_eval(samples.group(1))) == 3
    sentence = re.search(r"^one sentence: (.*) \((.*)\)$", out, re.MULTILINE)
    assert sentence is not None and not re.search(r"[.!?]", ast.literal_eval(sentence.group(1)))  # stop_regex cut there
    assert re.search(r"^ret_value: \{'best': '.*', 'samples': 3\}$", out, re.MULTILINE)
