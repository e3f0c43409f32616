"""IncrementalDecoder: streamed deltas equal one whole decode, whole characters only, stop strings.

Uses the real SmolLM2 tokenizer (byte-level BPE, 49k vocab) and a tiny byte-level BPE trained
here, whose small vocab splits most multi-byte characters into single-byte tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from radixlm_testing import first_regex_match

from radixlm.runtime.detokenizer.detokenizer import IncrementalDecoder
from radixlm.runtime.model.model_files import resolve_model_path
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

MULTIBYTE_TEXT = "héllo 世界 🎉🎉 naïve Ωmega — café ½ 日本語 👩\u200d💻"
FFFD = "\ufffd"
IM_END = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return Tokenizer(resolve_model_path(None))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A 300-token byte-level BPE (GPT-2 style) trained on a few lines, saved and loaded like a model's."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    )
    corpus = ["hello world, how are you?", "the quick brown fox", MULTIBYTE_TEXT, "ab ba abab a b"] * 20
    raw.train_from_iterator(corpus, trainer)
    path: Path = tmp_path_factory.mktemp("tiny_tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>").save_pretrained(str(path))
    return Tokenizer(path)


def stream(
    tok: Tokenizer, ids: Sequence[int], params: SamplingParams, chunks: Sequence[int] = (1,), **kw: object
) -> tuple[IncrementalDecoder, list[str]]:
    """Push `ids` in chunks of the given sizes (cycled), then finish; return decoder and deltas."""
    dec = IncrementalDecoder(tok, params, **kw)  # type: ignore[arg-type]
    deltas, pos, i = [], 0, 0
    while pos < len(ids):
        n = chunks[i % len(chunks)]
        deltas.append(dec.push(ids[pos : pos + n]))
        pos, i = pos + n, i + 1
    deltas.append(dec.finish())
    return dec, deltas


def reference_stop(text: str, stops: Sequence[str], no_stop_trim: bool) -> tuple[str, str | None]:
    """Char-by-char spec: the stop that ends first (the longer on a tie) cuts the text."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)
            return (text[:end] if no_stop_trim else text[: end - len(stop)]), stop
    return text, None


# ---------------------------------------------------------------- equal to one decode


def multibyte_ids(tok: Tokenizer) -> list[int]:
    return sorted(set(tok.encode(MULTIBYTE_TEXT) + tok.encode("Ünïcödé ñ ü ß 漢字 🙂🚀 ok")))


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@settings(max_examples=150)
@given(data=st.data(), chunks=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_deltas_concatenate_to_whole_decode(
    smol: Tokenizer, skip_special_tokens: bool, data: st.DataObject, chunks: list[int]
) -> None:
    """Random ids from the real vocab, biased toward pieces of multi-byte characters and specials."""
    pieces = st.sampled_from(multibyte_ids(smol))
    one_id = st.one_of(pieces, pieces, st.integers(0, smol.vocab_size - 1), st.sampled_from([0, 1, IM_END]))
    ids = data.draw(st.lists(one_id, max_size=30))
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    expected = smol.decode(ids, skip_special_tokens=skip_special_tokens)
    dec, deltas = stream(smol, ids, params, chunks)
    emitted = ""
    for delta in deltas[:-1]:  # mid-stream text is final: always a prefix of the whole decode
        emitted += delta
        assert expected.startswith(emitted)
    assert "".join(deltas) == dec.text == expected
    assert not dec.stopped and dec.matched_stop is None


@settings(max_examples=100)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab éï世界🎉ß½\n")), max_size=25),
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    tokenizer_name=st.sampled_from(["smol", "tiny"]),
)
def test_valid_text_never_streams_replacement_char(
    smol: Tokenizer, tiny: Tokenizer, text: str, chunks: list[int], tokenizer_name: str
) -> None:
    tok = smol if tokenizer_name == "smol" else tiny
    dec, deltas = stream(tok, tok.encode(text), SamplingParams(), chunks)
    assert all(FFFD not in d for d in deltas)
    assert "".join(deltas) == text


def test_split_characters_are_held_until_complete(smol: Tokenizer, tiny: Tokenizer) -> None:
    for tok in (smol, tiny):
        ids = tok.encode(MULTIBYTE_TEXT)
        assert any(FFFD in tok.decode([i]) for i in ids)  # precondition: some tokens split characters
        dec, deltas = stream(tok, ids, SamplingParams())
        assert "".join(deltas) == MULTIBYTE_TEXT and all(FFFD not in d for d in deltas)
        assert "" in deltas[:-1]  # something was held back mid-stream


