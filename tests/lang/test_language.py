"""The language on the in-process Engine (tiny random model, SmolLM2's tokenizer and chat
template): programs' text, gen/select/fork/join/run_batch/streaming semantics, prefix reuse
measured by cached_tokens, tool calls, errors. Outputs are checked against direct Engine calls,
so random weights are enough."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import jsonschema
import pytest
from radixlm_testing import assert_engine_clean

import radixlm as rl
from radixlm.backend.base import BackendError
from radixlm.backend.engine import EngineBackend
from radixlm.choices import ChoiceScores, choice_token_span, decide
from radixlm.formats.chat_template import CHATML, derive_chat_template
from radixlm.tools import function_to_tool


@pytest.fixture(scope="module")
def backend(tiny_engine: Any) -> EngineBackend:
    return EngineBackend(tiny_engine)


def greedy(engine: Any, prompt: str, max_new_tokens: int) -> str:
    return engine.generate(prompt, {"max_new_tokens": max_new_tokens, "temperature": 0})["text"]


# ---------------------------------------------------------------------- chat templates
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
]
LLAMA3_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
)


def render_roles(template: Any, messages: list[dict[str, str]]) -> str:
    text = ""
    for i, m in enumerate(messages):
        text += template.prefix(m["role"], i == 0) + m["content"] + template.suffix(m["role"])
    return text


@pytest.mark.parametrize("which", ["model", "llama3-like"])
def test_role_wrappers_reproduce_the_chat_template(tiny_engine: Any, which: str) -> None:
    tok = tiny_engine.tokenizer
    template_text = None if which == "model" else LLAMA3_LIKE

    def render(messages: list[dict[str, str]]) -> str:
        return tok.apply_chat_template(messages, add_generation_prompt=False, chat_template=template_text)

    template = derive_chat_template(render)
    assert template is not None
    for messages in CONVERSATIONS:
        assert render_roles(template, messages) == render(messages)
    if which == "model":  # SmolLM2 opens a user-first conversation with its default system prompt
        assert "SmolLM" in template.prefix("user", True) and "SmolLM" not in template.prefix("user", False)


def test_non_incremental_templates_are_refused() -> None:
    # a template that renders the last message differently cannot be cut into role wrappers
    def render(messages: list[dict[str, str]]) -> str:
        return "".join(("LAST:" if i == len(messages) - 1 else "") + m["content"] for i, m in enumerate(messages))

    assert derive_chat_template(render) is None
    assert CHATML.prefix("user", True) == "<|im_start|>user\n"


def test_program_text_is_the_chat_template_rendering(backend: EngineBackend, tiny_engine: Any) -> None:
    @rl.function
    def chat(s: Any) -> None:
        s += rl.system("You are terse.")
        s += rl.user("Name a colour.")
        s += rl.assistant(rl.gen("a", max_tokens=6, temperature=0))
        s += rl.user_begin() + "And another." + rl.user_end()
        s += rl.assistant_begin() + rl.gen("b", max_tokens=6, temperature=0) + rl.assistant_end()

    state = chat.run(backend=backend)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["a"] and messages[4]["content"] == state["b"]
    assert state.text() == tiny_engine.tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    # each gen saw exactly the rendered conversation so far as its prompt
    prompt_b = tiny_engine.tokenizer.apply_chat_template(messages[:4], add_generation_prompt=True)
    assert state["b"] == greedy(tiny_engine, prompt_b, 6)


# ---------------------------------------------------------------------- gen
def test_gen_appends_the_engine_output_and_meta(backend: EngineBackend, tiny_engine: Any) -> None:
    @rl.function
    def qa(s: Any, question: str) -> None:
        s += "Q: " + question + "\nA:" + rl.gen("answer", max_tokens=12, stop="\n")
        with s.var_scope("tail"):
            s += " then" + rl.gen("more", max_new_tokens=5)

    state = qa.run(question="why?", backend=backend, temperature=0)
    assert state.text().startswith("Q: why?\nA:" + state["answer"] + " then" + state["more"])
    assert state["answer"] == greedy(tiny_engine, "Q: why?\nA:", 12).split("\n")[0]
    assert state["tail"] == " then" + state["more"]
    meta = state.get_meta_info("more")
    assert meta["completion_tokens"] <= 5 and meta["cached_tokens"] > 0  # the prefix was reused


def test_bind_and_positional_arguments(backend: EngineBackend) -> None:
    @rl.function
    def greet(s: Any, name: str, punctuation: str) -> None:
        s += f"Hello {name}{punctuation}"

    assert greet.bind(punctuation="!").run("Ann", backend=backend).text() == "Hello Ann!"


def test_constrained_gens_obey_their_constraints(backend: EngineBackend) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["n", "ok"]}

    @rl.function
    def typed(s: Any) -> None:
        s += "int: " + rl.gen_int("i", max_tokens=8) + "\n"
        s += "str: " + rl.gen_string("t", max_tokens=160) + "\n"
        s += "bool: " + rl.gen("b", dtype=bool, max_tokens=4) + "\n"
        s += "date: " + rl.gen("d", regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", max_tokens=16) + "\n"
        s += "json: " + rl.gen("j", json_schema=schema, max_tokens=128)
        s += "\npick: " + rl.gen("c", choices=["alpha", "beta"])

    state = typed.run(backend=backend, temperature=1.0, seed=7)
    assert int(state["i"]) == int(state["i"].strip())
    assert state["t"].startswith('"') and state["t"].endswith('"')
    assert state["b"] in ("True", "False")
    assert len(state["d"]) == 10 and state["d"].startswith("20")
    jsonschema.validate(json.loads(state["j"]), schema)
    assert state["c"] in ("alpha", "beta")


# ---------------------------------------------------------------------- select
def test_select_scores_every_choice_after_one_cached_prefix(backend: EngineBackend, tiny_engine: Any) -> None:
    tiny_engine.flush_cache()
    prompt = "The weather today is quite nice and the sky is " * 3
    choices = ["blue", "grey and cloudy", "green"]

    @rl.function
    def pick(s: Any) -> None:
        s += prompt + rl.select("colour", choices)

    state = pick.run(backend=backend)
    meta = state.get_meta_info("colour")
    # reference: each choice's mean token log-probability from an independent full request
    tok = tiny_engine.tokenizer
    reference = []
    for choice in choices:
        ids = tok.encode(prompt + choice)
        out = tiny_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
        entries = out["meta_info"]["input_token_logprobs"]
        span = choice_token_span([tok.decode([t]) for _, t, _ in entries], choice)
        reference.append(sum(lp for lp, _, _ in entries[-span:]) / span)
    assert meta["normalized_prompt_logprobs"] == pytest.approx(reference, abs=1e-4)
    assert state["colour"] == choices[max(range(3), key=lambda i: reference[i])]
    prompt_tokens = len(tok.encode(prompt))
    assert meta["cached_tokens"] >= prompt_tokens - 2  # the choices reused the prompt's KV


@pytest.mark.parametrize("method", ["greedy_token_selection", "unconditional_likelihood_normalized"])
def test_other_choice_methods(backend: EngineBackend, method: str) -> None:
    @rl.function
    def pick(s: Any) -> None:
        s += "Answer: " + rl.select("x", ["yes", "no", "maybe so"], choices_method=method)

    state = pick.run(backend=backend)
    assert state["x"] in ("yes", "no", "maybe so")
    scores = state.get_meta_info("x")["scores"]
    assert state["x"] == ["yes", "no", "maybe so"][scores.index(max(scores))]


def test_decide_methods_on_known_scores() -> None:
    scores = ChoiceScores([[-1.0, -5.0], [-2.0], [-1.0, -0.5]], unconditional_logprobs=[[-0.5, -5.0], [-4.0], [-1.0, -0.5]])
    assert decide(["a", "b", "c"], scores, "token_length_normalized")[0] == 2  # means -3, -2, -0.75
    assert decide(["a", "b", "c"], scores, "greedy_token_selection")[0] == 2  # a/c tie on -1, c wins next
    assert decide(["a", "b", "c"], scores, "unconditional_likelihood_normalized")[0] == 1  # -0.25, +2, 0
    picks = {decide(["a", "b", "c"], scores, "token_length_normalized", temperature=100.0)[0] for _ in range(200)}
    assert picks == {0, 1, 2}  # sampled, not argmax


# ---------------------------------------------------------------------- fork / join
def test_fork_branches_run_independently_on_a_cached_prefix(backend: EngineBackend, tiny_engine: Any) -> None:
    tiny_engine.flush_cache()
    stem = "Let us think about this problem step by step carefully. " * 2

    @rl.function
    def tree(s: Any) -> None:
        s += stem
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Idea {i}:" + rl.gen("idea", max_tokens=6, temperature=0)
        forks.join()
        s += "Best:" + rl.gen("best", max_tokens=4, temperature=0)

    state = tree.run(backend=backend)
    ideas = state["idea"]
    assert isinstance(ideas, list) and len(ideas) == 3
    for i, idea in enumerate(ideas):
        assert idea == greedy(tiny_engine, stem + f"Idea {i}:", 6)
    assert state.text() == stem + "Best:" + state["best"]  # gather_variable leaves the text


def test_fork_concate_and_append_and_group_add(backend: EngineBackend) -> None:
    @rl.function
    def branches(s: Any) -> None:
        s += "Start."
        forks = s.fork(2)
        forks += [" A", " B"]
        forks += rl.gen("x", max_tokens=2, temperature=0)
        forks.join("concate_and_append")

    state = branches.run(backend=backend)
    a, b = state["x"]
    assert state.text() == "Start. A" + a + " B" + b


# ---------------------------------------------------------------------- run_batch / errors
def test_run_batch_caches_the_common_prefix_and_isolates_errors(backend: EngineBackend, tiny_engine: Any) -> None:
    tiny_engine.flush_cache()
    shared = "You are a careful assistant who answers every question about geography. " * 4

    @rl.function
    def ask(s: Any, question: str) -> None:
        if question == "boom":
            raise RuntimeError("this item fails")
        s += shared + "Q: " + question + "\nA:" + rl.gen("a", max_tokens=4, temperature=0)

    questions = ["Where is Oslo?", "boom", "Where is Lima?", "Where is Pune?"]
    states = ask.run_batch([{"question": q} for q in questions], num_threads=4, progress_bar=True, backend=backend)
    assert len(states) == 4
    assert isinstance(states[1].error(), RuntimeError) and "this item fails" in str(states[1].error())
    shared_tokens = len(tiny_engine.tokenizer.encode(shared))
    for i in (0, 2, 3):
        assert states[i].error() is None
        assert states[i]["a"] == greedy(tiny_engine, shared + "Q: " + questions[i] + "\nA:", 4)
        # cached before any item ran, so every item (the first included) reused it
        assert states[i].get_meta_info("a")["cached_tokens"] >= shared_tokens - 1


def test_a_failing_gen_stops_its_program_with_the_server_message(backend: EngineBackend) -> None:
    @rl.function
    def bad(s: Any) -> None:
        s += "x" + rl.gen("a", regex="(unclosed", max_tokens=4)
        s += rl.gen("b", max_tokens=2)

    with pytest.raises(BackendError, match="regex"):
        bad.run(backend=backend)
    states = bad.run_batch([{}, {}], backend=backend)
    assert all(isinstance(st.error(), BackendError) for st in states)
    with pytest.raises(BackendError):
        states[0]["b"]


def test_unknown_variable_and_role_misuse_raise(backend: EngineBackend) -> None:
    @rl.function
    def reads(s: Any) -> None:
        s += "hi"
        s["missing"]

    with pytest.raises(KeyError, match="missing"):
        reads.run(backend=backend)

    @rl.function
    def nested(s: Any) -> None:
        s += rl.user_begin() + rl.assistant("x")

    with pytest.raises(ValueError, match="inside role"):
        nested.run(backend=backend)


# ---------------------------------------------------------------------- streaming / async
def test_streaming_yields_the_program_text(backend: EngineBackend) -> None:
    @rl.function
    def story(s: Any) -> None:
        s += "Once upon a time" + rl.gen("rest", max_tokens=12, temperature=0)
        s += " The end."

    plain = story.run(backend=backend)
    streamed = story.run(backend=backend, stream=True)
    chunks = list(streamed.text_iter())
    assert "".join(chunks) == plain.text() and len(chunks) > 3
    again = story.run(backend=backend, stream=True)
    assert "".join(again.text_iter("rest")) == plain["rest"]

    async def collect() -> str:
        state = story.run(backend=backend, stream=True)
        return "".join([c async for c in state.text_async_iter()])

    assert asyncio.run(collect()) == plain.text()
    assert asyncio.run(story.run_async(backend=backend)).text() == plain.text()


# ---------------------------------------------------------------------- tools
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather of a city.

    Args:
        city: the city's name
        unit: the temperature unit
    """
    return f"18 degrees {unit} in {city}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def capital(country: Literal["France", "Peru"]) -> str:
    """The capital of a country."""
    return {"France": "Paris", "Peru": "Lima"}[country]


