"""Per-request sampling parameters: SGLang's names, defaults and validation rules.

A `SamplingParams` is valid by construction: `__post_init__` checks every field and normalizes
`stop` / `stop_token_ids` to tuples, so code that holds one never re-validates it. Requests
arriving as JSON go through `SamplingParams.from_dict`, which also rejects unknown names.
Every `InvalidSamplingParams` message names the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from radixlm.runtime.config.limits import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from radixlm.runtime.sampling.stop_regex import compile_stop_regex

# Temperatures below this are greedy, as in SGLang (`0 <= temperature < 1e-6`).
SAMPLING_EPS = 1e-6
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1
# SGLang's native API spells the seed `sampling_seed`; `from_dict` accepts it as an alias.
_FIELD_ALIASES = {"sampling_seed": "seed"}
_GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")


class InvalidSamplingParams(ValueError):
    """A sampling parameter is unknown, of the wrong type, or out of range."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request (SGLang semantics).

    `max_new_tokens=None` means "until the context length". `top_k=-1` disables top-k.
    `temperature` below 1e-6 (typically 0) or `top_k == 1` means greedy (`is_greedy`).
    `stop` and `stop_regex` may be given as a str or a list and are stored as `tuple[str, ...]`;
    `stop_token_ids` is stored as a duplicate-free `tuple[int, ...]`. At most one of `regex`, `json_schema`,
    `ebnf`, `structural_tag` (a JSON string, `constrained.structural_tag`) may be set; an empty
    string counts as unset.
    """

    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    n: int = 1
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    no_stop_trim: bool = False
    # SGLang's regex stops (`stop_regex.py`): a str or a list, stored as `tuple[str, ...]`; the
    # text is cut where it first matches one, as at a stop string
    stop_regex: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_ints(self)
        _check_floats(self)
        _check_bools(self)
        _check_stops(self)
        _check_grammars(self)

    @property
    def is_greedy(self) -> bool:
        """True when decoding is argmax: temperature ~0 or top_k == 1."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a JSON-like mapping; None or {} gives the defaults.

        A value of None means "default" for every field (SGLang lets clients send null),
        except `max_new_tokens` (None = no limit) and the optional fields. Raises
        `InvalidSamplingParams` for unknown names, wrong types and out-of-range values.
        """
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise InvalidSamplingParams(f"sampling_params must be an object, got {type(d).__name__}")
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            name = _FIELD_ALIASES.get(key, key)
            if name not in known:
                raise InvalidSamplingParams(f"unknown sampling parameter {key!r}")
            if name in kwargs:
                raise InvalidSamplingParams(f"sampling_params.{name} given twice (as {key!r})")
            if value is None and known[name].default is not None and name != "max_new_tokens":
                continue
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; `from_dict(p.to_dict()) == p`."""
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["stop_regex"] = list(self.stop_regex)
        return d


