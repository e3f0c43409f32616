"""The one form a batch takes when it reaches the model: `ForwardBatch`.

Whoever schedules requests (the Engine loop now, the Scheduler later) turns its requests into a
ForwardBatch with `ForwardBatch.extend(...)` or `ForwardBatch.decode(...)`; the model runner only
executes it. Token order in every flat tensor is request order, then position order.

Extend: request b has `prefix_lens[b]` tokens already in the KV pool and `extend_lens[b]` new
tokens (prefill is extend with prefix 0). Decode: every request has exactly one new token.
`out_cache_loc` holds the KV slots allocated for the new tokens, already recorded in
`req_to_token` by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"


@dataclass(frozen=True)
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    out_cache_loc: torch.Tensor  # int64 [num_tokens], KV slots of the new tokens
    req_pool_indices: torch.Tensor  # int64 [batch]
    seq_lens: torch.Tensor  # int64 [batch], prefix + new tokens
    prefix_lens: torch.Tensor  # int64 [batch]
    extend_lens: torch.Tensor  # int64 [batch] (all ones for decode)
    extend_start_loc: torch.Tensor  # int64 [batch], offset of each request's first new token
    logits_indices: torch.Tensor  # int64 [num_logits], rows of the hidden states to project
    seq_lens_list: tuple[int, ...]  # host copies, so backends never sync on tensors
    prefix_lens_list: tuple[int, ...]
    extend_lens_list: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

    @classmethod
    def extend(
        cls,
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        new_token_ids: Sequence[Sequence[int]],
        out_cache_loc: torch.Tensor,
        logits_indices: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """An extend batch; by default logits are computed for each request's last new token."""
        extend_lens = [len(ids) for ids in new_token_ids]
        if any(n == 0 for n in extend_lens):
            raise ValueError("every request in an extend batch needs at least one new token")
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        starts = _exclusive_cumsum(extend_lens)
        positions = torch.cat(
            [torch.arange(p, p + n, dtype=torch.int64) for p, n in zip(prefix_lens, extend_lens)]
        )
        if logits_indices is None:
            logits_indices = torch.tensor([s + n - 1 for s, n in zip(starts, extend_lens)], dtype=torch.int64)
        flat_ids = [t for ids in new_token_ids for t in ids]
        return cls(
            mode=ForwardMode.EXTEND,
            input_ids=torch.tensor(flat_ids, dtype=torch.int64),
            positions=positions,
            out_cache_loc=out_cache_loc,
            req_pool_indices=torch.tensor(list(req_pool_indices), dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            prefix_lens=torch.tensor(list(prefix_lens), dtype=torch.int64),
            extend_lens=torch.tensor(extend_lens, dtype=torch.int64),
            extend_start_loc=torch.tensor(starts, dtype=torch.int64),
            logits_indices=logits_indices,
            seq_lens_list=tuple(seq_lens),
            prefix_lens_list=tuple(prefix_lens),
            extend_lens_list=tuple(extend_lens),
        )

    @classmethod
    def decode(
        cls,
        req_pool_indices: Sequence[int],
        seq_lens: Sequence[int],
        input_ids: Sequence[int],
        out_cache_loc: torch.Tensor,
    ) -> ForwardBatch:
        """A decode batch: one new token per request; `seq_lens` include that token."""
        batch = len(seq_lens)
        seq = torch.tensor(list(seq_lens), dtype=torch.int64)
        ones = torch.ones(batch, dtype=torch.int64)
        return cls(
            mode=ForwardMode.DECODE,
            input_ids=torch.tensor(list(input_ids), dtype=torch.int64),
            positions=seq - 1,
            out_cache_loc=out_cache_loc,
            req_pool_indices=torch.tensor(list(req_pool_indices), dtype=torch.int64),
            seq_lens=seq,
            prefix_lens=seq - 1,
            extend_lens=ones,
            extend_start_loc=torch.arange(batch, dtype=torch.int64),
            logits_indices=torch.arange(batch, dtype=torch.int64),
            seq_lens_list=tuple(seq_lens),
            prefix_lens_list=tuple(s - 1 for s in seq_lens),
            extend_lens_list=(1,) * batch,
        )


def _exclusive_cumsum(values: Sequence[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        out.append(total)
        total += v
    return out
