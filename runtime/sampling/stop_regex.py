"""Regex stops (`sampling_params.stop_regex`): where the generated text first matches a pattern.

Semantics (the same as stop strings, `detokenizer.py`): the stop fires at the first character
of the output after which the text so far contains a match; the reported match is the one ending
there that starts earliest. So where a stop fires depends only on the text, never on how it was
split into tokens, and greedy and lazy repetition (`a+`, `a+?`) mean the same thing here.

Patterns use Python's `re` syntax, parsed by `re`'s own parser. Refused, because they depend on
text beyond the match or on how a backtracking engine explores it: anchors and word boundaries
(`^ $ \\A \\Z \\b \\B`), lookaround, backreferences, atomic groups and possessive repetition; and
patterns that match the empty string.

Matching is a Thompson NFA simulation over the characters as they arrive: linear in the text,
never backtracking, so no pattern can stall the scheduler (one automaton state per position of
the pattern, counted repetitions multiplied out, at most MAX_STOP_REGEX_STATES). A `StopRegexMatcher` also reports where
the earliest match still in progress begins, so the detokenizer holds that text back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

try:
    from re import _parser as sre_parse  # type: ignore[attr-defined]  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

from radixlm.runtime.config.limits import MAX_STOP_STRING_CHARS

# Each character of output costs up to one step per automaton state (the scheduler runs this), so
# a stop regex may have as many states as four stop strings of the longest length allowed.
MAX_STOP_REGEX_STATES = 4 * MAX_STOP_STRING_CHARS

_IGNORECASE, _DOTALL = 2, 16  # re.IGNORECASE, re.DOTALL (as the parser reports them)
_REFUSED = {
    "AT": "anchors and word boundaries (^, $, \\A, \\Z, \\b, \\B)",
    "ASSERT": "lookaround", "ASSERT_NOT": "lookaround",
    "GROUPREF": "backreferences", "GROUPREF_EXISTS": "conditional groups",
    "ATOMIC_GROUP": "atomic groups", "POSSESSIVE_REPEAT": "possessive repetition",
}
_CATEGORIES: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdecimal,
    "CATEGORY_NOT_DIGIT": lambda c: not c.isdecimal(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_NOT_WORD": lambda c: not (c.isalnum() or c == "_"),
}

Predicate = Callable[[str], bool]


class StopRegex:
    """A compiled pattern: state i is a char test (`preds[i]` set; on a match go to `outs[i][0]`),
    a split (`preds[i]` None: epsilon moves to each of `outs[i]`), or the match state `match`."""

    def __init__(self, pattern: str, preds: list[Predicate | None], outs: list[tuple[int, ...]], start: int, match: int):
        self.pattern = pattern
        self.preds = tuple(preds)
        self.outs = tuple(outs)
        self.start = start
        self.match = match
        self._closures: dict[int, tuple[tuple[int, ...], bool]] = {}

    def closure(self, state: int) -> tuple[tuple[int, ...], bool]:
        """The char-test states reachable from `state` by epsilon moves, and whether the match
        state is (memoised: the automaton never changes)."""
        found = self._closures.get(state)
        if found is None:
            chars, matched, seen, stack = [], False, {state}, [state]
            while stack:
                s = stack.pop()
                if s == self.match:
                    matched = True
                elif self.preds[s] is not None:
                    chars.append(s)
                else:
                    for nxt in self.outs[s]:
                        if nxt not in seen:
                            seen.add(nxt)
                            stack.append(nxt)
            found = self._closures[state] = (tuple(sorted(chars)), matched)
        return found


class _Builder:
    """Thompson construction, backwards: each part is built knowing the state it leads to."""

    def __init__(self, pattern: str, max_states: int):
        self.pattern = pattern
        self.max_states = max_states
        self.preds: list[Predicate | None] = []
        self.outs: list[tuple[int, ...]] = []

    def add(self, pred: Predicate | None, outs: tuple[int, ...]) -> int:
        if len(self.preds) >= self.max_states:
            raise ValueError(f"it needs more than {self.max_states} automaton states")
        self.preds.append(pred)
        self.outs.append(outs)
        return len(self.preds) - 1

    def seq(self, items: Sequence[tuple[object, object]], nxt: int, flags: int) -> int:
        for op, av in reversed(list(items)):
            nxt = self.item(str(op), av, nxt, flags)
        return nxt

    def item(self, op: str, av: object, nxt: int, flags: int) -> int:
        if op in _REFUSED:
            raise ValueError(f"it uses {_REFUSED[op]}, which stop regexes do not support")
        if op in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
            return self.add(_char_pred(op, av, flags), (nxt,))
        if op == "BRANCH":
            _, alternatives = av  # type: ignore[misc]
            starts = [self.seq(alt, nxt, flags) for alt in alternatives]
            state = starts[-1]
            for start in reversed(starts[:-1]):
                state = self.add(None, (start, state))
            return state
        if op == "SUBPATTERN":
            _, add_flags, del_flags, body = av  # type: ignore[misc]
            return self.seq(body, nxt, (flags | add_flags) & ~del_flags)
        if op in ("MAX_REPEAT", "MIN_REPEAT"):
            low, high, body = av  # type: ignore[misc]
            if high == sre_parse.MAXREPEAT:
                loop = self.add(None, ())
                self.outs[loop] = (self.seq(body, loop, flags), nxt)
                state = loop
            else:
                state = nxt
                for _ in range(high - low):  # x{0,3} = (x(x(x)?)?)?
                    state = self.add(None, (self.seq(body, state, flags), nxt))
            for _ in range(low):
                state = self.seq(body, state, flags)
            return state
        raise ValueError(f"it uses {op}, which stop regexes do not support")


def _char_pred(op: str, av: object, flags: int) -> Predicate:
    if op == "ANY":
        return (lambda c: True) if flags & _DOTALL else (lambda c: c != "\n")
    if op == "LITERAL":
        test = _literal(chr(av))  # type: ignore[arg-type]
    elif op == "NOT_LITERAL":
        inner = _literal(chr(av))  # type: ignore[arg-type]
        return _case_insensitive(lambda c: not inner(c), flags, negated=True)
    else:
        test = _char_set(av)  # type: ignore[arg-type]
    return _case_insensitive(test, flags)


def _literal(char: str) -> Predicate:
    return lambda c: c == char


def _char_set(items: list[tuple[object, object]]) -> Predicate:
    negate = False
    chars: set[str] = set()
    tests: list[Predicate] = []
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            chars.add(chr(av))  # type: ignore[arg-type]
        elif name == "RANGE":
            low, high = av  # type: ignore[misc]
            tests.append(lambda c, lo=low, hi=high: lo <= ord(c) <= hi)
        elif name == "CATEGORY":
            tests.append(_CATEGORIES[str(av)])
        else:
            raise ValueError(f"it uses the class item {name}, which stop regexes do not support")

    def member(c: str) -> bool:
        return c in chars or any(t(c) for t in tests)

    return (lambda c: not member(c)) if negate else member


def _case_insensitive(test: Predicate, flags: int, negated: bool = False) -> Predicate:
    if not flags & _IGNORECASE:
        return test
    if negated:  # [^a] under (?i) rejects both cases
        return lambda c: test(c) and test(c.lower()) and test(c.upper())
    return lambda c: test(c) or test(c.lower()) or test(c.upper())


@functools.lru_cache(maxsize=256)
def compile_stop_regex(pattern: str, max_states: int = MAX_STOP_REGEX_STATES) -> StopRegex:
    """The automaton of `pattern`; ValueError saying why it cannot be a stop regex."""
    try:
        parsed = sre_parse.parse(pattern)
    except Exception as e:  # re.error, RecursionError, OverflowError: the parser's own words
        raise ValueError(f"it does not parse: {e}") from e
    builder = _Builder(pattern, max_states)
    match = builder.add(None, ())
    start = builder.seq(list(parsed), match, parsed.state.flags)
    regex = StopRegex(pattern, builder.preds, builder.outs, start, match)
    if regex.closure(start)[1]:
        raise ValueError("it matches the empty string")
    return regex


class StopRegexMatcher:
    """Feeds one output's characters, in order, through every stop regex at once. Positions are
    character offsets in the whole output."""

    def __init__(self, patterns: Sequence[str]):
        self.regexes = [compile_stop_regex(p) for p in patterns]
        # per regex: char-test state -> the earliest start of a match in progress there
        self._active: list[dict[int, int]] = [{} for _ in self.regexes]
        self._pos = 0

    def feed(self, text: str) -> tuple[int, int] | None:
        """Consume `text`; (start, end) of the first match to complete, else None. After a match
        the matcher has consumed the text up to its end only (the output stops there)."""
        for char in text:
            pos = self._pos
            self._pos += 1
            best: tuple[int, int] | None = None
            for i, regex in enumerate(self.regexes):
                candidates = dict(self._active[i])
                for state in regex.closure(regex.start)[0]:
                    candidates.setdefault(state, pos)  # a match may also begin here
                nxt: dict[int, int] = {}
                matched_start: int | None = None
                for state, start in candidates.items():
                    if regex.preds[state](char):  # type: ignore[misc]
                        chars, matched = regex.closure(regex.outs[state][0])
                        for s in chars:
                            if start < nxt.get(s, pos + 1):
                                nxt[s] = start
                        if matched and (matched_start is None or start < matched_start):
                            matched_start = start
                self._active[i] = nxt
                if matched_start is not None and (best is None or matched_start < best[0]):
                    best = (matched_start, pos + 1)
            if best is not None:
                return best
        return None

    def pending_start(self) -> int | None:
        """Where the earliest match still in progress begins (text from there may yet be cut)."""
        starts = [start for active in self._active for start in active.values()]
        return min(starts) if starts else None
