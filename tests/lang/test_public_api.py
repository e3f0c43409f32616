"""Every public name of `sglang` (0.5.23) is here with SGLang's meaning, exercised on the tiny
Engine: the choice methods as objects (SGLang's protocol, strings still work, a user-written
method works), `global_config`'s switches, `ServerArgs` (lazily), `image` / `video` (clear
refusals), `separate_reasoning` (on a select here; on generated reasoning in
tests/server/test_reasoning_http.py), the state methods SGLang's `ProgramState` and
`ProgramStateGroup` have, and `run_batch`'s SGLang forms. The remote backends (Runtime,
RuntimeEndpoint, OpenAI, LiteLLM, Crusoe, Anthropic, VertexAI) run against real servers in
tests/server (test_lang_runtime_endpoint.py, test_lang_openai_backend.py, test_lang_remote_backends.py);
the last test here checks that every name is exercised somewhere."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from radixlm_testing import first_regex_match

import radixlm as rl
from radixlm.backend.engine import EngineBackend

# sglang/__init__.py's __all__ in the 0.5.23 wheel, written out (not imported)
SGLANG_ALL = [
    "Anthropic", "Crusoe", "Engine", "LiteLLM", "OpenAI", "Runtime", "RuntimeEndpoint", "ServerArgs", "VertexAI",
    "__version__", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int",
    "gen_string", "get_server_info", "global_config", "greedy_token_selection", "image", "select",
    "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]
TESTS = Path(__file__).resolve().parents[1]


class CountingBackend(EngineBackend):
    """The Engine backend, counting the prefix-cache requests the language makes."""

    def __init__(self, engine: Any):
        super().__init__(engine)
        self.cached_prefixes: list[str] = []

    def cache_prefix(self, prompt: str) -> None:
        self.cached_prefixes.append(prompt)
        super().cache_prefix(prompt)


@pytest.fixture(scope="module")
def backend(tiny_engine: Any) -> CountingBackend:
    return CountingBackend(tiny_engine)


@pytest.fixture
def config() -> Any:
    """global_config, restored after the test."""
    saved = dict(vars(rl.global_config))
    yield rl.global_config
    vars(rl.global_config).update(saved)


def test_every_sglang_name_is_public_and_resolves() -> None:
    assert sorted(set(SGLANG_ALL) - set(rl.__all__)) == []
    for name in rl.__all__:
        assert getattr(rl, name) is not None, name
    assert rl.__version__ == importlib.metadata.version("radixlm")


def test_engine_and_server_args_load_lazily(tiny_engine: Any) -> None:
    code = ("import sys, radixlm; before = 'torch' in sys.modules or 'radixlm.runtime' in sys.modules; "
            "args = radixlm.ServerArgs(max_total_tokens=2048); "
            "print(before, type(args).__module__, args.max_total_tokens, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "radixlm.runtime.config.server_args", "2048", "True"]
    assert isinstance(tiny_engine, rl.Engine) and isinstance(tiny_engine.server_args, rl.ServerArgs)


# ---------------------------------------------------------------------- choice methods
@rl.function
def pick(s: Any, method: Any) -> None:
    s += "The answer is" + rl.select("x", [" yes", " no", " maybe so"], choices_method=method)


def test_choice_methods_are_objects_and_names(backend: CountingBackend) -> None:
    for method in (rl.token_length_normalized, rl.greedy_token_selection, rl.unconditional_likelihood_normalized):
        assert isinstance(method, rl.ChoicesSamplingMethod)
        by_object, by_name = pick.run(method, backend=backend), pick.run(repr(method), backend=backend)
        assert by_object["x"] == by_name["x"]
        meta = by_object.get_meta_info("x")
        assert meta["scores"] == pytest.approx(by_name.get_meta_info("x")["scores"])
        # SGLang's meta: [logprob, token id, token text] entries per choice
        entries = meta["input_token_logprobs"]
        assert [len(e) for c in entries for e in c] == [3] * sum(map(len, entries))
        assert "".join(e[2] for e in entries[2]).endswith("maybe so")
    assert rl.unconditional_likelihood_normalized.requires_unconditional_logprobs
    assert not rl.greedy_token_selection.requires_unconditional_logprobs
    with pytest.raises(ValueError, match="choices_method must be one of"):
        rl.select("x", ["a"], choices_method="loudest")
    with pytest.raises(ValueError, match="ChoicesSamplingMethod"):
        rl.select("x", ["a"], choices_method=42)


class Shortest(rl.ChoicesSamplingMethod):
    """A user-written method: the shortest choice, with the arguments SGLang's protocol passes."""

    def __init__(self, unconditional: bool):
        self.unconditional = unconditional
        self.seen: dict[str, Any] = {}

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return self.unconditional

    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float], input_token_logprobs: Any,
                 output_token_logprobs: Any, unconditional_token_logprobs: Any = None) -> rl.ChoicesDecision:
        self.seen = dict(normalized=normalized_prompt_logprobs, conditional=input_token_logprobs,
                         output=output_token_logprobs, unconditional=unconditional_token_logprobs)
        return rl.ChoicesDecision(min(choices, key=len), {"picked_by": "length"})


