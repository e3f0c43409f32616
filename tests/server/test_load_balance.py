"""The data-parallel load balancer (server/load_balance.py), the merge of the ranks' infos, and
the start-up errors of --dp-size / --load-balance-method: plain objects, no server."""

from __future__ import annotations

import random

import pytest

from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.mem_cache.kv_events import chain_block_hashes
from radixlm.runtime.server.load_balance import (
    BALANCE_ABS,
    BLOCK_SIZE,
    LoadBalancer,
    PrefixIndex,
)
from radixlm.runtime.server.tokenizer_manager import merge_rank_infos


def prompt(family: int, tail: int, prefix_len: int = 64, tail_len: int = 16) -> list[int]:
    """A prompt of `family`'s shared prefix then a tail of its own."""
    return [1000 + family] * prefix_len + [tail % 50 + 1] * tail_len


def test_round_robin_alternates() -> None:
    lb = LoadBalancer("round_robin", 3, 4096)
    assert [lb.select([1, 2]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_total_requests_picks_fewest_in_flight() -> None:
    lb = LoadBalancer("total_requests", 2, 4096)
    assert lb.select([1]) == 0
    assert lb.select([1]) == 1  # rank 0 has one in flight
    lb.on_finish(1, 1)
    assert [lb.select([1]) for _ in range(2)] == [1, 0]  # after 1's first, both hold one: fewer sent wins
    assert [load.num_reqs for load in lb.loads] == [2, 1]


def test_total_tokens_picks_fewest_tokens_in_flight() -> None:
    lb = LoadBalancer("total_tokens", 2, 4096)
    assert lb.select([1] * 500) == 0
    assert [lb.select([1] * 10) for _ in range(3)] == [1, 1, 1]  # 30 tokens on rank 1 < 500 on rank 0
    lb.on_finish(0, 500)
    assert lb.select([1] * 10) == 0


def test_sequential_ties_alternate_for_every_method() -> None:
    for method in ("total_requests", "total_tokens", "prefix_affinity"):
        lb = LoadBalancer(method, 2, 4096)
        ranks = []
        for i in range(4):
            ranks.append(lb.select([i + 1] * 3))  # shorter than a block: never a prefix match
            lb.on_finish(ranks[-1], 3)
        assert ranks == [0, 1, 0, 1], method


def test_prefix_affinity_keeps_each_family_on_one_rank() -> None:
    lb = LoadBalancer("prefix_affinity", 2, 4096)
    rank_of: dict[int, set[int]] = {0: set(), 1: set(), 2: set(), 3: set()}
    rng = random.Random(0)
    for i in range(40):
        family = rng.randrange(4)
        rank = lb.select(prompt(family, i))
        lb.on_finish(rank, 80)
        rank_of[family].add(rank)
    assert all(len(ranks) == 1 for ranks in rank_of.values()), rank_of
    assert set().union(*rank_of.values()) == {0, 1}  # new families spread over the ranks


def test_prefix_affinity_leaves_an_overloaded_rank() -> None:
    lb = LoadBalancer("prefix_affinity", 2, 4096)
    ranks = [lb.select(prompt(0, i)) for i in range(BALANCE_ABS + 3)]  # all in flight at once
    home = ranks[0]
    assert ranks[:BALANCE_ABS + 1] == [home] * (BALANCE_ABS + 1)
    assert ranks[BALANCE_ABS + 1] == 1 - home  # the rank holds BALANCE_ABS + 1 more than the idle one
    assert ranks[BALANCE_ABS + 2] == 1 - home  # now both hold the prefix: the less loaded wins


def test_prefix_affinity_ignores_a_short_shared_head() -> None:
    lb = LoadBalancer("prefix_affinity", 2, 4096)
    head = [7] * BLOCK_SIZE  # e.g. a chat template's header: one block, far below the threshold share
    first = lb.select(head + [1] * 200)
    lb.on_finish(first, 216)
    assert lb.select(head + [2] * 200) != first  # no match: the rank sent fewer requests


def test_prefix_index_is_bounded_and_lru() -> None:
    index = PrefixIndex(capacity=4)
    a, b = chain_block_hashes(list(range(3 * BLOCK_SIZE)), BLOCK_SIZE), chain_block_hashes(list(range(100, 100 + 3 * BLOCK_SIZE)), BLOCK_SIZE)
    index.insert(a)
    index.insert(b)
    assert len(index) == 4
    assert index.num_matched_blocks(b) == 3
    assert index.num_matched_blocks(a) == 0  # a's first block went first (LRU), so none of a matches
    index.clear()
    assert index.num_matched_blocks(b) == 0


def test_flush_forgets_every_rank() -> None:
    lb = LoadBalancer("prefix_affinity", 2, 4096)
    lb.select(prompt(0, 0))
    lb.on_flush()
    assert all(len(index) == 0 for index in lb.indexes)


def rank_info(rank: int, queried: int, matched: int) -> dict[str, object]:
    return {"dp_size": 2, "dp_rank": rank, "scheduler_pid": 100 + rank, "grammar_backend": "xgrammar",
            "num_running_reqs": 1, "num_waiting_reqs": rank, "num_grammar_queue_reqs": 0, "num_retractions": 2,
            "num_dispatched_reqs": 5 + rank, "max_total_num_tokens": 1000, "kv_pool": {"free_tokens": 400 + rank},
            "radix_cache": {"tree_tokens": 10, "evictable_tokens": 5, "num_evicted_tokens": 1,
                            "hit_rate": matched / queried, "num_queried_tokens": queried,
                            "num_matched_tokens": matched}}


def test_merge_rank_infos_sums_and_keeps_each_rank() -> None:
    merged = merge_rank_infos([rank_info(0, 100, 50), rank_info(1, 300, 0)])
    assert merged["dp_size"] == 2 and "dp_rank" not in merged and "num_dispatched_reqs" not in merged
    assert (merged["num_running_reqs"], merged["num_waiting_reqs"], merged["num_retractions"]) == (2, 1, 4)
    assert (merged["max_total_num_tokens"], merged["kv_pool"]) == (2000, {"free_tokens": 801})
    assert merged["radix_cache"]["hit_rate"] == 50 / 400  # over all lookups, not the mean of the rates
    assert [s["dp_rank"] for s in merged["internal_states"]] == [0, 1]


@pytest.mark.parametrize("argv, message", [
    (["--dp-size", "0"], "dp_size must be >= 1, got 0"),
    (["--load-balance-method", "shortest_queue"], "invalid choice: 'shortest_queue'"),
    (["--dp-size", "2", "--kv-events-config", '{"publisher": "zmq", "endpoint": "ipc:///tmp/kv"}'],
     "with data parallelism the KV events endpoint must be tcp:// or inproc://"),
])
def test_bad_values_are_startup_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from radixlm.runtime.server.serve import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_server_args_refuse_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="load_balance_method must be one of prefix_affinity, round_robin"):
        ServerArgs(load_balance_method="random")


def test_the_engine_refuses_data_parallelism() -> None:
    from radixlm.runtime.engine import Engine

    with pytest.raises(ValueError, match="the in-process Engine runs one scheduler"):
        Engine(dp_size=2)


def test_ranks_share_the_memory_fraction() -> None:
    from radixlm.runtime.server.serve import _rank_args

    assert _rank_args(ServerArgs(dp_size=2, mem_fraction_static=0.1)).mem_fraction_static == 0.05
    assert _rank_args(ServerArgs(dp_size=2, max_total_tokens=4096)).mem_fraction_static == 0.05  # unused, unchanged
    assert _rank_args(ServerArgs(mem_fraction_static=0.1)).mem_fraction_static == 0.1


def test_a_requested_rank_wins_and_is_remembered() -> None:
    lb = LoadBalancer("prefix_affinity", 2, 4096)
    assert lb.select(prompt(0, 0), requested=1) == 1
    assert lb.loads[1].num_reqs == 1
    lb.on_finish(1, 80)
    assert lb.select(prompt(0, 1)) == 1  # its prefix was indexed on the rank it asked for
