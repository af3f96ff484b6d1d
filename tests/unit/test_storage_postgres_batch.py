"""How a batch's deletes become ranges and single seqs (``postgres_batch.seq_runs``)."""

from __future__ import annotations

import random

from mqserver.storage.postgres_batch import MIN_RUN, seq_runs


def expand(singles: list[int], starts: list[int], ends: list[int]) -> list[int]:
    return sorted([*singles, *(s for a, b in zip(starts, ends, strict=True)
                               for s in range(a, b + 1))])


def test_a_long_run_in_any_order_is_one_range():
    seqs = list(range(100, 100 + 3 * MIN_RUN))
    random.Random(1).shuffle(seqs)
    assert seq_runs(seqs) == ([], [100], [100 + 3 * MIN_RUN - 1])


def test_short_runs_and_gaps_stay_single():
    short = list(range(1, MIN_RUN))  # one too few
    assert seq_runs([*short, 50, 52]) == ([*short, 50, 52], [], [])


def test_runs_and_singles_mixed_cover_exactly_the_seqs():
    seqs = [*range(1, 1 + MIN_RUN), 20, 22, *range(30, 30 + 2 * MIN_RUN), 99]
    singles, starts, ends = seq_runs(seqs)
    assert (starts, ends) == ([1, 30], [MIN_RUN, 30 + 2 * MIN_RUN - 1])
    assert singles == [20, 22, 99]
    assert seq_runs([]) == ([], [], [])


def test_random_sets_are_covered_exactly():
    rng = random.Random(7)
    for _ in range(200):
        seqs = rng.sample(range(1, 400), rng.randrange(0, 300))
        singles, starts, ends = seq_runs(seqs)
        assert expand(singles, starts, ends) == sorted(seqs)
        assert all(b - a + 1 >= MIN_RUN for a, b in zip(starts, ends, strict=True))