@pytest.mark.parametrize("unconditional", [False, True])
def test_a_user_written_choice_method(backend: CountingBackend, unconditional: bool) -> None:
    method = Shortest(unconditional)
    state = pick.run(method, backend=backend)
    assert state["x"] == " no" and state.get_meta_info("x")["picked_by"] == "length"
    seen = method.seen
    assert len(seen["normalized"]) == 3 and seen["output"] == [[], [], []]
    for entries, mean in zip(seen["conditional"], seen["normalized"]):
        assert mean == pytest.approx(sum(e[0] for e in entries) / len(entries))
    assert (seen["unconditional"] is not None) == unconditional  # asked for only when required
    with pytest.raises(ValueError, match="decides by itself"):
        rl.select("x", ["a", "b"], temperature=0.5, choices_method=method)

    class Wrong(Shortest):
        def __call__(self, **kwargs: Any) -> rl.ChoicesDecision:
            return rl.ChoicesDecision("not a choice")

    with pytest.raises(ValueError, match="must return a ChoicesDecision naming one of the choices"):
        pick.run(Wrong(False), backend=backend)


# ---------------------------------------------------------------------- global_config
def test_global_config_switches(backend: CountingBackend, config: Any, capsys: pytest.CaptureFixture[str]) -> None:
    @rl.function
    def branches(s: Any, topic: str) -> None:
        s += "Let us write about " + topic + " in several different ways. "
        forks = s.fork(2)
        forks += rl.gen("x", max_tokens=2, temperature=0)
        forks.join()

    config.default_backend = backend  # as set_default_backend does; run() finds it
    backend.cached_prefixes.clear()
    branches.run("cats")
    assert len(backend.cached_prefixes) == 1  # enable_parallel_encoding: the fork prefix, once
    config.enable_parallel_encoding = False
    branches.run("cats")
    assert len(backend.cached_prefixes) == 1
    branches.run_batch([{"topic": "dogs"}, {"topic": "doves"}])
    assert backend.cached_prefixes[-1] == "Let us write about do"  # enable_precache_with_tracing
    config.enable_precache_with_tracing = False
    branches.run_batch([{"topic": "dogs"}, {"topic": "doves"}])
    assert len(backend.cached_prefixes) == 2

    config.verbosity = 2
    printed = branches.run("owls").text()
    assert capsys.readouterr().out == printed + "\n"
    config.verbosity = 0

    @rl.function
    def one(s: Any) -> None:
        s += "Hi" + rl.gen("x", temperature=0)

    config.default_max_new_tokens = 3
    config.skip_special_tokens_in_output = False
    config.spaces_between_special_tokens_in_out = False
    state = one.run(trace=True)
    assert state.get_meta_info("x")["completion_tokens"] <= 3
    sent = state.trace()[0].sent["sampling_params"]
    assert sent["skip_special_tokens"] is False and sent["spaces_between_special_tokens"] is False
    rl.set_default_backend(backend)
    assert rl.global_config.default_backend is backend and rl.get_server_info()["max_total_tokens"] == 4096
    assert rl.flush_cache() is True


