"""The order in which contenders run, round by round.

Every benchmark interleaves its contenders (each once per round) so that a change in the
machine's load falls on all of them alike. The order within a round is shuffled with a fixed
seed: a fixed rotation runs each contender right after the same neighbour in most rounds, so one
of them always found the caches warmed, or evicted, by the other (bench_keys' key always ran after
the floor, its walk cold; its L1 hit after the key, warm).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def shuffled_rounds(items: Sequence[T], rounds: int, seed: int = 0) -> Iterator[list[T]]:
    """``rounds`` orders of ``items``, each a seeded shuffle: repeatable from run to run."""
    rng = random.Random(seed)
    order = list(items)
    for _ in range(rounds):
        rng.shuffle(order)
        yield list(order)
