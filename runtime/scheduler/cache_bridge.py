"""The one bridge between requests and the prefix cache / KV pools.

It moves KV ownership between a request and the cache (see `Req` and `radix_cache` for the
contracts) and can verify, at any moment, that every slot is owned exactly once:
    kv_pool.num_free + cache.tree_tokens + sum(request-owned slots) == kv_pool.max_total_num_tokens
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.mem_cache.radix_cache import BasePrefixCache, NoopRadixCache
from radixlm.runtime.scheduler.req import Req


class CacheBridge:
    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool, cache: BasePrefixCache):
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.cache = cache
        self.is_caching = not isinstance(cache, NoopRadixCache)
        self.num_evicted_tokens = 0  # freed by eviction since start (a counter for metrics)

    def match(self, req: Req) -> None:
        """Find the cached prefix a waiting request could reuse (sets prefix_slots / prefix_node).

        At least one token is always left to compute (its logits are needed), and positions from
        `logprob_start_len - 1` on are recomputed when input logprobs are asked for (the logits
        at position p give the logprob of prompt token p + 1).
        """
        ids = req.all_ids
        limit = len(ids) - 1
        if req.logprob.return_logprob and req.logprob.logprob_start_len >= 0:
            limit = min(limit, max(0, req.logprob.logprob_start_len - 1))
        result = self.cache.match_prefix(ids[:limit], namespace=req.cache_salt)
        req.prefix_slots, req.prefix_node = result.slots, result.last_node

    def admit(self, req: Req) -> bool:
        """Give a request a KV row holding its matched prefix (locked). False: no row free."""
        row = self.req_to_token_pool.alloc()
        if row is None:
            return False
        assert req.prefix_slots is not None and req.prefix_node is not None
        prefix_len = req.prefix_slots.numel()
        self.cache.record_stats(req.seq_len, prefix_len)  # hit rate over admitted requests
        self.cache.inc_lock_ref(req.prefix_node)
        self.req_to_token_pool.write(row, 0, req.prefix_slots)
        req.req_pool_idx, req.last_node = row, req.prefix_node
        req.num_cached = req.cache_prefix_len = prefix_len
        if not req.is_retracted:
            req.cached_tokens = prefix_len
        req.prefix_slots = req.prefix_node = None
        return True

    def cache_unfinished(self, req: Req) -> None:
        """Hand a running request's computed tokens to the cache so others can reuse them now;
        the request keeps reading them through a lock on the new last node."""
        if not self.is_caching:
            return
        ids, slots = self._computed(req)
        taken_from = self.cache.insert(ids, slots, namespace=req.cache_salt)
        self.kv_pool.free(slots[req.cache_prefix_len : taken_from])  # duplicates of cached K/V
        result = self.cache.match_prefix(ids, namespace=req.cache_salt)
        assert result.slots.numel() == len(ids)
        self.req_to_token_pool.write(req.req_pool_idx, 0, result.slots)  # type: ignore[arg-type]
        self.cache.inc_lock_ref(result.last_node)
        self.cache.dec_lock_ref(req.last_node)  # type: ignore[arg-type]
        req.last_node, req.cache_prefix_len = result.last_node, len(ids)

    def release(self, req: Req, keep_in_cache: bool) -> None:
        """Free a request's row; its computed tokens go to the cache (finished) or the pool."""
        ids, slots = self._computed(req)
        if keep_in_cache:
            taken_from = self.cache.insert(ids, slots, namespace=req.cache_salt)
            self.kv_pool.free(slots[req.cache_prefix_len : taken_from])
        else:
            self.kv_pool.free(slots[req.cache_prefix_len :])
        self.cache.dec_lock_ref(req.last_node)  # type: ignore[arg-type]
        self.req_to_token_pool.free(req.req_pool_idx)  # type: ignore[arg-type]
        req.req_pool_idx = req.last_node = None
        req.num_cached = req.cache_prefix_len = 0

    def truncate(self, req: Req, num_cached: int) -> None:
        """Free the request-owned K/V of positions [num_cached, req.num_cached) (a rejected
        jump-forward draft); `num_cached` must not reach into the cache's part."""
        if num_cached >= req.num_cached:
            return
        assert req.req_pool_idx is not None and num_cached >= req.cache_prefix_len
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, num_cached : req.num_cached]
        self.kv_pool.free(slots.to(torch.int64))
        req.num_cached = num_cached

    def _computed(self, req: Req) -> tuple[list[int], torch.Tensor]:
        assert req.req_pool_idx is not None and req.last_node is not None
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.num_cached].to(torch.int64)
        return req.token_ids(0, req.num_cached), slots

    def available_tokens(self) -> int:
        """Slots obtainable now: free ones plus what eviction could release."""
        return self.kv_pool.num_free + self.cache.evictable_tokens

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Allocate slots, evicting from the cache first if the pool is short."""
        if num_tokens > self.kv_pool.num_free:
            self.num_evicted_tokens += self.cache.evict(num_tokens - self.kv_pool.num_free)
        return self.kv_pool.alloc(num_tokens)

    def check_integrity(self, running: Iterable[Req]) -> None:
        """Raise AssertionError unless every KV slot is owned exactly once."""
        owned = sum(r.num_cached - r.cache_prefix_len for r in running if r.req_pool_idx is not None)
        total = self.kv_pool.num_free + self.cache.tree_tokens + owned
        assert total == self.kv_pool.max_total_num_tokens, (
            f"KV slots leaked or double-owned: free {self.kv_pool.num_free} + cached "
            f"{self.cache.tree_tokens} + running {owned} != {self.kv_pool.max_total_num_tokens}"
        )
        self.cache.check_invariants()