# ---------------------------------------------------------------------- gen's SGLang arguments
def test_gen_takes_sglangs_arguments_in_sglangs_order(backend: CountingBackend, tiny_engine: Any) -> None:
    g = rl.gen("x", 5, None, 2, "\n", None, "[0-9]")
    assert (g.sampling.max_new_tokens, g.sampling.n, g.sampling.stop, g.sampling.stop_regex) == (5, 2, "\n", "[0-9]")
    assert rl.gen_int("i", 8).sampling.max_new_tokens == 8 and rl.gen_string("t", 9, 2).sampling.n == 2
    with pytest.raises(ValueError, match="n must be a positive integer"):
        rl.gen("x", n=0)

    @rl.function
    def samples(s: Any) -> None:
        s += "Once" + rl.gen("x", max_tokens=6, n=3, temperature=1.0, seed=11)
        s += " then" + rl.gen_int("i", 4, n=2, seed=5, temperature=1.0)

    state = samples.run(backend=backend)
    texts, metas = state["x"], state.get_meta_info("x")
    direct = tiny_engine.generate("Once", {"max_new_tokens": 6, "n": 3, "temperature": 1.0, "seed": 11})
    assert texts == [r["text"] for r in direct] and len(metas) == 3
    assert len(set(texts)) > 1  # three samples, not one three times
    assert state.text().startswith("Once" + texts[0] + " then")  # the text continues with the first
    assert all(re.fullmatch(r"[-+]?[0-9]{1,18}", i) for i in state["i"])


# ---------------------------------------------------------------------- images, videos, reasoning
def test_image_and_video_name_the_missing_vision_support(backend: CountingBackend, tmp_path: Path) -> None:
    picture = tmp_path / "cat.png"
    picture.write_bytes(b"\x89PNG not really")

    @rl.function
    def look(s: Any, media: Any) -> None:
        s += rl.user("What is this?" + media)
        s += rl.assistant(rl.gen("x", max_tokens=4))

    for media in (rl.image(str(picture)), rl.image(picture.read_bytes()), rl.video(str(picture), num_frames=4)):
        with pytest.raises(rl.NotSupportedError, match=rf"{media.kind}\(\): .* has no vision support"):
            look.run(media, backend=backend)
    with pytest.raises(TypeError, match="file path, a URL or bytes"):
        rl.image(3)
    with pytest.raises(ValueError, match="num_frames"):
        rl.video("clip.mp4", num_frames=0)


def test_separate_reasoning_splits_the_variable_and_the_text(backend: CountingBackend) -> None:
    @rl.function
    def decide(s: Any) -> None:
        s += rl.user("Yes or no?")
        s += rl.assistant(rl.separate_reasoning(rl.select("x", choices=["Hmm.</think>yes", "Hmm.</think>no"]),
                                                model_type="deepseek-r1"))

    state = decide.run(backend=backend)
    assert state["x_reasoning_content"] == "Hmm." and state["x"] in ("yes", "no")
    assert state.messages()[-1] == {"role": "assistant", "content": state["x"]}  # the text keeps the answer only
    assert "</think>" not in state.text()
    with pytest.raises(ValueError, match="model_type is required, one of deepseek-r1, "):
        rl.separate_reasoning(rl.gen("x"))
    with pytest.raises(ValueError, match="unknown reasoning parser 'r1'"):
        rl.separate_reasoning(rl.gen("x"), model_type="r1")


