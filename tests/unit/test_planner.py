"""The memory planner on hand-made lifetimes, and on lowered models."""
import itertools

import numpy as np
import pytest

from kmlc.planner import ALIGN, Request, align_up, greedy_by_size, peak_live


def check_plan(reqs, offsets, align=ALIGN):
    total = max((offsets[r.name] + r.size for r in reqs), default=0)
    for r in reqs:
        assert offsets[r.name] % align == 0
    for a, b in itertools.combinations(reqs, 2):
        if a.overlaps_in_time(b):
            oa, ob = offsets[a.name], offsets[b.name]
            assert oa + a.size <= ob or ob + b.size <= oa, f"{a} and {b} overlap"
    assert total <= sum(r.size for r in reqs)
    assert total >= peak_live(reqs)
    return total


def test_chain_reuses_memory():
    # t0 -> t1 -> t2 -> t3: only neighbours are live together
    reqs = [Request(f"t{i}", 64, i, i + 1) for i in range(4)]
    offsets = greedy_by_size(reqs)
    assert check_plan(reqs, offsets) == 128  # two slots ping-pong


def test_all_live_needs_the_sum():
    reqs = [Request("a", 32, 0, 5), Request("b", 48, 0, 5), Request("c", 16, 2, 3)]
    assert check_plan(reqs, greedy_by_size(reqs)) == 96


def test_hand_computed_gap_filling():
    # big [0,2] and [3,4] can share offset 0; small ones live across the switch
    reqs = [Request("big1", 256, 0, 2), Request("big2", 256, 3, 4),
            Request("s1", 16, 2, 3), Request("s2", 32, 1, 1)]
    off = greedy_by_size(reqs)
    assert off == {"big1": 0, "big2": 0, "s1": 256, "s2": 256}
    assert check_plan(reqs, off) == 288


def test_ties_broken_deterministically():
    reqs = [Request(n, 64, 0, 1) for n in "dcba"]
    off1 = greedy_by_size(reqs)
    off2 = greedy_by_size(list(reversed(reqs)))
    assert off1 == off2 == {"a": 0, "b": 64, "c": 128, "d": 192}


@pytest.mark.parametrize("seed", range(200))
def test_random_lifetimes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    reqs = []
    for i in range(n):
        s = int(rng.integers(0, 30))
        reqs.append(Request(f"t{i}", align_up(int(rng.integers(1, 2000)), ALIGN), s,
                            s + int(rng.integers(0, 8))))
    check_plan(reqs, greedy_by_size(reqs))


def test_empty():
    assert greedy_by_size([]) == {}
    assert peak_live([]) == 0
