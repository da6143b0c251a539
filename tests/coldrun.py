"""Cold runs that must see RWF_NOWAIT refuse a page (shared by tests/test_lab.py and
tests/test_replay.py).

A cold row's NOWAIT read returns EAGAIN, but not always: a NOWAIT miss starts readahead, and
when the device answers before the page is checked the kernel returns the data (on a small
table one window can bring in all of it; about 1 cold run in 10 here saw no EAGAIN at all).
So a test gives the run up to :data:`ATTEMPTS` tries, each cold from the start and judged whole.
"""
from __future__ import annotations

from typing import Callable, TypeVar

R = TypeVar("R")

ATTEMPTS = 5


def until_nowait_refuses(run: Callable[[int], R], eagain: Callable[[R], int], *, evict: str | None = None,
                         attempts: int = ATTEMPTS) -> R:
    """``run(attempt)`` (after dropping ``evict``'s pages, when given) until ``eagain(result)``
    is above 0, at most ``attempts`` times; the last result (the caller asserts on it)."""
    from engramprof.lab import workload

    result = None
    for attempt in range(attempts):
        if evict is not None:
            workload.evict(evict)
        result = run(attempt)
        if eagain(result) > 0:
            break
    return result
