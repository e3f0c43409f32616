"""STANDALONE speculative decoding's drafter: a smaller model with the target's vocabulary that
proposes each running request's next tokens greedily (`--speculative-algorithm STANDALONE
--speculative-draft-model-path P`).

It has its own ModelRunner (weights, KV pool, request->token rows) in the scheduler process and a
plain per-request cache, no radix tree: `_DraftSeq.ids` are the tokens whose K/V the draft pool
holds for a request, positions 0..len-1. A proposal for context C (the request's prompt + output
+ its forced tokens) keeps the longest common prefix of `ids` and C (freeing the slots after
it), extends the rest of C in one batched forward (whose last row gives the first draft token),
then runs k-1 batched decode steps, each feeding the previous draft token. After verification
the rejected draft tokens are simply a divergence from the next context, freed by the next
proposal. A request's rows and slots are freed when it leaves the running set (`release`: it
finished, was aborted or retracted); `check_integrity` asserts that nothing leaked.

Greedy drafts: the target's verification keeps its output distribution whatever the draft (see
`speculative`), so the draft model needs no sampling. A constrained request's draft tokens are
picked among those its grammar allows (`DraftWant.next_mask`, filled along the draft so far),
so its draft follows the format the target is held to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from radixlm.runtime.model.forward_batch import ForwardBatch
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig
from radixlm.runtime.tokenizer.tokenizer import Tokenizer


@dataclass
class _DraftSeq:
    row: int  # its row of the draft runner's request->token pool
    ids: list[int] = field(default_factory=list)  # tokens with K/V in the draft pool, from position 0


@dataclass(frozen=True)
class DraftWant:
    """One request's ask: `num_tokens` draft tokens after `context` (prompt + output + forced).
    `next_mask(drafted, vocab_size)`: the allowed tokens (bool [vocab_size], True = allowed) after
    the tokens drafted so far, for a request with a grammar (None: every token)."""

    rid: str
    context: list[int]
    num_tokens: int
    next_mask: Callable[[list[int], int], torch.Tensor] | None = None
    stop_ids: frozenset[int] = frozenset()  # a drafted one ends the draft (nothing after it is used)


def load_draft_runner(path: str, target: ModelRunner, tokenizer: Tokenizer) -> ModelRunner:
    """The draft model's runner: the target's settings (dtype policy, context length, rows), a KV
    pool of as many tokens as the target's. Refuses a model whose vocabulary differs from the
    target's (its size, and when the draft model has a tokenizer of its own, its tokens)."""
    from radixlm.runtime.model.model_files import resolve_model_path

    model_dir = Path(resolve_model_path(path))
    cfg = ModelConfig.from_dir(model_dir)
    refusal = f"--speculative-draft-model-path {path}: a draft model must share the target's tokenizer, but "
    if cfg.vocab_size != target.model_cfg.vocab_size:
        raise ValueError(refusal + f"its vocabulary has {cfg.vocab_size} tokens, the target's "
                         f"{target.model_cfg.vocab_size}")
    if (model_dir / "tokenizer.json").exists() or (model_dir / "tokenizer_config.json").exists():
        own = Tokenizer(model_dir)
        ids = list(range(min(own.vocab_size, tokenizer.vocab_size)))
        if own.vocab_size != tokenizer.vocab_size or own.convert_ids_to_tokens(ids) != tokenizer.convert_ids_to_tokens(ids):
            raise ValueError(refusal + "its tokenizer's tokens differ from the target's")
    # "gguf" demands quantized tensors, which a float draft model lacks: "auto" keeps any it has
    quantization = "auto" if target.cfg.quantization == "gguf" else target.cfg.quantization
    runner_cfg: RunnerConfig = replace(target.cfg, context_len=min(target.cfg.context_len, cfg.context_len),
                                       quantization=quantization,
                                       adaptive_threads=False)  # the target's governor sets the threads
    return ModelRunner.from_dir(Path(model_dir), runner_cfg)