def test_incomplete_tail_at_finish_is_replaced_like_decode(smol: Tokenizer) -> None:
    ids = smol.encode("ok 🎉")[:-1]  # drop the emoji's last byte-token
    dec = IncrementalDecoder(smol, SamplingParams())
    assert "".join(dec.push([i]) for i in ids) == "ok"  # " " and the partial emoji decode together
    assert dec.finish() == smol.decode(ids)[2:] and dec.text == smol.decode(ids) and dec.text[-1] == FFFD


def test_prompt_context_does_not_change_output(smol: Tokenizer) -> None:
    prompt = smol.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    out = smol.encode(" Hello there, 世界!") + [IM_END]
    for skip in (True, False):
        _, deltas = stream(smol, out, SamplingParams(skip_special_tokens=skip), prompt_ids_tail=prompt)
        assert "".join(deltas) == smol.decode(out, skip_special_tokens=skip)
    # a prompt that ends inside a character gives no clean boundary and is ignored
    split_char = smol.encode("世")
    assert len(split_char) == 2
    out = split_char[1:] + smol.encode(" ok")
    _, deltas = stream(smol, out, SamplingParams(), prompt_ids_tail=split_char[:1])
    assert "".join(deltas) == smol.decode(out) == FFFD + " ok"


def test_skip_special_tokens_false_keeps_im_end(smol: Tokenizer) -> None:
    ids = smol.encode("Hi there") + [IM_END]
    assert "".join(stream(smol, ids, SamplingParams(skip_special_tokens=False))[1]) == "Hi there<|im_end|>"
    assert "".join(stream(smol, ids, SamplingParams(skip_special_tokens=True))[1]) == "Hi there"
    dec, _ = stream(smol, ids, SamplingParams(skip_special_tokens=False, stop=("<|im_end|>",)))
    assert dec.stopped and dec.text == "Hi there"


def test_decode_window_stays_small(smol: Tokenizer) -> None:
    """O(window) per push: the ids handed to decode stay few however long the output."""

    class Recording:
        def __init__(self) -> None:
            self.max_len = 0

        def decode(self, ids: list[int], **kw: bool) -> str:
            self.max_len = max(self.max_len, len(ids))
            return smol.decode(ids, **kw)

    rec = Recording()
    ids = smol.encode(MULTIBYTE_TEXT * 40)
    _, deltas = stream(rec, ids, SamplingParams(stop=("never seen",)))  # type: ignore[arg-type]
    assert "".join(deltas) == MULTIBYTE_TEXT * 40
    assert len(ids) > 500 and rec.max_len <= 8


# ---------------------------------------------------------------- stop strings

TEXT = "Hello world, how are you?"


def run_stop(
    tok: Tokenizer, text: str, *stops: str, no_stop_trim: bool = False
) -> tuple[IncrementalDecoder, list[str]]:
    return stream(tok, tok.encode(text), SamplingParams(stop=stops, no_stop_trim=no_stop_trim))


def test_stop_inside_one_token(smol: Tokenizer) -> None:
    assert " world" in [smol.decode([i]) for i in smol.encode(TEXT)]
    dec, deltas = run_stop(smol, TEXT, "orl")
    assert dec.stopped and dec.matched_stop == "orl" and dec.text == "".join(deltas) == "Hello w"


def test_stop_spanning_tokens(smol: Tokenizer) -> None:
    ids = smol.encode(TEXT)
    assert not any("d, h" in smol.decode([i]) for i in ids)
    dec, deltas = run_stop(smol, TEXT, "world, how")
    assert dec.matched_stop == "world, how" and "".join(deltas) == "Hello "
    # a stop that begins inside text held back for an incomplete character
    dec, _ = run_stop(smol, MULTIBYTE_TEXT, "界 🎉")
    assert dec.stopped and dec.text == "héllo 世"


def test_stop_at_very_start(smol: Tokenizer) -> None:
    dec, deltas = run_stop(smol, TEXT, "Hello")
    assert dec.stopped and dec.text == "" and set(deltas) == {""}
    dec, _ = run_stop(smol, TEXT, "Hello", no_stop_trim=True)
    assert dec.text == "Hello"


