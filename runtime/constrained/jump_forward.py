r"""Jump-forward decoding (compressed FSM): the text a grammar forces next, and the tokens to try for it.

Where the grammar admits exactly one continuation (after `{"` of the W4 schema: `name"`), the
model need not be asked byte by byte. Two questions, answered here:

1. *Which text is forced?* outlines-core's index is over tokens, and a state's allowed tokens
   rarely share more than one byte (after `{"` it allows `n`, `na`, `name`, `name"`, ...).
   So `JumpForward` builds a second outlines-core index of the same regex (+ end marker) over a
   256-token byte vocabulary: a byte DFA whose states have one transition per allowed next byte.
   The forced text at a state is the chain of states with exactly one outgoing byte and no
   end-marker transition (where the output may end, EOS is a second continuation). Same regex,
   same engine, so it accepts exactly the token index's language; it takes milliseconds to build.
   (interegular, the other option, parses Python regex syntax and works on characters, while our
   grammars are Rust-syntax regexes matched over UTF-8 bytes.) The `Grammar` tracks its byte-DFA
   state alongside its token state, advancing by each accepted token's bytes.

2. *Which tokens spell it?* The forced text is tokenized together with the last sampled token,
   so the boundary splits as the tokenizer (and the model's training data) would split it: when
   the canonical tokenization of `last + forced` starts with exactly the last token, its remaining
   tokens are the draft (`{"` + `name"` -> `{"`, `name`, `"`: draft `name`, `"`); when it would
   merge the last token into the forced text, the forced text alone is tokenized. Only tokens
   spelling a prefix of the forced bytes are kept, cut at the last complete UTF-8 character.

The scheduler runs the draft through one extend forward with the last token, then samples every
position under its own grammar mask and keeps the draft only as far as the samples agree with it,
plus the first sample that disagrees (speculative decoding with the grammar as the draft model).
So the output is the one decoding token by token would give (greedy: identical up to float
rounding between the extend and decode kernels; sampled: the same distribution, and seeded rows
draw the same noise per output position), and the saving is every decode step whose token the
draft predicted. Replacing already sampled tokens with the canonical tokenization (SGLang's
retokenization) would instead change what the model conditions on, and so change the output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import outlines_core

from radixlm.runtime.constrained.vocabulary import END_MARKER

MAX_FORCED_BYTES = 256  # longest forced text looked at in one step (the rest comes next step)
MAX_MEMO_ENTRIES = 65536  # drafts memoized per grammar, (byte state, last token) -> tokens
_MARKER_ID = 256  # the end marker's id in the byte vocabulary (byte b has id b)
_BYTE_EOS_ID = 257
_BYTE_VOCABULARY = outlines_core.Vocabulary(
    _BYTE_EOS_ID, {bytes([b]): [b] for b in range(1, 256)} | {b"\x00": [_MARKER_ID]}
)


class JumpForward:
    """One grammar's byte DFA (its regex R compiled as R + end marker, like the token index) and
    the drafts of its forced texts for one tokenizer.

    Immutable apart from memos; shared by every request of the grammar (one thread at a time).
    `encode`: text -> token ids without special tokens; `id_to_bytes`: the grammar vocabulary's.
    """

    def __init__(self, regex: str, encode: Callable[[str], list[int]], id_to_bytes: Mapping[int, bytes]):
        index = outlines_core.Index(f"(?:{regex}){END_MARKER}", _BYTE_VOCABULARY)
        self.initial_state: int = index.get_initial_state()
        self.encode = encode
        self.id_to_bytes = id_to_bytes
        self._state_to_byte_next: dict[int, dict[int, int]] = {}
        self._can_end: set[int] = set()  # states where R is complete (EOS may follow)
        for state, token_to_next in index.get_transitions().items():
            self._state_to_byte_next[state] = {t: n for t, n in token_to_next.items() if t < _MARKER_ID}
            if _MARKER_ID in token_to_next:
                self._can_end.add(state)
        self._state_to_forced: dict[int, bytes] = {}
        self._key_to_draft: dict[tuple[int, int], tuple[int, ...]] = {}

    def advance(self, state: int | None, token_id: int) -> int | None:
        """The byte state after a token, or None if R cannot continue with it (or `state` is None)."""
        for byte in self.id_to_bytes.get(token_id, b"\x00"):
            if state is None:
                return None
            state = self._state_to_byte_next.get(state, {}).get(byte)
        return state

    def forced_bytes(self, state: int) -> bytes:
        """The longest text every completion from `state` starts with (memoized; at most
        MAX_FORCED_BYTES). Empty where two bytes, or a byte and the end, are possible."""
        forced = self._state_to_forced.get(state)
        if forced is None:
            out = bytearray()
            current = state
            while len(out) < MAX_FORCED_BYTES and current not in self._can_end:
                byte_to_next = self._state_to_byte_next.get(current, {})
                if len(byte_to_next) != 1:
                    break
                ((byte, current),) = byte_to_next.items()
                out.append(byte)
            forced = self._state_to_forced[state] = bytes(out)
        return forced

    def draft(self, state: int, last_token_id: int) -> tuple[int, ...]:
        """The draft after `last_token_id` left the byte DFA in `state` (memoized): see
        `draft_tokens`. Empty when nothing is forced."""
        key = (state, last_token_id)
        draft = self._key_to_draft.get(key)
        if draft is None:
            forced = self.forced_bytes(state)
            last_bytes = self.id_to_bytes.get(last_token_id, b"")
            draft = tuple(draft_tokens(last_bytes, forced, self.encode, self.id_to_bytes)) if forced else ()
            if len(self._key_to_draft) >= MAX_MEMO_ENTRIES:
                self._key_to_draft.clear()
            self._key_to_draft[key] = draft
        return draft


def _longest_text(data: bytes) -> str | None:
    """`data` as text, without a trailing incomplete UTF-8 character; None if that is not valid."""
    for cut in range(4):
        try:
            return data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def draft_tokens(
    last_bytes: bytes,
    forced: bytes,
    encode: Callable[[str], list[int]],
    id_to_bytes: Mapping[int, bytes],
) -> list[int]:
    """Tokens spelling a prefix of `forced` as the tokenizer would split `last_bytes + forced`.

    `last_bytes`: the bytes of the last sampled token, which stays; `encode`: text -> ids without
    special tokens. Empty if no tokenization of the text fits (e.g. it starts mid-character).
    """
    for head in (last_bytes, b""):
        text = _longest_text(head + forced)
        if text is None or len(text.encode("utf-8")) <= len(head):
            continue
        ids = encode(text)
        spelled, position = b"", 0
        while position < len(ids) and len(spelled) < len(head):
            spelled += id_to_bytes.get(ids[position], b"\x00")
            position += 1
        if spelled != head:
            continue  # the tokenizer would merge the last token into the forced text
        draft, rest = [], forced
        for token_id in ids[position:]:
            token_bytes = id_to_bytes.get(token_id)
            if not token_bytes or not rest.startswith(token_bytes):
                break
            draft.append(token_id)
            rest = rest[len(token_bytes) :]
        if draft:
            return draft
    return []
