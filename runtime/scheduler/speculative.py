"""Speculative decoding's drafting side: what a running request's next forward verifies.

The scheduler verifies a draft in one forward (see `scheduler`): a request feeds
`[last token, *draft]`, gets one logits row per position, samples every row from the target
distribution under its grammar mask, and keeps the draft while the samples equal it. For a
deterministic draft that is exact rejection sampling: the output follows the target distribution
(greedy: it is token-for-token the non-speculative output), whatever the draft.

A request's draft (`Req.jump_forward_ids`), built after each step by `Drafter.draft`:
  1. the tokens its grammar forces (jump-forward), undrafted and first;
  2. with `--speculative-algorithm NGRAM`, then the request's n-gram allowance of prompt-lookup
     tokens (`ngram_draft`) continuing them; when its own prompt and output have no match, of
     the tokens that followed its context in an earlier request's output (`ngram_cache`, shared
     by every request, fed as requests finish; its context must agree over CACHE_MIN_AGREEMENT
     tokens). The allowance follows the match: it starts at `--speculative-num-draft-tokens`,
     doubles after a step that accepted all its n-gram tokens (up to MAX_NGRAM_ALLOWANCE: a long
     copy, a quote or an e-mail, goes on in long drafts) and halves after one that accepted none
     (down to 0: no n-gram rows); at 0 the proposal is still made but not verified, and once its
     first token is the one the request samples next, the allowance is 1 again. Each source (own
     text, earlier outputs) has an allowance of its own: earlier outputs that keep missing must
     not silence a prompt that copies well. Free text that rarely repeats its prompt thus pays
     for a few extra rows, then none. After a full hit of its own text whose extra sampled token
     also continues the source, the next draft reads on from the same source position (a copy
     pointer, `Req.ngram_copy_next`) rather than a fresh lookup: that source agrees with the
     output at least as far as any other candidate; with `--speculative-algorithm STANDALONE`, instead, `num_draft_tokens`
     tokens of the draft model (`draft_model`), asked for all requests at once after the step
     (`draft_with_model`);
  3. cut before the first EOS / stop token id (nothing after it would be used), at the first
     token the request's grammar refuses (`valid_prefix_len`: a refused token could never be
     accepted, and the masks along a draft need an allowed draft), and at the request's room
     (context length, max_new_tokens: `max_len`).
No n-gram drafts while a reasoning request is still reasoning (its grammar starts mid-draft), nor,
by default (`SpeculativeConfig.constrained_only`: --speculative-algorithm unset), for a request
without a grammar.

Compute-bound steps (`Drafter.fit_budget`, before each step): a CPU decode step of a small batch
is bound by reading the weights, so k more query rows cost little; a large batch is bound by the
arithmetic, where every rejected row is a loss. So the step's query rows — one per running
request plus every n-gram draft token — are kept within MAX_VERIFY_ROWS: past it, each request's
n-gram tokens are cut to an equal share of what is left (none at all once the running requests
alone reach it). Forced tokens are never cut here: each of them saves a step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.config.speculative_config import SpeculativeConfig
from radixlm.runtime.constrained.grammar import MAX_JUMP_FORWARD_TOKENS
from radixlm.runtime.scheduler.draft_model import DraftModel, DraftWant
from radixlm.runtime.scheduler.ngram_cache import NgramCache
from radixlm.runtime.scheduler.ngram_draft import NgramIndex, TokenSeq, continuation
from radixlm.runtime.scheduler.req import Req

# Query rows a decode step may have with n-gram drafts: one per running request + draft tokens.
# (One measurement on a shared 2-core EPYC, SmolLM2-135M int8: a 1-row decode step 1.0, 2 rows
# 1.5, 5 rows ~1.8, 9 rows ~2.6, 17 rows ~3.5: a fully accepted 16-token draft costs ~5x less
# per token than decoding; a short draft needs most of its tokens accepted to pay.)
MAX_VERIFY_ROWS = 16
# An n-gram allowance grows up to this (with the default flag: 4, 8, 15): the room at batch 1.
MAX_NGRAM_ALLOWANCE = MAX_VERIFY_ROWS - 1
# Tokens an earlier request's context must share with a request's end for it to draft from it.
# Requests of one schema share short contexts whose continuations differ (`", "email": "` then
# each one's own address): on W6's step records (SmolLM2-135M) a cache proposal agreeing over 3-5
# tokens had the next token right 21% of the time, over 6 or more 59%; NgramCache also wants most
# of the places agreeing that far to go on alike (68%).
CACHE_MIN_AGREEMENT = 6
# The longest draft of a constrained request: the grammar wrappers roll back at most this many.
MAX_GRAMMAR_DRAFT = MAX_JUMP_FORWARD_TOKENS


class Drafter:
    """Builds each running request's draft (see the module docstring); one per scheduler."""

    def __init__(self, cfg: SpeculativeConfig | None, draft_model: DraftModel | None = None):
        self.cfg = cfg  # None: drafts are the forced tokens only (speculation off)
        self.draft_model = draft_model  # STANDALONE's (then required)
        if (cfg is not None and cfg.algorithm == "STANDALONE") != (draft_model is not None):
            raise ValueError("a draft model goes with --speculative-algorithm STANDALONE, and only with it")
        # NGRAM: earlier requests' outputs, drafted from when a request's own text has no match
        self.ngram_cache = None if cfg is None or cfg.algorithm != "NGRAM" or cfg.ngram_capacity == 0 else \
            NgramCache(cfg.ngram_capacity, cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size,
                       CACHE_MIN_AGREEMENT)
        self._model_wants: list[tuple[Req, int]] = []  # STANDALONE: drafted by `draft_with_model`
        # since start, over every request: verify steps, tokens they took, n-gram tokens accepted
        self.num_verify = self.num_verified_tokens = self.num_correct_drafts = 0

    def server_info(self) -> dict[str, float | int]:
        """Speculation's counts for /get_server_info (none while it is off); SGLang reports the
        average accept length (tokens per verify step) as `avg_spec_accept_length`."""
        if self.cfg is None:
            return {}
        return {"avg_spec_accept_length": self.num_verified_tokens / max(1, self.num_verify),
                "spec_verify_ct": self.num_verify, "spec_num_correct_drafts": self.num_correct_drafts}

    def speculates(self, req: Req) -> bool:
        """Whether `req` drafts and is counted as speculating (by default: only under a grammar)."""
        return self.cfg is not None and (req.grammar is not None or not self.cfg.constrained_only)

    def draft(self, req: Req, forced: list[int], max_len: int) -> list[int]:
        """The request's next draft: `forced` (its grammar's jump-forward tokens, allowed from
        its state), then its n-gram continuation, cut as the module docstring says; at most
        `max_len` tokens. Sets `req.num_forced_draft`."""
        cfg = self.cfg
        draft = forced[: max(0, max_len)]
        req.num_forced_draft = len(draft)
        copy_next, req.ngram_copy_next = req.ngram_copy_next, None  # valid for this draft only
        if not self.speculates(req) or req.reasoning_end is not None or max_len <= len(draft):
            return draft  # (no room: no proposal, nor a shadow one, whatever the source)
        if self.draft_model is not None:
            self._model_wants.append((req, self._room(req, cfg.num_draft_tokens, len(draft), max_len)))
            return draft
        if req.ngram_allowance is None:
            req.ngram_allowance = req.ngram_cache_allowance = cfg.num_draft_tokens
        if req.ngram_index is None:
            req.ngram_index = NgramIndex(cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size)
        seq = TokenSeq(req.input_ids, req.output_ids)
        if not draft and copy_next is not None and copy_next < len(seq):
            start = copy_next
        else:
            start = req.ngram_index.match(seq, draft)
        req.ngram_source, req.ngram_from_cache = start, start < 0 and self.ngram_cache is not None
        allowance = _allowance(req)
        if allowance == 0 and not draft and max_len > 0:  # off: watch whether it would hit
            shadow = self._proposal(seq, draft, req, 1)
            req.ngram_shadow = shadow[0] if shadow else None
        room = self._room(req, allowance or 0, len(draft), max_len)
        if room <= 0:
            return draft
        return draft + self._cut(req, draft, self._proposal(seq, draft, req, room))

    def _proposal(self, seq: TokenSeq, tail: list[int], req: Req, max_tokens: int) -> list[int]:
        """Up to `max_tokens` n-gram tokens after seq + tail from the source `draft` chose: the
        request's own text from `req.ngram_source`, or earlier requests' outputs."""
        if req.ngram_from_cache:
            assert self.ngram_cache is not None
            return self.ngram_cache.propose(seq, tail, max_tokens)
        return [] if req.ngram_source < 0 else continuation(seq, tail, req.ngram_source, max_tokens)

    @staticmethod
    def _room(req: Req, allowance: int, num_forced: int, max_len: int) -> int:
        """Speculative tokens a draft may add after `num_forced` forced ones."""
        room = min(allowance, max_len - num_forced)
        return room if req.grammar is None else min(room, MAX_GRAMMAR_DRAFT - num_forced)

    @staticmethod
    def _cut(req: Req, forced: list[int], proposal: list[int]) -> list[int]:
        """`proposal` cut before an EOS / stop token id and at the first token the grammar refuses."""
        ends = req.eos_token_ids if not req.params.ignore_eos else frozenset()
        for i, token in enumerate(proposal):
            if token in ends or token in req.params.stop_token_ids:
                proposal = proposal[:i]
                break
        if proposal and req.grammar is not None:
            proposal = proposal[: req.grammar.valid_prefix_len(forced + proposal) - len(forced)]
        return proposal

    def draft_with_model(self, num_running: int) -> None:
        """STANDALONE: the draft model's tokens for the requests `draft` was asked for since the
        last call (one batched proposal), each cut like an n-gram proposal and within a share of
        MAX_VERIFY_ROWS among the `num_running` requests; appended to their drafts."""
        wants, self._model_wants = [(r, room) for r, room in self._model_wants if room > 0 and not r.is_finished], []
        if self.draft_model is None or not wants:
            return
        if num_running + sum(room for _, room in wants) > MAX_VERIFY_ROWS:
            share = max(0, MAX_VERIFY_ROWS - num_running) // max(1, num_running)
            wants = [(r, min(room, share)) for r, room in wants if share > 0]
        proposals = self.draft_model.propose([
            DraftWant(r.rid, [*r.input_ids, *r.output_ids, *r.jump_forward_ids], room, _grammar_mask_fn(r),
                      frozenset(r.params.stop_token_ids) | (frozenset() if r.params.ignore_eos else r.eos_token_ids))
            for r, room in wants])
        for req, _ in wants:
            proposal = proposals.get(req.rid, [])
            req.jump_forward_ids = req.jump_forward_ids + self._cut(req, req.jump_forward_ids, proposal)

    def release(self, req: Req) -> None:
        """The request left the running set: free what the draft model holds for it; a finished
        drafting request's output goes to the shared n-gram cache (a retracted one comes back; by
        default only constrained requests draft, and only their outputs are kept)."""
        if self.draft_model is not None:
            self.draft_model.release(req.rid)
        if self.ngram_cache is not None and req.is_finished and req.output_ids and self.speculates(req):
            self.ngram_cache.add(req.input_ids, req.output_ids)

    def flush(self) -> None:
        """Forget earlier requests' outputs (with the prefix cache: `/flush_cache`)."""
        if self.ngram_cache is not None:
            self.ngram_cache.clear()

    def fit_budget(self, running: list[Req]) -> None:
        """Cut the running requests' n-gram tokens to keep the step within MAX_VERIFY_ROWS."""
        if self.cfg is None or not running:
            return
        num_drafted = sum(len(r.jump_forward_ids) - r.num_forced_draft for r in running)
        if len(running) + num_drafted <= MAX_VERIFY_ROWS:
            return
        share = max(0, MAX_VERIFY_ROWS - len(running)) // len(running)
        for req in running:
            keep = req.num_forced_draft + share
            if len(req.jump_forward_ids) > keep:
                req.jump_forward_ids = req.jump_forward_ids[:keep]

    def record_verify(self, req: Req, draft: list[int], new_ids: list[int]) -> None:
        """Count one verify step of `req` whose draft was `draft` and which took `new_ids`."""
        if self.cfg is None or not self.speculates(req):
            return
        allowance = _allowance(req)
        if req.ngram_shadow is not None:
            if new_ids and new_ids[0] == req.ngram_shadow and allowance == 0:
                _set_allowance(req, 1)
            req.ngram_shadow = None
        req.spec_verify_ct += 1
        self.num_verify += 1
        self.num_verified_tokens += len(new_ids)
        req.spec_num_proposed_drafts += len(draft) - req.num_forced_draft
        accepted = 0
        for token, drafted in zip(new_ids, draft):
            if token != drafted:
                break
            accepted += 1
        num_drafted, num_correct = len(draft) - req.num_forced_draft, max(0, accepted - req.num_forced_draft)
        req.spec_num_correct_drafts += num_correct
        self.num_correct_drafts += num_correct
        if num_drafted and allowance is not None:
            if num_correct == 0:
                _set_allowance(req, allowance // 2)
            elif num_correct == num_drafted:
                _set_allowance(req, min(max(self.cfg.num_draft_tokens, MAX_NGRAM_ALLOWANCE), allowance * 2))
                self._follow_copy(req, draft, new_ids)

    @staticmethod
    def _follow_copy(req: Req, draft: list[int], new_ids: list[int]) -> None:
        """After a full hit of a draft without forced tokens: when the token sampled after it is
        also the source's next one, the next draft continues from the source (`ngram_copy_next`)."""
        if req.num_forced_draft or req.ngram_source < 0 or len(new_ids) != len(draft) + 1:
            return
        source_next = req.ngram_source + len(draft)  # < the draft's sequence length: the source preceded it
        seq = TokenSeq(req.input_ids, req.output_ids)
        if seq[source_next] == new_ids[-1]:
            req.ngram_copy_next = source_next + 1


def _allowance(req: Req) -> int | None:
    """The n-gram allowance of the source the request's last proposal came from."""
    return req.ngram_cache_allowance if req.ngram_from_cache else req.ngram_allowance


def _set_allowance(req: Req, allowance: int) -> None:
    if req.ngram_from_cache:
        req.ngram_cache_allowance = allowance
    else:
        req.ngram_allowance = allowance


def _grammar_mask_fn(req: Req) -> Callable[[list[int], int], torch.Tensor] | None:
    """For a constrained request: the allowed-token row after its forced tokens + what the draft
    model drafted so far (no budget steering: verification applies it)."""
    grammar, forced = req.grammar, list(req.jump_forward_ids)
    if grammar is None:
        return None

    def next_mask(drafted: list[int], vocab_size: int) -> torch.Tensor:
        draft = forced + drafted
        rows = torch.zeros(len(draft) + 1, vocab_size, dtype=torch.bool)
        grammar.fill_vocab_masks(rows, draft)
        return rows[-1]

    return next_mask
