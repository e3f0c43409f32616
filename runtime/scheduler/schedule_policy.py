"""SchedulePolicy: orders the waiting queue. It decides order only, never admission.

  lpm         longest cached prefix first (default): maximises reuse of what is cached now
  dfs-weight  depth-first over the radix tree, heavier subtrees (more waiting requests) first, so
              requests sharing a prefix run next to each other
  fcfs        arrival order
  lof         longest output (max_new_tokens) first
  random      shuffled
Prefix-aware policies match every waiting request against the cache to rank it; admission
then uses that match (each waiting request is matched at most once per step, see `admission`).
With very long queues they fall back to fcfs, as matching each request costs time every step.
"""

from __future__ import annotations

import random
from collections import defaultdict

from radixlm.runtime.mem_cache.radix_cache import TreeNode
from radixlm.runtime.scheduler.cache_bridge import CacheBridge
from radixlm.runtime.scheduler.req import Req

MAX_PREFIX_MATCHED_QUEUE = 128


class SchedulePolicy:
    def __init__(self, policy: str, bridge: CacheBridge, seed: int | None = None):
        if policy not in ("lpm", "dfs-weight", "fcfs", "lof", "random"):
            raise ValueError(f"unknown schedule policy {policy!r}")
        self.policy = policy
        self.bridge = bridge
        self._rng = random.Random(seed)

    def order(self, waiting: list[Req]) -> list[Req]:
        """Return the waiting requests in the order admission should try them."""
        prefix_aware = self.policy in ("lpm", "dfs-weight") and self.bridge.is_caching
        if prefix_aware and len(waiting) <= MAX_PREFIX_MATCHED_QUEUE:
            for req in waiting:
                self.bridge.match(req)
            if self.policy == "lpm":
                return sorted(waiting, key=lambda r: -_prefix_len(r))  # stable: ties keep arrival order
            return _dfs_weight_order(waiting, self.bridge.cache.root_node)  # type: ignore[attr-defined]
        if self.policy == "lof":
            return sorted(waiting, key=lambda r: -(r.params.max_new_tokens or 1 << 30))
        if self.policy == "random":
            shuffled = list(waiting)
            self._rng.shuffle(shuffled)
            return shuffled
        return list(waiting)


def _prefix_len(req: Req) -> int:
    return 0 if req.prefix_slots is None else req.prefix_slots.numel()


def _dfs_weight_order(waiting: list[Req], root: TreeNode) -> list[Req]:
    reqs_at: dict[TreeNode, list[Req]] = defaultdict(list)
    weight: dict[TreeNode, int] = defaultdict(int)
    for req in waiting:
        node = req.prefix_node if req.prefix_node is not None else root
        reqs_at[node].append(req)
        while node is not None:  # every ancestor's subtree holds this request
            weight[node] += 1
            node = node.parent
    ordered: list[Req] = []
    stack = [root]
    while stack:
        node = stack.pop()
        ordered.extend(reqs_at.get(node, ()))
        children = [c for c in node.children.values() if weight.get(c, 0) > 0]
        stack.extend(sorted(children, key=lambda c: weight[c]))  # heaviest popped first
    return ordered
