"""Compiled grammars (token FSMs over our vocabulary), per-request grammar state, and the backend.

Flow: `GrammarBackend.get(kind, spec)` (or `get_lowered`: a spec the front door lowered to its
regex already, `spec.lower`) -> Future[CompiledGrammar] (compiled in a worker thread, cached LRU) ->
`CompiledGrammar.new_state()` -> a per-request `Grammar`, which the scheduler drives:
`fill_vocab_mask` before sampling, `accept_token` after, `is_terminated` to finish the request.
Jump-forward (see `jump_forward`): `jump_forward_ids` gives the tokens of the text the grammar
forces next, and `fill_vocab_masks` the masks of the positions along them.

Bounded compiles: the token index is built in a child process (`index_worker`) that is killed
past RADIXLM_GRAMMAR_COMPILE_TIMEOUT, so a pathological grammar fails with a GrammarError instead
of holding a core and memory indefinitely. Fair compiles: every compile starts in a fast lane and
one still building past RADIXLM_GRAMMAR_FAST_LANE_DEADLINE moves to a slow lane, so slow grammars
never hold up a new one for longer than that deadline (see `GrammarBackend`).

Thread-safety: a compile thread waits on its child's pipe (no GIL held), so a slow compile never
stalls the scheduler thread. A `CompiledGrammar` is immutable apart from a memo dict and may be
shared by many `Grammar`s; each `Grammar` must be used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import outlines_core
import torch

from radixlm.runtime.config.envs import RADIXLM_GRAMMAR_COMPILE_TIMEOUT, RADIXLM_GRAMMAR_FAST_LANE_DEADLINE
from radixlm.runtime.config.limits import GRAMMAR_COMPILE_MAX_MEMORY_BYTES
from radixlm.runtime.constrained.compile_cache import CompileCache
from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.index_worker import Build, IndexWorker, token_distances
from radixlm.runtime.constrained.jump_forward import JumpForward
from radixlm.runtime.constrained.lowered import LoweredGrammar, LoweringSettings
from radixlm.runtime.constrained.regex_syntax import python_regex_error
from radixlm.runtime.constrained.spec import lower_normalized, normalize_spec, outlines_settings, validate
from radixlm.runtime.constrained.vocabulary import (
    END_MARKER,
    END_MARKER_TOKEN_ID,
    GrammarVocabulary,
    get_grammar_vocabulary,
)

if TYPE_CHECKING:
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

__all__ = ["CompiledGrammar", "Grammar", "GrammarBackend", "GrammarError", "validate"]

MAX_JUMP_FORWARD_TOKENS = 16  # longest draft per step; also the guide's rollback depth
# Grammars compiled at once in each lane (worker threads = index-building children; see
# GrammarBackend): the fast lane, where every compile starts, and the slow lane, where those past
# the fast lane's deadline go on. Not more: each child holds its own copy of the vocabulary and may
# use up to GRAMMAR_COMPILE_MAX_MEMORY_BYTES, and each build keeps a core busy.
NUM_GRAMMAR_COMPILE_WORKERS = 2
NUM_SLOW_GRAMMAR_COMPILE_WORKERS = 2


class CompiledGrammar:
    """One grammar's token index over one tokenizer's vocabulary, for masks of `vocab_size` ids.

    `regex` is the grammar's regex R; `index` is built for R followed by the end marker (see
    `vocabulary`), so R is complete at an index state iff the marker token leads to a final state.
    `compile_secs` is the regex + index build time. `jump_forward` (None: no jump-forward) is the
    regex's byte DFA and the drafts of its forced texts.
    """

    def __init__(
        self,
        kind: str,
        regex: str,
        index: outlines_core.Index,
        eos_token_id: int,
        tokenizer_len: int,
        vocab_size: int,
        compile_secs: float,
        jump_forward: JumpForward | None = None,
        distances: dict[int, int] | None = None,
    ):
        self.kind = kind
        self.regex = regex
        self.index = index
        self.eos_token_id = eos_token_id
        self.tokenizer_len = tokenizer_len
        self.vocab_size = vocab_size
        self.compile_secs = compile_secs
        self.jump_forward = jump_forward
        # fewest tokens from each index state to a complete one (index_worker.token_distances)
        self.distances = distances if distances is not None else token_distances(index, END_MARKER_TOKEN_ID)
        # Words of outlines-core's LSB-first bitmask; it must cover every token id of the vocabulary.
        self.num_mask_words = (max(vocab_size, tokenizer_len) + 31) // 32
        self._state_to_is_dead_end: dict[int, bool] = {}
        self._state_to_groups: dict[int, list[tuple[int, np.ndarray]]] = {}

    def new_state(self) -> Grammar:
        """A fresh per-request grammar at the initial state."""
        return Grammar(self)

    def is_complete(self, state: int) -> bool:
        """Whether the text so far matches R in full (EOS may follow).

        True iff the marker leads to a final state: text + NUL matches R + NUL iff text matches R
        (R may itself admit NUL, e.g. in `[^"]`, but only the marker token spells one).
        """
        return _is_complete(self.index, state)

    def min_tokens(self, state: int | None = None) -> int:
        """The fewest tokens that complete the grammar from `state` (default: the start), an exact
        shortest path over the token index."""
        return self.distances.get(self.index.get_initial_state() if state is None else state, _UNREACHABLE)

    def tokens_within(self, state: int, budget: int) -> np.ndarray | None:
        """The real tokens at `state` after which the grammar can still complete within
        `budget - 1` more tokens, or None when that is every token allowed there (memoized per
        state: the allowed tokens grouped by their successor's distance). When none can (a context
        too short for the grammar), those nearest to completing."""
        groups = self._state_to_groups.get(state)
        if groups is None:
            by_distance: dict[int, list[int]] = {}
            for token in _real_tokens(self.index, state, self.eos_token_id):
                successor = self.index.get_next_state(state, token)
                by_distance.setdefault(self.distances.get(successor, _UNREACHABLE), []).append(token)
            groups = [(d, np.array(tokens, dtype=np.int64)) for d, tokens in sorted(by_distance.items())]
            self._state_to_groups[state] = groups
        if not groups or groups[-1][0] <= budget - 1:
            return None
        kept = [tokens for d, tokens in groups if d <= budget - 1] or [groups[0][1]]
        return np.concatenate(kept)

    def is_dead_end(self, state: int) -> bool:
        """Whether no real token can follow `state` (memoized; the index is immutable)."""
        is_dead_end = self._state_to_is_dead_end.get(state)
        if is_dead_end is None:
            is_dead_end = not _real_tokens(self.index, state, self.eos_token_id)
            self._state_to_is_dead_end[state] = is_dead_end
        return is_dead_end


_UNREACHABLE = 2**31 - 1  # the distance of a state that cannot complete


def _is_complete(index: outlines_core.Index, state: int) -> bool:
    end_state = index.get_next_state(state, END_MARKER_TOKEN_ID)
    return end_state is not None and index.is_final_state(end_state)


def _real_tokens(index: outlines_core.Index, state: int, eos_token_id: int) -> list[int]:
    """The allowed tokens at `state` other than EOS and the end marker."""
    allowed = index.get_allowed_tokens(state) or []
    return [t for t in allowed if t != END_MARKER_TOKEN_ID and t != eos_token_id]


class Grammar:
    """One request's position in a compiled grammar.

    Invariants: before EOS is accepted, allowed tokens are exactly the index's real-token
    transitions from the current state, plus EOS iff the text so far matches in full. After EOS is
    accepted, only EOS is allowed.
    """

    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self._guide = outlines_core.Guide(compiled.index, max_rollback=MAX_JUMP_FORWARD_TOKENS)
        self._mask_words = np.empty(compiled.num_mask_words, dtype=np.uint32)
        self._is_eos_accepted = False
        # the byte-DFA state of the text so far (None: jump-forward off or lost track)
        jump_forward = compiled.jump_forward
        self._byte_state = None if jump_forward is None else jump_forward.initial_state

    def accept_token(self, token_id: int) -> None:
        """Advances by one sampled token; ValueError (state unchanged) if the grammar forbids it."""
        if self._is_eos_accepted:
            raise ValueError(f"token {token_id} after the grammar accepted EOS")
        if token_id == self.compiled.eos_token_id:
            if not self.compiled.is_complete(self._guide.get_state()):
                raise ValueError("EOS is not allowed before the grammar is complete")
            self._is_eos_accepted = True
            return
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:
            raise ValueError(
                f"token {token_id} is not allowed by the grammar in state {self._guide.get_state()}"
            ) from None
        if self.compiled.jump_forward is not None:
            self._byte_state = self.compiled.jump_forward.advance(self._byte_state, token_id)

    def fill_vocab_mask(self, mask_row: torch.Tensor, budget: int | None = None) -> bool:
        """Overwrites `mask_row` (bool, shape [vocab_size], any device): True = allowed.

        Ids at or beyond the tokenizer's length are never allowed; EOS is allowed exactly when the
        text so far matches in full (or EOS was already accepted). Costs ~0.1 ms on CPU (numpy, no
        torch kernels: torch's thread pool makes small ops slow on a busy CPU).

        `budget`: the tokens this request may still generate, this one included. Tokens after
        which the grammar could not complete within the rest are masked too (budget steering);
        returns whether that removed any token.
        """
        compiled = self.compiled
        if mask_row.shape != (compiled.vocab_size,) or mask_row.dtype != torch.bool:
            raise ValueError(f"mask_row must be bool of shape ({compiled.vocab_size},), got {mask_row.shape}")
        words = self._mask_words
        if self._is_eos_accepted:
            allowed = np.zeros(compiled.vocab_size, dtype=np.bool_)
        else:
            self._guide.write_mask_into(words.ctypes.data, words.size, words.itemsize)
            # LSB-first: token id i is bit i % 32 of word i // 32, i.e. byte-wise little-endian.
            bits = np.unpackbits(words.astype("<u4", copy=False).view(np.uint8), bitorder="little")
            allowed = bits[: compiled.vocab_size].view(np.bool_)
            allowed[compiled.tokenizer_len :] = False
        state = self._guide.get_state()
        eos_allowed = self._is_eos_accepted or compiled.is_complete(state)
        steered = False
        if budget is not None and not self._is_eos_accepted:
            within = compiled.tokens_within(state, budget)
            if within is not None:
                allowed = np.zeros(compiled.vocab_size, dtype=np.bool_)
                allowed[within] = True
                steered = True
        allowed[compiled.eos_token_id] = eos_allowed
        if mask_row.device.type == "cpu":
            np.copyto(mask_row.numpy(), allowed)
        else:
            mask_row.copy_(torch.from_numpy(allowed))
        return steered

    def jump_forward_ids(self, last_token_id: int, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens spelling the start of the text the grammar now forces (empty if
        none), tokenized at the boundary with `last_token_id`, the token accepted last. Every
        sequence returned is allowed from the current state; the state does not change."""
        jump_forward = self.compiled.jump_forward
        if jump_forward is None or self._byte_state is None or self._is_eos_accepted or max_tokens <= 0:
            return []
        draft = list(jump_forward.draft(self._byte_state, last_token_id)[: min(max_tokens, MAX_JUMP_FORWARD_TOKENS)])
        # the byte DFA and the token index accept the same bytes, so this only guards the invariant
        return draft if draft and self._guide.accepts_tokens(draft) else []

    def valid_prefix_len(self, tokens: list[int]) -> int:
        """How many leading `tokens` (at most MAX_JUMP_FORWARD_TOKENS, no EOS) the grammar allows
        in turn from here (a speculative draft is cut there); the state does not change."""
        if self._is_eos_accepted:
            return 0
        num_valid = 0
        for token_id in tokens[:MAX_JUMP_FORWARD_TOKENS]:
            try:
                self._guide.advance(token_id, return_tokens=False)
            except ValueError:
                break
            num_valid += 1
        if num_valid:
            self._guide.rollback_state(num_valid)
        return num_valid

    def fill_vocab_masks(self, mask_rows: torch.Tensor, draft: list[int], budget: int | None = None) -> bool:
        """Fills row j of `mask_rows` (bool [len(draft) + 1, vocab_size]) with the mask after
        `draft[:j]` (row 0: the current state), row j under `budget - j` (see `fill_vocab_mask`;
        returns whether any row was steered). `draft` must be allowed (`jump_forward_ids`); the
        state does not change."""
        if mask_rows.shape[0] != len(draft) + 1:
            raise ValueError(f"{mask_rows.shape[0]} mask rows for a draft of {len(draft)} tokens")
        steered = self.fill_vocab_mask(mask_rows[0], budget)
        for j, token_id in enumerate(draft):
            self._guide.advance(token_id, return_tokens=False)
            steered |= self.fill_vocab_mask(mask_rows[j + 1], None if budget is None else budget - j - 1)
        if draft:
            self._guide.rollback_state(len(draft))
        return steered

    def budget_token(self, token_id: int, budget: int) -> int:
        """The token to take for a sampled one: itself (the mask already kept every token within
        the budget, see `fill_vocab_mask`)."""
        return token_id

    def min_tokens(self) -> int:
        """The fewest tokens that complete the grammar from here (0: complete now)."""
        return 0 if self._is_eos_accepted else self.compiled.min_tokens(self._guide.get_state())

    def is_terminated(self) -> bool:
        """True once EOS was accepted, or when no token but EOS can follow (the output is complete).

        A live state always allows some token, unless R needs a NUL (see `vocabulary`).
        """
        return self._is_eos_accepted or self.compiled.is_dead_end(self._guide.get_state())

    def copy(self) -> Grammar:
        """A fresh grammar at the initial state of the same compiled grammar (not a state copy)."""
        return self.compiled.new_state()


def _checked_index(
    kind: str, regex: str, answer: Callable[[], tuple[outlines_core.Index, dict[int, int]]]
) -> tuple[outlines_core.Index, dict[int, int]]:
    """The index and token distances `answer()` gives (an index worker's `result`), checked: some
    output of the vocabulary must complete the regex. GrammarError with a readable reason if the
    regex is invalid, unsupported, too complex, or cannot be matched."""
    try:
        index, distances = answer()
        if index.get_initial_state() in distances:
            return index, distances
        reason = "no output of this tokenizer can match it"
    except ValueError as e:
        reason = str(e).splitlines()[0]
    if "NFA" in reason:  # the Rust parser rejected it; Python's re explains syntax errors better
        reason = python_regex_error(regex) or (
            "unsupported regex syntax (lookaround, backreferences and other non-regular constructs)"
        )
    raise _compile_error(kind, regex, reason)


def _compile_error(kind: str, regex: str, reason: str) -> GrammarError:
    shown = regex if len(regex) <= 80 else regex[:80] + "..."
    return GrammarError(f"cannot compile the {kind} grammar (regex {shown!r}): {reason}")


@dataclass(eq=False)
class _Compile:
    """One grammar being compiled: its regex, the vocabulary its index is built over, when it
    began (`compile_secs` counts from there) and the future it resolves."""

    kind: str
    regex: str
    vocab: GrammarVocabulary
    start: float  # time.perf_counter()
    future: Future[CompiledGrammar]

    @property
    def index_request(self) -> tuple[str, int]:
        """What the index worker builds: the regex + end marker, with the token distances to it."""
        return f"(?:{self.regex}){END_MARKER}", END_MARKER_TOKEN_ID


class GrammarBackend(CompileCache[CompiledGrammar]):
    """Compiles grammars off the caller's thread and caches them (LRU of `max_cache` entries;
    `get(kind, spec)` -> Future, see `compile_cache`). The form it compiles is a regex (`spec`).

    `vocab_size` is the model's logits width (may exceed the tokenizer's length). With
    `enable_jump_forward`, compiled grammars also carry their `JumpForward` (a few ms more).

    Fair compiles, in two lanes, each a thread pool over an `IndexWorker` (one child per thread):
    every compile starts in the fast lane (`num_workers` at once, FIFO). A token index still
    building after `fast_lane_deadline_s` (default RADIXLM_GRAMMAR_FAST_LANE_DEADLINE) moves to the
    slow lane (`num_slow_workers` at once, FIFO): its running child is handed over when the slow
    lane has room (no work lost), else it is killed and queued there to build again. Either way its
    fast builder is free at once, so a new grammar waits behind no slow one, only behind the fast
    lane's queue (each compile ahead of it builds there for at most that deadline, then reads its
    answer and makes its jump-forward DFA, both quick next to the index). Every build is killed
    past `compile_timeout_s` (default RADIXLM_GRAMMAR_COMPILE_TIMEOUT, see `limits`), counted from
    its start (a build queued and started again gets the whole timeout anew).
    """

    backend_name = "outlines"

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        max_cache: int = 64,
        num_workers: int = NUM_GRAMMAR_COMPILE_WORKERS,
        whitespace_pattern: str | None = None,
        enable_jump_forward: bool = True,
        compile_timeout_s: float | None = None,
        num_slow_workers: int = NUM_SLOW_GRAMMAR_COMPILE_WORKERS,
        fast_lane_deadline_s: float | None = None,
    ):
        super().__init__("grammar", max_cache, num_workers, normalize_spec)  # the fast lane's threads
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.whitespace_pattern = whitespace_pattern
        self.enable_jump_forward = enable_jump_forward
        timeout_s = RADIXLM_GRAMMAR_COMPILE_TIMEOUT.get() if compile_timeout_s is None else compile_timeout_s
        self.fast_lane_deadline_s = (
            RADIXLM_GRAMMAR_FAST_LANE_DEADLINE.get() if fast_lane_deadline_s is None else fast_lane_deadline_s
        )
        if self.fast_lane_deadline_s <= 0:
            raise ValueError(f"the fast lane's deadline must be > 0 s, got {self.fast_lane_deadline_s}")
        self.num_slow_workers = num_slow_workers
        self._slow_executor = ThreadPoolExecutor(num_slow_workers, thread_name_prefix="grammar-slow-compile")
        # as many builders as threads in each lane: a compile never waits for another's child
        self._fast_builders = IndexWorker(timeout_s, GRAMMAR_COMPILE_MAX_MEMORY_BYTES, max_builders=num_workers)
        self._slow_builders = IndexWorker(timeout_s, GRAMMAR_COMPILE_MAX_MEMORY_BYTES, max_builders=num_slow_workers)
        # Compiles running in the fast lane, and those in the slow lane (building or queued).
        # _num_slow < num_slow_workers means a slow thread and a slow builder are free now.
        self._num_fast = 0
        self._num_slow = 0
        self._count_lock = threading.Lock()  # guards the counts and the moves between lanes

    def num_compiles_in_flight(self) -> int:
        """Compiles started and not yet ended, in both lanes (one queued in the slow lane counts:
        it started in the fast lane). Compiles waiting for a fast-lane thread do not."""
        with self._count_lock:
            return self._num_fast + self._num_slow

    def num_slow_compiles(self) -> int:
        """Compiles in the slow lane, building or queued there."""
        with self._count_lock:
            return self._num_slow

    def builder_pids(self) -> list[int]:
        """The pids of the index-building children alive now, both lanes (for tests)."""
        return sorted(self._fast_builders.pids + self._slow_builders.pids)

    @property
    def lowering_settings(self) -> LoweringSettings:
        return outlines_settings(self.whitespace_pattern)

    def _lower(self, kind: str, normalized: str) -> LoweredGrammar:
        return lower_normalized(kind, normalized, self.whitespace_pattern)

    def _submit(self, lowering: Callable[[], LoweredGrammar]) -> Future[CompiledGrammar]:
        """Starts compiling the regex of `lowering()` (called in the compile thread) in the fast lane."""
        future: Future[CompiledGrammar] = Future()
        job = self._executor.submit(self._compile_in_fast_lane, lowering, future)
        job.add_done_callback(lambda job: job.cancelled() and future.cancel())  # queued at shutdown
        return future

    def _compile_in_fast_lane(self, lowering: Callable[[], LoweredGrammar], future: Future[CompiledGrammar]) -> None:
        """Runs in a fast-lane thread. The first call also builds the tokenizer's vocabulary."""
        if not future.set_running_or_notify_cancel():
            return
        with self._count_lock:
            self._num_fast += 1
        is_moved = False
        try:
            vocab = get_grammar_vocabulary(self.tokenizer)
            start = time.perf_counter()
            lowered = lowering()
            job = _Compile(lowered.kind, lowered.form, vocab, start, future)
            build = self._start(job, self._fast_builders)
            if self._fast_builders.is_answering(build, build.started + self.fast_lane_deadline_s):
                self._finish(job, self._fast_builders, build)
            else:
                is_moved = True
                self._move_to_slow_lane(job, build)
        except BaseException as e:
            _fail(future, e)
        finally:
            if not is_moved:
                with self._count_lock:
                    self._num_fast -= 1

    def _move_to_slow_lane(self, job: _Compile, build: Build) -> None:
        """Frees the fast builder of a build past the fast lane's deadline: hands its child over to
        the slow lane if it has room, else kills it and queues the compile there (FIFO)."""
        with self._count_lock:
            is_handed_over = self._num_slow < self.num_slow_workers and self._fast_builders.hand_over(
                build, self._slow_builders)
            self._num_fast -= 1
            self._num_slow += 1
        moved = build if is_handed_over else None
        if moved is None:
            self._fast_builders.cancel(build)
        try:
            slow_job = self._slow_executor.submit(self._compile_in_slow_lane, job, moved)
        except RuntimeError:  # shut down meanwhile
            self._end_slow_compile(job, moved, None)
            return
        slow_job.add_done_callback(functools.partial(self._end_slow_compile, job, moved))

    def _compile_in_slow_lane(self, job: _Compile, build: Build | None) -> None:
        """Runs in a slow-lane thread: finishes a handed-over build, or builds again (None)."""
        try:
            self._finish(job, self._slow_builders, build or self._start(job, self._slow_builders))
        except BaseException as e:
            _fail(job.future, e)

    def _end_slow_compile(self, job: _Compile, moved: Build | None, slow_job: Future[None] | None) -> None:
        with self._count_lock:
            self._num_slow -= 1
        if slow_job is None or slow_job.cancelled():  # the backend shut down before it ran
            if moved is not None:
                self._slow_builders.cancel(moved)
            _fail(job.future, GrammarError("the grammar backend shut down before the grammar compiled"))

    @staticmethod
    def _start(job: _Compile, builders: IndexWorker) -> Build:
        try:
            return builders.start(job.index_request, job.vocab.vocabulary)
        except ValueError as e:
            raise _compile_error(job.kind, job.regex, str(e)) from None

    def _finish(self, job: _Compile, builders: IndexWorker, build: Build) -> None:
        """Waits for `build`'s index (up to its deadline) and resolves the job's future with the
        compiled grammar (or raises GrammarError)."""
        index, distances = _checked_index(job.kind, job.regex, lambda: builders.result(build))
        jump_forward = None
        if self.enable_jump_forward:
            # in-process, and only after the bounded token index: the same regex's DFA, walked
            # with 256 one-byte tokens instead of the whole vocabulary, so it costs less
            jump_forward = JumpForward(job.regex, self.tokenizer.encode_plain, job.vocab.id_to_bytes)
        compiled = CompiledGrammar(
            job.kind,
            job.regex,
            index,
            job.vocab.eos_token_id,
            self.tokenizer.vocab_size,
            self.vocab_size,
            time.perf_counter() - job.start,
            jump_forward,
            distances,
        )
        with contextlib.suppress(InvalidStateError):  # failed at shutdown meanwhile
            job.future.set_result(compiled)

    def shutdown(self) -> None:
        """Stops both lanes; queued compiles are cancelled (or fail, if they had started), running
        ones fail (their builders are killed)."""
        super().shutdown()
        self._slow_executor.shutdown(wait=False, cancel_futures=True)
        self._fast_builders.close()
        self._slow_builders.close()


def _fail(future: Future[CompiledGrammar], error: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):  # already failed (at shutdown)
        future.set_exception(error)