class DraftModel:
    """Greedy drafts of a draft model for the running requests (see the module docstring)."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.kv_pool = runner.kv_pool
        self.rows = runner.req_to_token_pool
        self._seqs: dict[str, _DraftSeq] = {}  # rid -> what the draft pool holds for it

    @property
    def context_len(self) -> int:
        return self.runner.cfg.context_len

    def propose(self, wants: list[DraftWant]) -> dict[str, list[int]]:
        """Greedy draft tokens per rid (fewer or none when the draft pool or rows run short or the
        context would pass the draft model's length)."""
        wants = [w for w in wants if w.num_tokens > 0 and len(w.context) + w.num_tokens <= self.context_len]
        wants = [w for w in wants if self._seq(w.rid) is not None]
        chunks = [self._rewind(w) for w in wants]
        need = sum(len(c) for c in chunks) + sum(w.num_tokens - 1 for w in wants)
        if not wants or need > self.kv_pool.num_free:
            return {}
        seqs = [self._seqs[w.rid] for w in wants]
        slots = self.kv_pool.alloc(sum(len(c) for c in chunks))
        assert slots is not None
        offset = 0
        for seq, chunk in zip(seqs, chunks):
            self.rows.write(seq.row, len(seq.ids), slots[offset : offset + len(chunk)])
            offset += len(chunk)
        batch = ForwardBatch.extend([s.row for s in seqs], [len(s.ids) for s in seqs], chunks, slots)
        for seq, chunk in zip(seqs, chunks):
            seq.ids.extend(chunk)
        tokens = self._greedy(self.runner.forward(batch), wants, [[] for _ in wants])
        drafts = {w.rid: [t] for w, t in zip(wants, tokens)}
        for step in range(1, max(w.num_tokens for w in wants)):
            live = [(w, s) for w, s in zip(wants, seqs) if w.num_tokens > step and drafts[w.rid][-1] not in w.stop_ids]
            if not live:
                break
            drafts_live = [drafts[w.rid][-1] for w, _ in live]
            slots = self.kv_pool.alloc(len(live))
            assert slots is not None
            for (_, seq), slot in zip(live, slots):
                self.rows.write(seq.row, len(seq.ids), slot.view(1))
            batch = ForwardBatch.decode([s.row for _, s in live], [len(s.ids) + 1 for _, s in live], drafts_live, slots)
            for (_, seq), token in zip(live, drafts_live):
                seq.ids.append(token)
            live_wants = [w for w, _ in live]
            logits = self.runner.forward(batch)
            for w, token in zip(live_wants, self._greedy(logits, live_wants, [drafts[w.rid] for w in live_wants])):
                drafts[w.rid].append(token)
        return drafts

    def _seq(self, rid: str) -> _DraftSeq | None:
        """The request's draft sequence, made (with a free row) when it has none; None: no row free."""
        seq = self._seqs.get(rid)
        if seq is None:
            row = self.rows.alloc()
            if row is None:
                return None
            seq = self._seqs[rid] = _DraftSeq(row)
        return seq

    def _rewind(self, want: DraftWant) -> list[int]:
        """Keep the K/V of the longest common prefix of the request's cached ids and its context
        (at least the context's last token is recomputed: its logits give the first draft); free
        the rest. Returns the context's tokens to extend."""
        seq = self._seqs[want.rid]
        keep, limit = 0, min(len(seq.ids), len(want.context) - 1)
        while keep < limit and seq.ids[keep] == want.context[keep]:
            keep += 1
        self._truncate(seq, keep)
        return want.context[keep:]

    def _truncate(self, seq: _DraftSeq, length: int) -> None:
        if length < len(seq.ids):
            self.kv_pool.free(self.rows.req_to_token[seq.row, length : len(seq.ids)].to(torch.int64))
            del seq.ids[length:]

    @staticmethod
    def _greedy(logits: torch.Tensor, wants: list[DraftWant], drafted: list[list[int]]) -> list[int]:
        """Each row's most likely token, among those its grammar allows after `drafted`."""
        if any(w.next_mask is not None for w in wants):
            logits = logits.clone()  # the runner's output is an inference tensor
        for i, (want, done) in enumerate(zip(wants, drafted)):
            if want.next_mask is not None:
                logits[i].masked_fill_(~want.next_mask(done, logits.shape[-1]), float("-inf"))
        return [int(t) for t in logits.argmax(dim=-1).tolist()]

    def release(self, rid: str) -> None:
        """Free the request's draft K/V and row (it left the running set); no-op if it has none."""
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            self._truncate(seq, 0)
            self.rows.free(seq.row)

    def check_integrity(self, live_rids: Iterable[str]) -> None:
        """Every draft slot is free or held by one live request's sequence; rows likewise."""
        stale = set(self._seqs) - set(live_rids)
        assert not stale, f"draft K/V held for requests no longer running: {sorted(stale)}"
        held = sum(len(s.ids) for s in self._seqs.values())
        assert self.kv_pool.num_free + held == self.kv_pool.max_total_num_tokens, (
            f"draft KV slots leaked: free {self.kv_pool.num_free} + held {held} != {self.kv_pool.max_total_num_tokens}")
        assert self.rows.num_free + len(self._seqs) == self.rows.max_reqs, "draft request rows leaked"