# ---------------------------------------------------------------------- the state, as SGLang's
def test_state_methods_as_sglangs(backend: CountingBackend) -> None:
    @rl.function
    def chat(s: Any, name: str) -> dict[str, Any]:
        s += rl.system_begin() + "Be brief." + rl.system_end()
        with s.user():
            s += "Hello, I am " + name
        s.assistant(rl.gen("reply", max_tokens=4, temperature=0))
        with s.copy() as c:
            c += " Side note:" + rl.gen("side", max_tokens=3, temperature=0)
        forks = s.fork(3)
        forks += lambda i: f" Option {i}:"
        forks[1] += " (the middle one)"
        forks += rl.gen("opt", max_tokens=2, temperature=0)
        forks.join()
        return {"reply": s["reply"], "in": "side" in s}

    state = chat.run("Ann", backend=backend)
    assert state.ret_value == {"reply": state["reply"], "in": True}
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    assert state.messages()[1]["content"] == "Hello, I am Ann"

    @rl.function
    def chat_by_methods(s: Any) -> None:
        s.system("Be brief.")
        s.user("Hello, I am Ann")
        s.assistant(rl.gen("reply", max_tokens=4, temperature=0))

    assert chat_by_methods.run(backend=backend).messages() == state.messages()
    assert state["side"] == [state["side"][0]] and len(state["opt"]) == 3

    @rl.function
    def bad(s: Any) -> None:
        s += None

    with pytest.raises(ValueError, match="append None"):
        bad.run(backend=backend)

    @rl.function
    def replace_a_fork(s: Any) -> None:
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(ValueError, match="cannot be replaced"):
        replace_a_fork.run(backend=backend)


def test_text_async_iter_with_meta_data(backend: CountingBackend) -> None:
    @rl.function
    def story(s: Any) -> None:
        s += "Once upon a time" + rl.gen("rest", max_tokens=8, temperature=0)

    async def collect() -> list[Any]:
        state = story.run(backend=backend, stream=True)
        return [item async for item in state.text_async_iter("rest", return_meta_data=True)]

    items = asyncio.run(collect())
    plain = story.run(backend=backend)
    assert "".join(text for text, _ in items) == plain["rest"]
    assert items[-1][1]["completion_tokens"] == 8 and all(meta == {} for _, meta in items[:-1])


def test_run_batch_sglang_forms_and_cache(backend: CountingBackend) -> None:
    @rl.function
    def greet(s: Any, name: str, mark: str = "!") -> str:
        s += "Hello " + name + mark + rl.gen("x", max_tokens=2, temperature=0)
        return name

    states = greet.run_batch([("Ann",), ("Bob", "?")], backend=backend)
    assert [st.ret_value for st in states] == ["Ann", "Bob"] and states[1].text().startswith("Hello Bob?")
    streamed = greet.run_batch([{"name": n} for n in "ABC"], backend=backend, generator_style=True)
    assert not isinstance(streamed, list) and [st.ret_value for st in streamed] == ["A", "B", "C"]
    with pytest.raises(TypeError, match="positional arguments"):
        greet.run_batch([("a", "b", "c")], backend=backend)
    backend.cached_prefixes.clear()
    greet.bind(name="Zed").cache(backend)
    assert backend.cached_prefixes == ["Hello Zed!"]


def test_every_sglang_name_is_exercised_by_a_test() -> None:
    """Each name appears as `rl.<name>` in some test other than the list above."""
    sources = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py"))
    missing = [n for n in SGLANG_ALL if n != "__version__" and not re.search(rf"\brl\.{re.escape(n)}\b", sources)]
    assert missing == []


def test_gen_stop_regex_cuts_the_output(backend: CountingBackend) -> None:
    @rl.function
    def letters(s: Any, stop_regex: Any) -> None:
        s += "Letters:" + rl.gen("x", regex="[ab]{24}", stop_regex=stop_regex, temperature=1.0, seed=7)
        s += "|end"

    full = letters.run(None, backend=backend)["x"]
    pattern = f"{full[8]}[ab]{full[10]}"  # occurs at 8 at the latest
    match = first_regex_match(full, pattern)
    assert match is not None
    start, end = match
    state = letters.run([pattern, "zz"], backend=backend)
    assert state["x"] == full[:start] and state.text() == "Letters:" + full[:start] + "|end"
    assert state.get_meta_info("x")["finish_reason"] == {"type": "stop", "matched": full[start:end]}
    with pytest.raises(rl.BackendError, match="stop_regex .*anchors"):
        letters.run("^a", backend=backend)