def _fail(name: str, message: str, value: Any) -> InvalidSamplingParams:
    return InvalidSamplingParams(f"sampling_params.{name} {message}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ints(p: SamplingParams) -> None:
    for name in ("min_new_tokens", "top_k", "n"):
        if not _is_int(getattr(p, name)):
            raise _fail(name, "must be an integer", getattr(p, name))
    if p.max_new_tokens is not None and not _is_int(p.max_new_tokens):
        raise _fail("max_new_tokens", "must be an integer or null", p.max_new_tokens)
    if p.max_new_tokens is not None and p.max_new_tokens < 0:
        raise _fail("max_new_tokens", "must be >= 0", p.max_new_tokens)
    if p.min_new_tokens < 0:
        raise _fail("min_new_tokens", "must be >= 0", p.min_new_tokens)
    if p.max_new_tokens is not None and p.min_new_tokens > p.max_new_tokens:
        raise _fail("min_new_tokens", f"must be <= max_new_tokens ({p.max_new_tokens})", p.min_new_tokens)
    if p.top_k != -1 and p.top_k < 1:
        raise _fail("top_k", "must be -1 (disabled) or >= 1", p.top_k)
    if p.n < 1:
        raise _fail("n", "must be >= 1", p.n)
    if p.seed is not None and not (_is_int(p.seed) and _SEED_MIN <= p.seed <= _SEED_MAX):
        raise _fail("seed", "must be an integer in [-2**63, 2**63 - 1] or null", p.seed)


# name -> (low, low_inclusive, high, high_inclusive, text); high None = unbounded.
FLOAT_RANGES: dict[str, tuple[float, bool, float | None, bool, str]] = {
    "temperature": (0.0, True, None, False, "must be >= 0"),
    "top_p": (0.0, False, 1.0, True, "must be in (0, 1]"),
    "min_p": (0.0, True, 1.0, True, "must be in [0, 1]"),
    "frequency_penalty": (-2.0, True, 2.0, True, "must be in [-2, 2]"),
    "presence_penalty": (-2.0, True, 2.0, True, "must be in [-2, 2]"),
    "repetition_penalty": (0.0, False, 2.0, True, "must be in (0, 2]"),
}


def _check_floats(p: SamplingParams) -> None:
    """Ints are accepted and stored as floats; bools, NaN and infinities are rejected."""
    for name, (low, low_incl, high, high_incl, text) in FLOAT_RANGES.items():
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(name, "must be a number", value)
        if not math.isfinite(value):
            raise _fail(name, "must be finite", value)
        above_low = value >= low if low_incl else value > low
        below_high = high is None or (value <= high if high_incl else value < high)
        if not (above_low and below_high):
            raise _fail(name, text, value)
        object.__setattr__(p, name, float(value))


def _check_bools(p: SamplingParams) -> None:
    for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if not isinstance(getattr(p, name), bool):
            raise _fail(name, "must be a boolean", getattr(p, name))


def _check_stops(p: SamplingParams) -> None:
    object.__setattr__(p, "stop", _string_list(p, "stop"))
    object.__setattr__(p, "stop_regex", _string_list(p, "stop_regex"))
    for pattern in p.stop_regex:
        try:
            compile_stop_regex(pattern)
        except ValueError as e:
            raise _fail("stop_regex", f"holds a pattern that cannot stop generation: {e}", pattern) from None

    ids: Any = p.stop_token_ids
    if ids is None:
        ids = ()
    if not isinstance(ids, (list, tuple, set, frozenset)) or not all(_is_int(t) and t >= 0 for t in ids):
        raise _fail("stop_token_ids", "must be a list of non-negative integers", p.stop_token_ids)
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidSamplingParams(
            f"sampling_params.stop_token_ids has {len(ids)} ids; the limit is {MAX_STOP_TOKEN_IDS}"
        )
    ordered = sorted(ids) if isinstance(ids, (set, frozenset)) else ids
    object.__setattr__(p, "stop_token_ids", tuple(dict.fromkeys(ordered)))


def _string_list(p: SamplingParams, name: str) -> tuple[str, ...]:
    """`stop` / `stop_regex` as a checked tuple (None, a str, or a list of non-empty strings)."""
    value: Any = getattr(p, name)
    if value is None:
        value = ()
    elif isinstance(value, str):
        value = (value,) if value or name == "stop" else ()  # SGLang's frontend sends stop_regex ""
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise _fail(name, "must be a string or a list of strings", getattr(p, name))
    if any(s == "" for s in value):
        raise _fail(name, "must not contain empty strings", getattr(p, name))
    if len(value) > MAX_STOP_STRINGS:
        raise InvalidSamplingParams(f"sampling_params.{name} has {len(value)} strings; the limit is {MAX_STOP_STRINGS}")
    longest = max(map(len, value), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise InvalidSamplingParams(
            f"sampling_params.{name} holds a string of {longest} characters; the limit is {MAX_STOP_STRING_CHARS}"
        )
    return tuple(value)


def _check_grammars(p: SamplingParams) -> None:
    for name in _GRAMMAR_FIELDS:
        value = getattr(p, name)
        if value is not None and not isinstance(value, str):
            raise _fail(name, "must be a string or null", value)
        if value == "":
            object.__setattr__(p, name, None)
    given = [name for name in _GRAMMAR_FIELDS if getattr(p, name) is not None]
    if len(given) > 1:
        raise InvalidSamplingParams(
            f"sampling_params: only one of {', '.join(_GRAMMAR_FIELDS)} may be set, got {', '.join(given)}"
        )