def test_earliest_stop_wins_regardless_of_order(smol: Tokenizer) -> None:
    for stops in (("you", "world"), ("world", "you")):
        dec, _ = run_stop(smol, TEXT, *stops)
        assert dec.matched_stop == "world" and dec.text == "Hello "
    # overlapping stops: the one completed first wins, as if the text arrived char by char
    dec, _ = run_stop(smol, TEXT, "how are you", "are")
    assert dec.matched_stop == "are" and dec.text == "Hello world, how "
    dec, _ = run_stop(smol, TEXT, "are", "how are")  # same end: the longer
    assert dec.matched_stop == "how are" and dec.text == "Hello world, "


def test_stop_never_completed_is_released(smol: Tokenizer) -> None:
    ids = smol.encode("Hello wor")
    dec = IncrementalDecoder(smol, SamplingParams(stop=("world",)))
    streamed = "".join(dec.push([i]) for i in ids)
    assert streamed == "Hello "  # "wor" might still become "world"
    assert dec.finish() == "wor" and dec.text == "Hello wor" and not dec.stopped
    # a held-back prefix is released as soon as the next text rules it out
    dec = IncrementalDecoder(smol, SamplingParams(stop=("you!",)))
    deltas = [dec.push([i]) for i in smol.encode(TEXT)]
    assert deltas[-2:] == [" ", "you?"]
    assert "".join(deltas) == TEXT and dec.finish() == ""


def test_no_stop_trim_keeps_stop_and_drops_the_rest(smol: Tokenizer) -> None:
    dec, deltas = run_stop(smol, TEXT, "world", no_stop_trim=True)
    assert dec.stopped and dec.text == "".join(deltas) == "Hello world"
    assert dec.push(smol.encode(" more")) == "" and dec.finish() == "" and dec.text == "Hello world"


@settings(max_examples=200)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab é🎉")), max_size=20),
    stops=st.lists(st.text(alphabet=st.sampled_from(list("ab é🎉")), min_size=1, max_size=4), max_size=3),
    no_stop_trim=st.booleans(),
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
)
def test_stop_streaming_matches_char_by_char_spec(
    tiny: Tokenizer, text: str, stops: list[str], no_stop_trim: bool, chunks: list[int]
) -> None:
    ids = tiny.encode(text)
    assert tiny.decode(ids) == text
    expected, expected_stop = reference_stop(text, stops, no_stop_trim)
    dec, deltas = stream(tiny, ids, SamplingParams(stop=tuple(stops), no_stop_trim=no_stop_trim), chunks)
    assert (dec.text, dec.matched_stop, dec.stopped) == (expected, expected_stop, expected_stop is not None)
    assert "".join(deltas) == expected


@settings(max_examples=200)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab é🎉")), max_size=20),
    stops=st.lists(st.text(alphabet=st.sampled_from(list("ab é🎉")), min_size=1, max_size=4), max_size=3),
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
)
def test_streaming_never_leaks_a_partial_stop(
    tiny: Tokenizer, text: str, stops: list[str], chunks: list[int]
) -> None:
    """After each push, whatever text comes next, the emitted text stays a prefix of the final output."""
    ids = tiny.encode(text)
    dec = IncrementalDecoder(tiny, SamplingParams(stop=tuple(stops)))
    pos = 0
    for n in chunks * len(ids):
        if pos >= len(ids) or dec.stopped:
            break
        dec.push(ids[pos : pos + n])
        pos += n
        so_far = tiny.decode(ids[:pos]).rstrip(FFFD)
        continuations = [s[k:] for s in stops for k in range(1, len(s)) if so_far.endswith(s[:k])]
        for rest in continuations:
            assert reference_stop(so_far + rest, stops, no_stop_trim=False)[0].startswith(dec.text)
        assert reference_stop(text, stops, no_stop_trim=False)[0].startswith(dec.text)


# ---------------------------------------------------------------- regex stops (stop_regex)

REGEXES = ["a+b", "b[ é]", "é+a", "(ab|ba)", "a{2}", "🎉.", "[^a ]b"]


