"""Result shaping, the same for the Engine and the server: a request's outputs arrive as deltas
(`StrOutput`: new text, new token ids, new logprob entries) and leave as SGLang's /generate
result dicts.

`RequestOutput` appends each delta once (rendering logprob entries, with their token text when
asked, as they arrive), so the cost of an update does not grow with the output's length. A
reader takes what accumulated since its previous take (`take_chunk`): a slow reader gets the
pending deltas coalesced into one chunk, never a queue of snapshots.

Stream chunks have SGLang's streaming form: `text` and `output_ids` are cumulative, while
`meta_info["output_token_logprobs"]` and `["output_top_logprobs"]` hold the chunk's new entries
only and `["output_token_logprobs_length"]` the running count. The input logprob lists are sent
the same way (new entries only: in practice all of them in the first chunk, since the prompt is
read before the first token is sampled), so no chunk repeats the prompt's logprobs. With
`incremental` (SGLang's `--incremental-streaming-output`), `text` and `output_ids` hold only the
chunk's new text and ids too, so no chunk grows with the output. The final result of a request
that is not streamed holds every list whole.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.api.request_io import GenerateRequest
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.ipc.messages import LOGPROB_LISTS, LogprobEntries, SpecCounts, StrOutput

MIN_LOGPROB = -9999.0
# Keys whose stream chunks carry only new entries (the sglang frontend concatenates them).
INCREMENTAL_META_KEYS = ("output_token_logprobs", "output_top_logprobs")


def json_logprob(logprob: float | None) -> float | None:
    """A logprob as JSON can carry it: -inf (a token a grammar mask or min_new_tokens ruled out,
    listed among the top logprobs when fewer tokens are allowed than asked for) becomes
    MIN_LOGPROB, as vLLM reports it; NaN becomes null."""
    if logprob is None or math.isfinite(logprob):
        return logprob
    return MIN_LOGPROB if logprob < 0 else None


class TokenTexts:
    """Token id -> its text alone (`decode([id])`, special tokens kept), memoized: rendering a
    logprob entry's text costs a dict lookup after a token's first appearance."""

    def __init__(self, decode: Callable[..., str]):
        self._decode = decode
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._decode([token_id], skip_special_tokens=False)
        return text


@dataclass(frozen=True)
class OutputOptions:
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False


@dataclass(frozen=True)
class OutputChunk:
    """What a reader takes: the /generate dict (stream form when streaming, else the full
    result) and the text new since the reader's previous chunk."""

    result: dict[str, Any]
    new_text: str
    is_finished: bool
    # new_text as its deltas brought it, in order ("".join(new_pieces) == new_text): how many
    # pieces a chunk holds depends on when the reader woke, what each piece holds does not, so a
    # reader whose output must not depend on its timing (tool-call argument fragments) reads them
    new_pieces: tuple[str, ...] = ()

    @property
    def meta_info(self) -> dict[str, Any]:
        return self.result["meta_info"]