# (a random-weight model fills free strings until max_tokens, so the called tools take bounded values)
TOOLS = {"add": add, "capital": capital}


def test_function_to_tool_schema() -> None:
    spec = function_to_tool(get_weather)["function"]
    assert spec["name"] == "get_weather" and spec["description"] == "Get the current weather of a city."
    params = spec["parameters"]
    assert params["required"] == ["city"]
    assert params["properties"]["unit"] == {"enum": ["celsius", "fahrenheit"], "description": "the temperature unit"}
    assert params["properties"]["city"]["type"] == "string"
    with pytest.raises(ValueError, match="plain name"):
        function_to_tool(lambda x: x)

    def takes_a_set(items: set[int]) -> None:
        pass

    with pytest.raises(ValueError, match="cannot describe"):
        function_to_tool(takes_a_set)


def test_required_tool_call_validates_and_runs(backend: EngineBackend, tiny_engine: Any) -> None:
    @rl.function
    def agent(s: Any) -> None:
        s += rl.system(rl.tools_prompt([capital, add]))
        s += rl.user("What is 2 + 3?")
        s += rl.assistant(rl.gen("call", tools=[capital, add], tool_choice="required", max_tokens=96, temperature=0.7, seed=3))
        s.run_tool("call")
        s += rl.assistant(rl.gen("answer", tools=[capital, add], tool_choice="add", max_tokens=96, temperature=0))

    state = agent.run(backend=backend)
    call = state["call"]
    assert isinstance(call, rl.ToolCall) and call.name in TOOLS
    schema = function_to_tool(TOOLS[call.name])["function"]["parameters"]
    jsonschema.validate(call.arguments, schema)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    content = messages[2]["content"]
    assert content.startswith("<tool_call>") and content.endswith("</tool_call>")
    assert json.loads(content[len("<tool_call>") : -len("</tool_call>")]) == {"name": call.name, "arguments": call.arguments}
    assert messages[3]["tool_call_id"] == call.id and messages[3]["name"] == call.name
    named = state["answer"]
    assert isinstance(named, rl.ToolCall) and named.name == "add"
    assert isinstance(named.arguments["a"], int) and isinstance(named.arguments["b"], int)
    assert_engine_clean(tiny_engine)


def test_auto_tool_choice_gives_text_or_a_valid_call(backend: EngineBackend) -> None:
    @rl.function
    def maybe(s: Any) -> None:
        s += rl.user("Weather in Oslo?")
        s += rl.assistant(rl.gen("reply", tools=[get_weather], max_tokens=16, temperature=0))

    state = maybe.run(backend=backend)
    reply = state["reply"]
    assert isinstance(reply, str) and reply == state.messages()[-1]["content"]  # random weights: no call
    with pytest.raises(ValueError, match="no tool call"):
        state.run_tool("reply")


def test_engine_is_clean_after_the_language_tests(tiny_engine: Any) -> None:
    assert_engine_clean(tiny_engine)


def test_ended_states_refuse_more_and_unjoined_forks_are_closed(backend: EngineBackend) -> None:
    kept: list[Any] = []

    @rl.function
    def leaves_forks(s: Any) -> None:
        s += "stem"
        kept.extend(s.fork(2))
        kept[0] += " a"

    state = leaves_forks.run(backend=backend)
    assert all(f.stream_executor._finished for f in kept)  # closed with the program
    assert kept[0].text() == "stem a"
    with pytest.raises(RuntimeError, match="has ended"):
        state += "more"
