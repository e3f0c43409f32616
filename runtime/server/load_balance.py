"""Which data-parallel rank a request goes to (`--dp-size N`, `--load-balance-method`).

In: a request's prompt token ids when it is dispatched, and its end. Out: a rank in [0, N).
No I/O: the tokenizer manager owns the sockets and calls `select` / `on_finish`.

Methods (SGLang's names, plus `prefix_affinity`, ours and the default):
  round_robin      ranks in turn
  total_requests   the rank with the fewest requests in flight
  total_tokens     the rank with the fewest prompt tokens in flight
  prefix_affinity  the rank whose cache most likely holds the prompt's prefix (below), unless that
                   rank is overloaded against the least loaded one; a prompt that matches no rank
                   well goes to the least loaded rank, and among those to the one whose index is
                   smallest (so new families spread over the ranks)
Remaining ties go to the rank that has been sent the fewest requests so far, so sequential traffic
on an idle server alternates.

The prefix index is approximate (as sglang-router's cache_aware tree): per rank, the chained hashes
of the BLOCK_SIZE-token blocks of the prompts sent there (the KV events' block hashes, docs/scaling-out.md, "KV events"), in LRU order, at most as many blocks as
that rank's KV pool holds. A rank "holds" the first k blocks of a prompt when the hash of each of
them is in its index. The index never hears of the rank's evictions (they make it optimistic),
and is cleared when the caches are flushed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixlm.runtime.mem_cache.kv_events import chain_block_hashes

BLOCK_SIZE = 16  # tokens per indexed block
PREFIX_MIN_SHARE = 0.3  # a match shorter than this share of the prompt is no match (cache_aware's threshold)
# prefix_affinity leaves its rank for the least loaded one when both hold: in-flight requests
# there exceed the least loaded rank's by more than BALANCE_ABS and are over BALANCE_REL times them
BALANCE_ABS = 4
BALANCE_REL = 1.5


@dataclass
class RankLoad:
    num_reqs: int = 0  # in flight
    num_tokens: int = 0  # prompt tokens in flight
    num_dispatched_reqs: int = 0  # ever sent here


class PrefixIndex:
    """One rank's approximate cache contents: block hashes in LRU order, at most `capacity`."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def num_matched_blocks(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)


class LoadBalancer:
    def __init__(self, method: str, dp_size: int, max_total_num_tokens: int):
        self.method = method
        self.loads = [RankLoad() for _ in range(dp_size)]
        self.indexes = [PrefixIndex(max_total_num_tokens // BLOCK_SIZE) for _ in range(dp_size)]
        self._next = 0
        self._methods: dict[str, Callable[[Sequence[int]], int]] = {
            "round_robin": self._round_robin,
            "total_requests": lambda ids: self._least_loaded(range(dp_size), "num_reqs"),
            "total_tokens": lambda ids: self._least_loaded(range(dp_size), "num_tokens"),
            "prefix_affinity": self._prefix_affinity,
        }
        if method not in self._methods:
            raise ValueError(f"unknown load balance method {method!r}; one of {', '.join(self._methods)}")

    @property
    def dp_size(self) -> int:
        return len(self.loads)

    def select(self, ids: Sequence[int], requested: int | None = None) -> int:
        """The rank for a request with prompt `ids` (`requested`, the rank it asked for, if any),
        counted as in flight there until `on_finish`."""
        if requested is not None:
            rank = requested
            if self.method == "prefix_affinity":
                self.indexes[rank].insert(chain_block_hashes(ids, BLOCK_SIZE))
        else:
            rank = 0 if self.dp_size == 1 else self._methods[self.method](ids)
        load = self.loads[rank]
        load.num_reqs += 1
        load.num_tokens += len(ids)
        load.num_dispatched_reqs += 1
        return rank

    def on_finish(self, rank: int, num_prompt_tokens: int) -> None:
        load = self.loads[rank]
        load.num_reqs -= 1
        load.num_tokens -= num_prompt_tokens

    def on_flush(self) -> None:
        for index in self.indexes:
            index.clear()

    def _round_robin(self, ids: Sequence[int]) -> int:
        rank = self._next
        self._next = (rank + 1) % self.dp_size
        return rank

    def _least_loaded(self, ranks: Sequence[int], key: str, by_index_size: bool = False) -> int:
        def order(r: int) -> tuple[int, int, int, int]:
            index_size = len(self.indexes[r]) if by_index_size else 0
            return getattr(self.loads[r], key), index_size, self.loads[r].num_dispatched_reqs, r

        return min(ranks, key=order)

    def _prefix_affinity(self, ids: Sequence[int]) -> int:
        hashes = chain_block_hashes(ids, BLOCK_SIZE)
        matched = [index.num_matched_blocks(hashes) for index in self.indexes]
        best = max(matched)
        all_ranks = range(self.dp_size)
        is_match = best > 0 and best * BLOCK_SIZE >= PREFIX_MIN_SHARE * len(ids)
        if is_match:
            rank = self._least_loaded([r for r in all_ranks if matched[r] == best], "num_reqs")
        else:
            rank = self._least_loaded(all_ranks, "num_reqs", by_index_size=True)
        idlest = self._least_loaded(all_ranks, "num_reqs")
        here, there = self.loads[rank].num_reqs, self.loads[idlest].num_reqs
        if here - there > BALANCE_ABS and here > BALANCE_REL * there:
            rank = idlest
        self.indexes[rank].insert(hashes)
        return rank