class RequestOutput:
    """One request's outputs so far; see the module docstring."""

    def __init__(self, rid: str, options: OutputOptions, stream: bool, token_text: TokenTexts | None,
                 incremental: bool = False, grammar_backend: str | None = None, schema_stricter: tuple[str, ...] = ()):
        """`grammar_backend`: the engine the door chose for the request's grammar (None: none),
        reported as `meta_info["grammar_backend"]`; `schema_stricter`: the JSON schema's keywords
        it served by a stricter rewrite (`constrained.schema_notes`), as `meta_info["schema_stricter"]`."""
        self.rid = rid
        self.grammar_backend = grammar_backend
        self.schema_stricter = schema_stricter
        self.options = options
        self.stream = stream
        self.incremental = incremental and stream
        self._token_text = token_text if options.return_text_in_logprobs else None
        self._text_taken = ""  # the text given to the reader so far
        self._text_pending: list[str] = []  # text deltas since then
        self.output_ids: list[int] = []
        self._num_ids_taken = 0
        self.finish_reason: dict[str, Any] | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.spec: SpecCounts | None = None  # speculative decoding's counts, when on
        self.logprobs: dict[str, list[Any]] = {name: [] for name in self._lists()}
        self._num_logprobs_taken = dict.fromkeys(self.logprobs, 0)
        self.num_updates = 0  # deltas received
        self._num_updates_taken = 0
        self.created = time.perf_counter()

    @classmethod
    def of(cls, rid: str, request: GenerateRequest, token_text: TokenTexts, incremental: bool = False,
           grammar: LoweredGrammar | None = None) -> RequestOutput:
        """The output of a request taken at the door (both doors make it this way); `grammar`:
        its grammar as the door lowered it (the engine and what it served stricter are reported)."""
        options = OutputOptions(request.return_logprob, request.top_logprobs_num, request.return_text_in_logprobs)
        if grammar is None:
            return cls(rid, options, request.stream, token_text, incremental)
        return cls(rid, options, request.stream, token_text, incremental, grammar.backend, grammar.stricter)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def has_update(self) -> bool:
        """Whether a delta arrived that the reader has not taken."""
        return self.num_updates > self._num_updates_taken

    @property
    def text(self) -> str:
        return self._text_taken + "".join(self._text_pending)

    def add(self, out: StrOutput) -> None:
        """Append one delta (the detokenizer's, or the Engine's from its own step)."""
        if out.new_text:
            self._text_pending.append(out.new_text)
        self.output_ids.extend(out.new_token_ids)
        self.finish_reason = out.finish_reason
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = (
            out.prompt_tokens, out.completion_tokens, out.cached_tokens
        )
        if out.spec is not None:
            self.spec = out.spec
        if out.logprobs is not None and self.options.return_logprob:
            self._add_logprobs(out.logprobs)
        self.num_updates += 1

    def _add_logprobs(self, entries: LogprobEntries) -> None:
        render = self._render
        self.logprobs["input_token_logprobs"].extend(render(e) for e in entries.input_token_logprobs)
        self.logprobs["output_token_logprobs"].extend(render(e) for e in entries.output_token_logprobs)
        if self.options.top_logprobs_num > 0:
            self.logprobs["input_top_logprobs"].extend(
                None if row is None else [render(e) for e in row] for row in entries.input_top_logprobs
            )
            self.logprobs["output_top_logprobs"].extend([render(e) for e in row] for row in entries.output_top_logprobs)

    def _render(self, entry: tuple[float | None, int]) -> list[Any]:
        """SGLang's `[logprob, token_id, text-or-null]`, with a JSON-safe logprob."""
        logprob, token_id = entry
        return [json_logprob(logprob), token_id, None if self._token_text is None else self._token_text(token_id)]

    def take_chunk(self) -> OutputChunk:
        """The result as of now, and the text new since the previous take (see the docstring)."""
        pieces = tuple(self._text_pending)
        new_text = "".join(pieces)
        self._text_pending.clear()
        self._text_taken += new_text
        self._num_updates_taken = self.num_updates
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "e2e_latency": time.perf_counter() - self.created,
        }
        if self.grammar_backend is not None:
            meta["grammar_backend"] = self.grammar_backend
        if self.schema_stricter:
            meta["schema_stricter"] = list(self.schema_stricter)
        if self.spec is not None:  # SGLang's names; accept length: output tokens per verify step
            meta.update(dataclasses.asdict(self.spec))
            meta["spec_accept_length"] = self.completion_tokens / max(1, self.spec.spec_verify_ct)
        if self.options.return_logprob:
            meta.update(self._new_logprobs() if self.stream else self.logprobs)
            if self.stream:
                meta["output_token_logprobs_length"] = len(self.logprobs["output_token_logprobs"])
        if self.incremental:
            text, ids = new_text, self.output_ids[self._num_ids_taken :]
        else:
            text, ids = self._text_taken, list(self.output_ids)
        self._num_ids_taken = len(self.output_ids)
        result = {"text": text, "output_ids": ids, "meta_info": meta}
        return OutputChunk(result, new_text, self.is_finished, pieces)

    def _lists(self) -> tuple[str, ...]:
        if self.options.top_logprobs_num > 0:
            return LOGPROB_LISTS
        return ("input_token_logprobs", "output_token_logprobs")

    def _new_logprobs(self) -> dict[str, list[Any]]:
        out = {}
        for name, entries in self.logprobs.items():
            out[name] = entries[self._num_logprobs_taken[name] :]
            self._num_logprobs_taken[name] = len(entries)
        return out
