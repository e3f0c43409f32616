"""Reasoning separation (radixlm.formats.reasoning): the formats' rules on whole texts, and the streaming
splitter, which must agree with them however the text is cut into pieces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.formats.reasoning import (
    REASONING_PARSERS,
    ReasoningStream,
    UnknownReasoningParser,
    reasoning_format,
    separate_reasoning,
)


@pytest.mark.parametrize(("parser", "text", "expected"), [
    ("deepseek-r1", "Two and two.</think>It is 4.", ("Two and two.", "It is 4.")),
    ("deepseek-r1", "<think>Two and two.</think>It is 4.", ("Two and two.", "It is 4.")),  # R1-0528 opens it
    ("deepseek-r1", "Cut off before the end", ("Cut off before the end", "")),
    ("deepseek-r1", "a</think>b</think>c", ("a", "b</think>c")),  # the first end marker ends it
    ("qwen3", "<think>\nTwo and two.\n</think>\n\nIt is 4.", ("\nTwo and two.\n", "\n\nIt is 4.")),
    ("qwen3", "\n <think>r</think>a", ("r", "a")),  # whitespace before the opening marker is dropped
    ("qwen3", "It is 4.", ("", "It is 4.")),  # no opening marker: all answer
    ("qwen3", "It is <think>4</think>.", ("", "It is <think>4</think>.")),  # a marker later is text
    ("qwen3", "<think>cut off", ("cut off", "")),
    ("qwen3-thinking", "r</think>a", ("r", "a")),
    ("kimi", "\u25c1think\u25b7r\u25c1/think\u25b7a", ("r", "a")),
    ("kimi", "<think>r</think>a", ("", "<think>r</think>a")),
])
def test_whole_texts(parser: str, text: str, expected: tuple[str, str]) -> None:
    assert separate_reasoning(text, parser) == expected


def test_an_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(UnknownReasoningParser, match=r"unknown reasoning parser 'deepseek'; known parsers: deepseek-r1, "):
        reasoning_format("deepseek")
    with pytest.raises(ValueError, match="unknown reasoning parser None"):
        separate_reasoning("x", None)  # type: ignore[arg-type]


def test_no_marker_is_split_across_deltas() -> None:
    stream = ReasoningStream(reasoning_format("deepseek-r1"))
    assert stream.feed("Two</") == ("Two", "")  # "</" may begin "</think>": held
    assert stream.feed("thi") == ("", "")
    assert not stream.is_reasoning_over
    assert stream.feed("nk>It") == ("", "It")
    assert stream.is_reasoning_over
    assert stream.feed(" is</") == ("", " is</")  # after the reasoning nothing is held
    assert stream.finish() == ("", "")


def test_unstreamed_reasoning_comes_at_once_with_its_end() -> None:
    stream = ReasoningStream(reasoning_format("qwen3"), stream_reasoning=False)
    assert stream.feed("<think>Two") == ("", "")
    assert stream.feed(" and two.</th") == ("", "")
    assert stream.feed("ink>It is 4.") == ("Two and two.", "It is 4.")
    cut = ReasoningStream(reasoning_format("deepseek-r1"), stream_reasoning=False)
    assert cut.feed("never ends </th") == ("", "")
    assert cut.finish() == ("never ends </th", "")  # the held reasoning is not lost


def test_only_so_much_leading_whitespace_is_looked_past() -> None:
    assert separate_reasoning(" " * 256 + "<think>r</think>a", "qwen3") == ("r", "a")
    assert separate_reasoning(" " * 257 + "<think>r</think>a", "qwen3") == ("", " " * 257 + "<think>r</think>a")
    stream = ReasoningStream(reasoning_format("qwen3"))
    assert stream.feed(" " * 200) == ("", "")
    assert stream.feed(" " * 57) == ("", " " * 257)  # no longer held


PIECES = ["<think>", "</think>", "<", "</", "think", ">", " ", "\n", " " * 100, "a", "Two", "\u25c1think\u25b7", "\u25c1/think\u25b7"]


@given(st.lists(st.sampled_from(PIECES), max_size=12), st.lists(st.integers(0, 400), max_size=6),
       st.sampled_from(REASONING_PARSERS), st.booleans())
def test_streamed_deltas_add_up_to_the_whole_split(parts: list[str], cuts: list[int], parser: str,
                                                   stream_reasoning: bool) -> None:
    text = "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    stream = ReasoningStream(reasoning_format(parser), stream_reasoning)
    reasoning, answer = "", ""
    for start, stop in zip(bounds, bounds[1:]):
        r, a = stream.feed(text[start:stop])
        assert not (a and not stream.is_reasoning_over)  # no answer text while the reasoning runs
        if not stream_reasoning and not stream.is_reasoning_over:
            assert r == ""  # unstreamed reasoning waits for its end
        reasoning, answer = reasoning + r, answer + a
    r, a = stream.finish()
    assert (reasoning + r, answer + a) == separate_reasoning(text, parser)
