"""Which batches the target inserted pages of its files in (analysis/own_insertions.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engramprof.analysis.own_insertions import inserting_batches

START = np.array([0, 100, 200, 300])
END = np.array([50, 150, 250, 350])


def _pc(rows):
    return pd.DataFrame(rows, columns=["ts_ns", "dur_ns", "event", "target", "path"])


@pytest.mark.parametrize("rows, want", [
    ([(10, 0, "insert", True, "/t")], [True, False, False, False]),          # inside batch 0
    ([(60, 0, "insert", True, "/t")], None),                                  # between batches
    ([(40, 70, "insert", True, "/t")], [True, True, False, False]),          # a run across two
    ([(10, 0, "insert", False, "/t")], None),                                 # another process's
    ([(10, 0, "insert", True, "/log")], None),                                # a file it does not read
    ([(10, 0, "ra_unbounded", True, "/t")], None),                            # not an insertion
    ([(150, 0, "insert", True, "/t"), (300, 400, "insert", True, "/t")], [False, True, False, True]),
])
def test_inserting_batches(rows, want):
    got = inserting_batches(_pc(rows), ["/t"], START, END)
    assert (got is None if want is None else got.tolist() == want), got


def test_no_samples_no_answer():
    assert inserting_batches(None, ["/t"], START, END) is None
    assert inserting_batches(_pc([]), ["/t"], START, END) is None
