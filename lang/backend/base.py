"""What the interpreter asks of a backend, and the shared code of the two native-API backends.

A backend turns one program step into model calls: `generate` (a gen; with `n` > 1 it returns
the lists of the n texts and metas), `select` (score the choices), `tool_call` (a gen with
tools), `add_media` (an image or video: refused unless the model has vision support),
`cache_prefix` (make a prompt's KV cached before several requests share it: fork, run_batch).
`NativeBackend` implements them over SGLang's /generate request shape; RuntimeEndpoint sends
those requests over HTTP, EngineBackend to an in-process Engine.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from radixlm.choices import ChoiceScores, TokenEntry, choice_token_span, decide, requires_unconditional
from radixlm.formats.chat_template import CHATML, ChatTemplate
from radixlm.formats.tool_formats import tool_call_structures
from radixlm.ir import Gen, Media, SamplingArgs, Select
from radixlm.tools import ToolCall, ToolSet

if TYPE_CHECKING:
    from radixlm.interpreter import StreamExecutor

# Context for the unconditional scores of unconditional_likelihood_normalized: a bare newline,
# so every choice token (the first included) has a log-probability.
UNCONDITIONAL_PREFIX = "\n"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


class BackendError(RuntimeError):
    """A backend cannot be reached, or answered with an error."""


class NotSupportedError(BackendError, NotImplementedError):
    """The program asked for something this backend or its model cannot do (the message says what)."""


class Backend:
    chat_template: ChatTemplate = CHATML
    sends_messages = False  # True where the API takes chat messages rather than the state's text

    def describe(self) -> str:
        """The model and where it runs, for error messages."""
        return f"the {type(self).__name__} backend's model"

    def generate(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[Any, Any]:
        """(text, meta info); with sampling.n > 1, (the n texts, their n metas)."""
        raise NotImplementedError

    def generate_stream(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """(text increment, meta info on the last chunk else None) pairs; default: one chunk."""
        text, meta = self.generate(s, gen, sampling)
        yield text, meta

    def select(self, s: StreamExecutor, sel: Select) -> tuple[int, dict[str, Any]]:
        raise NotSupportedError(f"select needs the choices' log-probabilities, which {self.describe()} does not give")

    def tool_call(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs, tools: ToolSet) -> tuple[str, Any, dict[str, Any]]:
        """(text appended to the state, the variable's value: a ToolCall or the text, meta)."""
        raise NotSupportedError(f"gen(tools=...) is not supported with {self.describe()}")

    def add_media(self, s: StreamExecutor, media: Media) -> None:
        """Put an image or video into the current message. A backend for a vision model appends
        the model's media tokens to the text and records the content part for the message."""
        raise NotSupportedError(
            f"{media.kind}(): {self.describe()} has no vision support (radixlm serves text-only models: "
            f"Llama, Mistral, Qwen2, Qwen3); use a backend whose model reads {media.kind}s"
        )

    def cache_prefix(self, prompt: str) -> None:
        """Make `prompt`'s KV cached (no-op where the backend has no prefix cache)."""

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        pass


# Logprob lists whose stream chunks carry only the chunk's new entries (SGLang's streaming form).
STREAMED_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")
# The prompt's lists come whole in one chunk (ours: the first with output) or in every chunk.
INPUT_LOGPROB_KEYS = ("input_token_logprobs", "input_top_logprobs")


class NativeBackend(Backend):
    """Everything over SGLang's /generate request and result shapes."""

    _structural_tags: bool | None = None  # the server's grammar backend serves them (asked once)

    def call(self, payload: dict[str, Any]) -> Any:
        """One /generate request (non-streaming) -> its result or list of results."""
        raise NotImplementedError

    def call_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """One streaming /generate request -> partial results (text cumulative; logprob lists
        holding each chunk's new entries, as SGLang streams them)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ program steps
    def generate(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[Any, Any]:
        results = self.call(self._payload(s.text_, gen, sampling))
        if isinstance(results, list):  # n > 1: one result per sample
            results = [_checked(r) for r in results]
            return [r["text"] for r in results], [r["meta_info"] for r in results]
        result = _checked(results)
        return result["text"], result["meta_info"]

    def generate_stream(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> Iterator[tuple[str, dict[str, Any] | None]]:
        sent = ""
        last: dict[str, Any] | None = None
        logprobs: dict[str, list[Any]] = {}  # each chunk's new entries, concatenated
        for last in self.call_stream({**self._payload(s.text_, gen, sampling), "stream": True}):
            meta = last["meta_info"]
            for key in STREAMED_LOGPROB_KEYS:
                if key in meta:
                    logprobs.setdefault(key, []).extend(meta[key])
            for key in INPUT_LOGPROB_KEYS:
                if len(meta.get(key) or ()) > len(logprobs.get(key, ())):
                    logprobs[key] = meta[key]
            text = last["text"]
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :], None
                sent = text
        if last is None:
            raise BackendError("the stream ended without a result")
        _checked(last)
        final = last["text"]
        yield (final[len(sent) :] if final.startswith(sent) else ""), {**last["meta_info"], **logprobs}

    def select(self, s: StreamExecutor, sel: Select) -> tuple[int, dict[str, Any]]:
        scores = self.score_choices(s.text_, sel.choices, requires_unconditional(sel.choices_method))
        return decide(sel.choices, scores, sel.choices_method, sel.temperature)

    def tool_call(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs, tools: ToolSet) -> tuple[str, Any, dict[str, Any]]:
        mode = tools.choose(gen.tool_choice)
        if isinstance(mode, str):  # "auto" / "none": free text, parsed for a call under "auto"
            if mode == "auto" and sampling.regex is None and sampling.json_schema is None and sampling.ebnf is None \
                    and self._serves_structural_tags():  # each <tool_call> the model opens is well formed
                sampling = replace(sampling, structural_tag=json.dumps(tool_call_structures(tools.tools)))
            text, meta = self.generate(s, gen, sampling)
            return text, (parse_call(text, tools) if mode == "auto" else None) or text, meta
        schema = json.dumps(tools.schema(mode))
        forced = SamplingArgs(**{**vars(sampling), "regex": None, "ebnf": None, "json_schema": schema})
        result = _checked(self.call(self._payload(s.text_ + TOOL_CALL_OPEN, gen, forced)))
        raw = result["text"]
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            reason = result["meta_info"].get("finish_reason")
            raise BackendError(f"the tool call is not complete JSON (finish_reason {reason}); raise max_tokens: {raw!r}") from e
        call = ToolCall(value["name"], value["arguments"])
        problem = tools.validate(call)
        if problem is not None:
            raise BackendError(f"the generated tool call does not validate: {problem}")
        return f"{TOOL_CALL_OPEN}{raw}{TOOL_CALL_CLOSE}", call, result["meta_info"]

    def _serves_structural_tags(self) -> bool:
        """True when the server's grammar backend constrains structural tags (xgrammar, llguidance)."""
        if self._structural_tags is None:
            self._structural_tags = self.get_server_info().get("grammar_backend") in ("xgrammar", "llguidance")
        return self._structural_tags

    def cache_prefix(self, prompt: str) -> None:
        if prompt:
            self.call({"text": prompt, "sampling_params": {"max_new_tokens": 0}})

    # ------------------------------------------------------------------ scoring
    def score_choices(self, prompt: str, choices: list[str], unconditional: bool) -> ChoiceScores:
        """Each choice's token log-probabilities after `prompt`: the prompt is prefilled (and
        cached) once, then all choices go in one batched request that reuses it."""
        start = 0
        if prompt:
            prefix = self.call({"text": prompt, "sampling_params": {"max_new_tokens": 0}})
            start = max(prefix["meta_info"]["prompt_tokens"] - 1, 0)  # the boundary token may re-tokenize
        results = self._score([prompt + c for c in choices], start)
        entries = [_choice_entries(r, c) for r, c in zip(results, choices)]
        scores = ChoiceScores(
            [[float(e[0]) for e in choice] for choice in entries],
            prompt_tokens=max(r["meta_info"]["prompt_tokens"] for r in results),
            cached_tokens=min(r["meta_info"]["cached_tokens"] for r in results),
            token_entries=entries,
        )
        if unconditional:
            plain = self._score([UNCONDITIONAL_PREFIX + c for c in choices], 0)
            scores.unconditional_entries = [_choice_entries(r, c) for r, c in zip(plain, choices)]
            scores.unconditional_logprobs = [[float(e[0]) for e in choice] for choice in scores.unconditional_entries]
        return scores

    def _score(self, texts: list[str], start: int) -> list[dict[str, Any]]:
        return list(self.call({
            "text": texts,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "return_text_in_logprobs": True,
        }))

    @staticmethod
    def _payload(prompt: str, gen: Gen, sampling: SamplingArgs) -> dict[str, Any]:
        payload: dict[str, Any] = {"text": prompt, "sampling_params": sampling.to_native()}
        if gen.require_reasoning:
            payload["require_reasoning"] = True
        if gen.return_logprob:
            payload["return_logprob"] = True
            payload["logprob_start_len"] = -1 if gen.logprob_start_len is None else gen.logprob_start_len
            payload["top_logprobs_num"] = gen.top_logprobs_num or 0
            payload["return_text_in_logprobs"] = gen.return_text_in_logprobs
        return payload


def _checked(result: dict[str, Any]) -> dict[str, Any]:
    """`result`, unless the request was aborted (a bad grammar, an abort): then its reason."""
    reason = result["meta_info"].get("finish_reason") or {}
    if reason.get("type") == "abort":
        raise BackendError(f"the request was aborted: {reason.get('message') or 'no reason given'}")
    return result


def _choice_entries(result: dict[str, Any], choice: str) -> list[TokenEntry]:
    """The [logprob, token_id, token_text] entries of the tokens that spell `choice`."""
    entries = result["meta_info"]["input_token_logprobs"]
    span = choice_token_span([e[2] if len(e) > 2 and e[2] is not None else "" for e in entries], choice)
    return [list(e) for e in entries[-span:] if e[0] is not None]


def import_client(module: str, backend: str, extra: str) -> Any:
    """The optional client package a backend speaks through; ImportError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"radixlm.{backend} needs the {module} package: pip install radixlm[{extra}]") from e


def chat_messages(s: StreamExecutor, api: str) -> list[dict[str, Any]]:
    """The state's finished messages, for a chat API: the gen must open an assistant message."""
    if s.cur_role != "assistant":
        where = f"in a {s.cur_role!r} role" if s.cur_role else "outside any role"
        raise ValueError(
            f"on the {api} a gen must sit inside an assistant role, as in s += assistant(gen(...)); this one is {where}"
        )
    if s.text_[s.cur_role_begin :]:
        raise ValueError(
            f"on the {api} a gen must open its assistant message: the API cannot continue text already in it "
            f"({s.text_[s.cur_role_begin :][:60]!r}); move that text into the user message"
        )
    return [dict(m) for m in s.messages_]


def refuse_unsupported(sampling: SamplingArgs, gen: Gen, api: str, supported: set[str]) -> None:
    """NotSupportedError naming the gen arguments `api` cannot express (SamplingArgs fields
    outside `supported`, logprobs, tools)."""
    unsupported = sorted(k for k, v in vars(sampling).items() if v is not None and k not in supported)
    if gen.return_logprob:
        unsupported.append("return_logprob")
    if unsupported:
        raise NotSupportedError(f"the {api} cannot express gen({', '.join(unsupported)}=...)")


def parse_call(text: str, tools: ToolSet) -> ToolCall | None:
    """The first valid tool call in free text (Hermes blocks or a bare JSON call), else None."""
    from radixlm.formats.tool_formats import parse_tool_calls

    _, calls = parse_tool_calls(text, tools.names)
    for found in calls:
        call = ToolCall(found.name, json.loads(found.arguments))
        if tools.validate(call) is None:
            return call
    return None