def reference_regex_stop(
    text: str, stops: Sequence[str], regexes: Sequence[str], no_stop_trim: bool
) -> tuple[str, str | None]:
    """Char-by-char spec: at the first end where a stop string or a match of a regex ends, the
    longest of them (a stop string on a tie) cuts the text."""
    for end in range(1, len(text) + 1):
        hits = [(len(s), 1, s) for s in stops if text[:end].endswith(s)]
        for pattern in regexes:
            match = first_regex_match(text[:end], pattern)
            if match is not None and match[1] == end:
                hits.append((end - match[0], 0, text[match[0] : end]))
        if hits:
            matched = max(hits)[2]
            return (text[:end] if no_stop_trim else text[: end - len(matched)]), matched
    return text, None


def test_stop_regex_cuts_before_the_match(smol: Tokenizer) -> None:
    params = SamplingParams(stop_regex=r"w\w+,")
    dec, deltas = stream(smol, smol.encode(TEXT), params)
    assert dec.stopped and dec.matched_stop == "world," and dec.text == "".join(deltas) == "Hello "
    dec, _ = stream(smol, smol.encode(TEXT), SamplingParams(stop_regex=[r"h\w+", "d, x"], no_stop_trim=True))
    assert dec.matched_stop == "ho" and dec.text == "Hello world, ho"  # stops as soon as a match ends
    dec, _ = stream(smol, smol.encode(TEXT), SamplingParams(stop_regex=r"\d"))
    assert not dec.stopped and dec.text == TEXT  # never matched: everything released at finish


def test_stop_regex_competes_with_stop_strings_by_where_it_ends(smol: Tokenizer) -> None:
    dec, _ = stream(smol, smol.encode(TEXT), SamplingParams(stop=("you",), stop_regex=r"o\w"))
    assert dec.matched_stop == "or" and dec.text == "Hello w"
    dec, _ = stream(smol, smol.encode(TEXT), SamplingParams(stop=("or",), stop_regex=r"wor"))
    assert dec.matched_stop == "wor"  # same end: the longer


def test_stop_regex_holds_back_a_match_in_progress(smol: Tokenizer) -> None:
    dec = IncrementalDecoder(smol, SamplingParams(stop_regex=r"\[\d+\]"))
    streamed = "".join(dec.push([i]) for i in smol.encode("see [12"))
    assert streamed == "see "  # "[12" may still become "[12]"
    assert dec.push(smol.encode("3]")) == "" and dec.matched_stop == "[123]" and dec.text == "see "


@settings(max_examples=200)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab é🎉")), max_size=20),
    stops=st.lists(st.text(alphabet=st.sampled_from(list("ab é🎉")), min_size=1, max_size=3), max_size=2),
    regexes=st.lists(st.sampled_from(REGEXES), min_size=1, max_size=3),
    no_stop_trim=st.booleans(),
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
)
def test_stop_regex_streaming_matches_char_by_char_spec(
    tiny: Tokenizer, text: str, stops: list[str], regexes: list[str], no_stop_trim: bool, chunks: list[int]
) -> None:
    ids = tiny.encode(text)
    params = SamplingParams(stop=tuple(stops), stop_regex=tuple(regexes), no_stop_trim=no_stop_trim)
    expected, expected_stop = reference_regex_stop(text, stops, regexes, no_stop_trim)
    dec = IncrementalDecoder(tiny, params)
    pos, i = 0, 0
    while pos < len(ids) and not dec.stopped:
        dec.push(ids[pos : pos + chunks[i % len(chunks)]])
        pos, i = pos + chunks[i % len(chunks)], i + 1
        assert expected.startswith(dec.text)  # nothing that a later match cuts was ever emitted
    dec.finish()
    assert (dec.text, dec.matched_stop) == (expected, expected_stop)


def test_stop_regex_is_checked_at_the_door() -> None:
    for pattern, reason in [("(", "does not parse"), ("a*", "empty string"), ("x$", "anchors"),
                            ("(?<=a)b", "lookaround"), (r"(a)\1", "backreferences"),
                            ("[ab]{0,5000}c", "automaton states")]:  # bounded work per character
        with pytest.raises(ValueError, match=rf"sampling_params\.stop_regex .*{reason}"):
            SamplingParams(stop_regex=pattern)
    with pytest.raises(ValueError, match="stop_regex must be a string or a list"):
        SamplingParams.from_dict({"stop_regex": 3})
    assert SamplingParams.from_dict({"stop_regex": ""}).stop_regex == ()  # sglang's frontend sends it empty
    assert SamplingParams.from_dict({"stop_regex": ["a+"]}).to_dict()["stop_regex"] == ["a+"]
