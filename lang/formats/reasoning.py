"""Reasoning separation: a reasoning model writes `<think>reasoning</think>answer`, and the two
parts are handed back apart (OpenAI's `reasoning_content` / `content`, the language's
`{name}_reasoning_content` / `{name}`). Pure functions over text, no I/O: shared by the server
(`--reasoning-parser`, POST /separate_reasoning, the chat API) and the language
(`separate_reasoning`).

The formats (SGLang's parser names):
- `deepseek-r1`: the output starts inside the reasoning (DeepSeek-R1's chat template opens it
  in the prompt); a leading `<think>` is dropped if the model writes one anyway (R1-0528 does);
  everything up to the first `</think>` is reasoning;
- `qwen3`: reasoning only when the output opens with `<think>` (leading whitespace aside);
  otherwise the whole output is the answer;
- `qwen3-thinking`: `qwen3` for models that always think (the template opens the reasoning);
- `kimi`: `qwen3` with Kimi's markers `◁think▷` ... `◁/think▷`.

Contract (both ways of splitting agree, whatever the pieces, `ReasoningStream`): an output cut
off before the end marker is all reasoning (once inside); text after the first end marker is
the answer, later markers included; nothing is stripped but the markers and the whitespace before
an opening marker (at most MAX_LEADING_WHITESPACE characters of it: past that the output has no
opening marker, so a stream of blanks is not held back).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str  # the marker that opens the reasoning
    end: str  # the marker that closes it
    starts_inside: bool  # the output begins inside the reasoning: no opening marker needed


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    f.name: f for f in (
        ReasoningFormat("deepseek-r1", "<think>", "</think>", starts_inside=True),
        ReasoningFormat("qwen3", "<think>", "</think>", starts_inside=False),
        ReasoningFormat("qwen3-thinking", "<think>", "</think>", starts_inside=True),
        ReasoningFormat("kimi", "\u25c1think\u25b7", "\u25c1/think\u25b7", starts_inside=False),
    )
}
REASONING_PARSERS = tuple(sorted(REASONING_FORMATS))
MAX_LEADING_WHITESPACE = 256


class UnknownReasoningParser(ValueError):
    """A parser name that is not one of REASONING_PARSERS (the server answers 400)."""


def reasoning_format(name: object) -> ReasoningFormat:
    """The format called `name`; UnknownReasoningParser naming the known ones otherwise."""
    fmt = REASONING_FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise UnknownReasoningParser(f"unknown reasoning parser {name!r}; known parsers: {', '.join(REASONING_PARSERS)}")
    return fmt


def separate_reasoning(text: str, fmt: ReasoningFormat | str) -> tuple[str, str]:
    """(reasoning, answer) of a whole output, in format `fmt` (or the format of that name)."""
    stream = ReasoningStream(fmt if isinstance(fmt, ReasoningFormat) else reasoning_format(fmt))
    reasoning, answer = stream.feed(text)
    rest_reasoning, rest_answer = stream.finish()
    return reasoning + rest_reasoning, answer + rest_answer


_OPENING, _INSIDE, _ANSWER = "opening", "inside", "answer"


class ReasoningStream:
    """Splits an output that arrives in pieces: `feed(piece)` -> (reasoning, answer) text new
    with it, `finish()` -> what was held back. Text that may be the start of a marker is held
    until the next piece decides it (so no marker is ever split across two deltas). With
    `stream_reasoning=False` the reasoning is held whole and comes out at once with the end
    marker (or at `finish` if the output ends inside it), as SGLang's `stream_reasoning`.
    The concatenated deltas equal `separate_reasoning` of the concatenated pieces."""

    def __init__(self, fmt: ReasoningFormat, stream_reasoning: bool = True):
        self.fmt = fmt
        self.stream_reasoning = stream_reasoning
        self._state = _OPENING  # not yet known whether an opening marker comes
        self._pending = ""  # text held back (it may begin a marker)
        self._held_reasoning = ""  # stream_reasoning=False: the reasoning so far

    @property
    def is_reasoning_over(self) -> bool:
        return self._state == _ANSWER

    def feed(self, piece: str) -> tuple[str, str]:
        text = self._pending + piece
        self._pending = ""
        if self._state == _OPENING:
            stripped = text.lstrip()
            looked_past = len(text) - len(stripped) <= MAX_LEADING_WHITESPACE
            if looked_past and stripped.startswith(self.fmt.start):
                self._state, text = _INSIDE, stripped[len(self.fmt.start):]
            elif looked_past and self.fmt.start.startswith(stripped):  # a prefix of the marker, or only whitespace
                self._pending = text
                return "", ""
            else:
                self._state = _INSIDE if self.fmt.starts_inside else _ANSWER
        if self._state == _ANSWER:
            return "", text
        at = text.find(self.fmt.end)
        if at >= 0:
            self._state = _ANSWER
            return self._reasoning(text[:at], last=True), text[at + len(self.fmt.end):]
        keep = _marker_prefix_len(text, self.fmt.end)
        self._pending = text[len(text) - keep:]
        return self._reasoning(text[: len(text) - keep], last=False), ""

    def finish(self) -> tuple[str, str]:
        """The text held back: a partial marker is plain text of the part it was in."""
        text, self._pending = self._pending, ""
        if self._state == _OPENING:
            self._state = _INSIDE if self.fmt.starts_inside else _ANSWER
        if self._state == _ANSWER:
            return "", text
        return self._reasoning(text, last=True), ""

    def _reasoning(self, text: str, last: bool) -> str:
        if self.stream_reasoning:
            return text
        self._held_reasoning += text
        if not last:
            return ""
        out, self._held_reasoning = self._held_reasoning, ""
        return out


def _marker_prefix_len(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[len(text) - size:]):
            return size
    return 0
