r"""The grammar vocabulary: each token id mapped to the exact bytes it appends to the output.

outlines-core matches regexes over UTF-8 *bytes* (its `Vocabulary` keys are `bytes`), so a token
holding half of a multi-byte character is simply its raw bytes (e.g. b"\xc3") and the index lets
it through only where the rest of the character can still follow. We build that map locally from
our tokenizer (never `Vocabulary.from_pretrained`, which needs the hub):

- byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen): undo the GPT-2 byte-to-unicode table, so
  "Ġthe" -> b" the" and "Ã" -> b"\xc3";
- SentencePiece with byte fallback (Llama 2, Mistral): "▁" -> b" ", "<0xE2>" -> b"\xe2".

Special tokens are excluded (they never appear in constrained text); EOS is the vocabulary's
`eos_token_id`.

The end marker. outlines-core 0.2 drops every token whose last byte follows a complete match
unless the text is again a complete match after it (its DFA reports matches one byte late), so
from an accepting state of `[0-9]+(\.[0-9]+)?` the token "." would be missing. Grammars therefore
compile `(?:R)\x00` instead of `R`: tokens containing NUL are left out of the vocabulary and a
fake token `END_MARKER_TOKEN_ID` spells b"\x00", so no position inside R is ever a complete match,
and "R is complete at state s" is exactly "the marker token leads from s to a final state".
Cost: constrained output never contains NUL.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import outlines_core

if TYPE_CHECKING:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer


END_MARKER = "\\x00"  # regex text of the end marker appended to every grammar
END_MARKER_TOKEN_ID = 2**32 - 2  # a u32 id beyond any real vocabulary (never in a mask row)


@dataclass(frozen=True)
class GrammarVocabulary:
    """outlines-core's vocabulary for one tokenizer, plus the id -> bytes map it was built from.

    `vocabulary` holds the non-special tokens without NUL, plus the end marker token.
    `id_to_bytes` holds every non-special token (EOS excluded); `build_secs` is the build time.
    """

    vocabulary: outlines_core.Vocabulary
    eos_token_id: int
    id_to_bytes: Mapping[int, bytes]
    build_secs: float


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-unicode table, as unicode char -> byte.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, 0x7F-0xA0,
    0xAD) are shifted to U+0100 onwards in byte order.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in table.values())
    for offset, byte in enumerate(shifted):
        table[chr(0x100 + offset)] = byte
    return table


_UNICODE_TO_BYTE = _gpt2_unicode_to_byte()


def byte_level_token_bytes(token: str) -> bytes:
    """The bytes of a byte-level BPE token string ("Ġthe" -> b" the"); KeyError if not byte-level."""
    return bytes(_UNICODE_TO_BYTE[char] for char in token)


def byte_fallback_token_bytes(token: str) -> bytes:
    """The bytes of a SentencePiece byte-fallback token ("▁the" -> b" the", "<0xE2>" -> b"\\xe2")."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


def _decoder_kind(hf_tokenizer: object) -> str:
    """'byte_level' or 'byte_fallback', read from the fast tokenizer's decoder; ValueError otherwise."""
    decoder = json.loads(hf_tokenizer.backend_tokenizer.to_str()).get("decoder") or {}  # type: ignore[attr-defined]
    if decoder.get("type") == "ByteLevel":
        return "byte_level"
    steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else []
    if any(step.get("type") == "ByteFallback" for step in steps):
        return "byte_fallback"
    if any(step.get("type") == "ByteLevel" for step in steps):
        return "byte_level"
    raise ValueError(f"constrained decoding does not support this tokenizer's decoder: {decoder.get('type')}")


def build_id_to_bytes(tokenizer: Tokenizer) -> dict[int, bytes]:
    """Every non-special token id (EOS included in the exclusion) -> the bytes it decodes to.

    Added tokens that are not special are kept with their literal content.
    """
    hf = tokenizer._tok  # the facade exposes no vocabulary accessor; read-only use
    added = hf.added_tokens_decoder  # id -> AddedToken
    special_ids = set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}
    if tokenizer.eos_token_id is not None:
        special_ids.add(tokenizer.eos_token_id)
    to_bytes = byte_level_token_bytes if _decoder_kind(hf) == "byte_level" else byte_fallback_token_bytes
    id_to_bytes: dict[int, bytes] = {}
    for token, token_id in hf.get_vocab().items():
        if token_id in special_ids:
            continue
        id_to_bytes[token_id] = added[token_id].content.encode() if token_id in added else to_bytes(token)
    return id_to_bytes


def build_grammar_vocabulary(tokenizer: Tokenizer) -> GrammarVocabulary:
    """Builds the outlines-core vocabulary for `tokenizer` (uncached; see `get_grammar_vocabulary`)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("constrained decoding needs a tokenizer with an EOS token")
    start = time.perf_counter()
    id_to_bytes = build_id_to_bytes(tokenizer)
    bytes_to_ids: dict[bytes, list[int]] = {b"\x00": [END_MARKER_TOKEN_ID]}
    for token_id, token_bytes in id_to_bytes.items():
        # An empty token would let the FSM loop without progress; NUL is the end marker's alone.
        if token_bytes and b"\x00" not in token_bytes:
            bytes_to_ids.setdefault(token_bytes, []).append(token_id)
    vocabulary = outlines_core.Vocabulary(tokenizer.eos_token_id, bytes_to_ids)
    return GrammarVocabulary(vocabulary, tokenizer.eos_token_id, id_to_bytes, time.perf_counter() - start)


_CACHE: weakref.WeakKeyDictionary[Tokenizer, GrammarVocabulary] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def get_grammar_vocabulary(tokenizer: Tokenizer) -> GrammarVocabulary:
    """The grammar vocabulary of `tokenizer`, built once per tokenizer object (thread-safe)."""
    with _CACHE_LOCK:
        cached = _CACHE.get(tokenizer)
        if cached is None:
            cached = _CACHE[tokenizer] = build_grammar_vocabulary(tokenizer)
        return cached
