"""The target's own prefetch hints, with no read in flight, are residency (analysis/hint_calls.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engramprof.analysis import analyse
from engramprof.analysis.hint_calls import HintCover
from engramprof.analysis.verdicts import CAUSES
from tests.test_attribution import decode_trace

PATH = "/data/engram.safetensors"
COLS = ["ts_ns", "dur_ns", "pid", "tid", "call", "advice", "path"]


def _hints(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLS)


@pytest.mark.parametrize("rows, want", [
    ([(100, 50, 1, 1, "fadvise", "WILLNEED", PATH)], [(100, 150)]),
    # overlapping spans (two threads) are one stretch; a span inside another adds nothing
    ([(100, 50, 1, 1, "fadvise", "WILLNEED", PATH), (120, 60, 1, 2, "fadvise", "WILLNEED", PATH),
      (130, 5, 1, 3, "madvise", "POPULATE_READ", PATH)], [(100, 180)]),
    ([(300, 10, 1, 1, "readahead", "", PATH), (100, 50, 1, 1, "fadvise", "WILLNEED", PATH)], [(100, 150), (300, 310)]),
    ([(100, 50, 1, 1, "fadvise", "DONTNEED", PATH)], None),        # not a prefetching hint
    ([(100, 50, 2, 1, "fadvise", "WILLNEED", PATH)], None),        # another process's
    ([(100, 50, 1, 1, "fadvise", "WILLNEED", "/etc/passwd")], None),  # a file it does not read
    ([(100, 0, 1, 1, "fadvise", "WILLNEED", PATH)], None),         # no time in it
])
def test_hint_cover(rows, want):
    got = HintCover.of(_hints(rows), [1], [PATH])
    if want is None:
        assert got is None
        return
    assert list(zip(got.starts.tolist(), got.ends.tolist())) == want
    total = sum(b - a for a, b in want)
    assert got.total_ns == total
    assert got.within(np.array([0]), np.array([10**6])).tolist() == [total]
    a, b = want[0]
    assert got.within(np.array([a + 10]), np.array([a + 20])).tolist() == [10.0]
    assert got.within(np.array([a + 20]), np.array([a + 10])).tolist() == [0.0]  # empty interval
    assert got.overlaps(b, b + 5) and not got.overlaps(b + 1 + 10**6, b + 2 * 10**6)


def _shares_ms(table: pd.DataFrame) -> dict:
    return {c: float(table[f"ms_{c.replace('-', '_')}"].sum()) for c in CAUSES}


@pytest.fixture(scope="module")
def nowait():
    """The lab's nowait shape (the submitter reads every row itself, cached: no miss), markers
    with 170 µs before each batch's first read."""
    calls, markers = decode_trace("lab-nowait", n_batches=12, seed=3)
    return calls, markers


def _hint_rows(calls, markers, lo_ns, hi_ns, pid=4242, path=PATH):
    """One WILLNEED hint per batch, from its start + lo_ns to its start + hi_ns."""
    s = markers["start_ns"].to_numpy(np.int64)
    return _hints([(int(x + lo_ns), int(hi_ns - lo_ns), pid, 999, "fadvise", "WILLNEED", path) for x in s])


def test_a_hint_before_the_first_read_is_residency_not_a_hand_off(nowait):
    calls, markers = nowait
    before_t, before = analyse(calls, markers)
    after_t, after = analyse(calls, markers, samples={"pagecache_hints": _hint_rows(calls, markers, 20_000, 120_000)})
    b, a = _shares_ms(before_t), _shares_ms(after_t)
    moved = 12 * 0.1  # ms: 100 µs a batch, all of it before the first read
    assert b["residency"] == 0.0
    assert a["residency"] == pytest.approx(moved, rel=1e-9)
    # taken from what stage 5 had made of that stretch, nothing else changes
    assert sum(a.values()) == pytest.approx(sum(b.values()), rel=1e-12)
    assert b["python-scheduling"] + b["cpu-copy"] - a["python-scheduling"] - a["cpu-copy"] == pytest.approx(moved)
    assert after["evidence"]["hint_call_share"] == pytest.approx(moved / after_t["wall_ms"].sum())
    assert "hint_call_share" not in before["evidence"]
    assert any("prefetch hints" in n for n in after["notes"])


def test_only_the_hint_time_with_no_read_in_flight_moves(nowait):
    calls, markers = nowait
    # each hint runs from 20 µs after the batch's start to 300 µs into its reads (the batches
    # last ~500 µs): only the part before the first read (at +170 µs) and in the gaps between
    # the reads it spans is outside the reads
    rows = _hint_rows(calls, markers, 20_000, 170_000 + 300_000)
    t, s = analyse(calls, markers, samples={"pagecache_hints": rows})
    batch = np.searchsorted(markers["start_ns"].to_numpy(), calls["ts_ns"].to_numpy(), "right") - 1
    want = 0.0
    for k, g in calls.groupby(batch):
        st, end = int(markers["start_ns"].iloc[k]), int(markers["end_ns"].iloc[k])
        a, b = st + 20_000, min(st + 470_000, end)
        ts, te = g["ts_ns"].to_numpy(), (g["ts_ns"] + g["dur_ns"]).to_numpy()
        want += (b - a) - float(np.clip(np.minimum(te, b) - np.maximum(ts, a), 0, None).sum())  # serial: disjoint
    assert 0 < want < 12 * 450_000
    assert _shares_ms(t)["residency"] == pytest.approx(want / 1e6, rel=1e-9)


@pytest.mark.parametrize("pid, path, advice", [(7, PATH, "WILLNEED"), (4242, "/tmp/other", "WILLNEED"),
                                               (4242, PATH, "RANDOM")])
def test_hints_of_another_process_file_or_kind_change_nothing(nowait, pid, path, advice):
    calls, markers = nowait
    rows = _hint_rows(calls, markers, 20_000, 120_000, pid=pid, path=path)
    rows["advice"] = advice
    before_t, before = analyse(calls, markers)
    after_t, after = analyse(calls, markers, samples={"pagecache_hints": rows})
    pd.testing.assert_frame_equal(before_t, after_t)
    assert before["share"] == after["share"]


def test_a_prefetcher_thread_hinting_while_the_step_runs_changes_nothing(nowait):
    # the hints of a thread the step does not wait on (not the markers' thread, not a reader):
    # a prefetcher bringing in the next step's rows while this one computes
    calls, markers = nowait
    rows = _hint_rows(calls, markers, 20_000, 120_000)
    rows["tid"] = 555
    before_t, _ = analyse(calls, markers)
    after_t, after = analyse(calls, markers, samples={"pagecache_hints": rows})
    pd.testing.assert_frame_equal(before_t, after_t)
    assert "hint_call_share" not in after["evidence"]


@pytest.mark.parametrize("tid, counted", [(999, True), (555, False)])
def test_without_a_markers_thread_the_readers_hints_count(nowait, tid, counted):
    # markers without a tid: the step thread is the one inferred from the reads (999 reads in
    # every batch); a thread that never reads is not it
    calls, markers = nowait
    markers = markers.drop(columns=["tid"])
    rows = _hint_rows(calls, markers, 20_000, 120_000)
    rows["tid"] = tid
    t, s = analyse(calls, markers, samples={"pagecache_hints": rows})
    assert (_shares_ms(t)["residency"] == pytest.approx(12 * 0.1, rel=1e-9)) if counted \
        else _shares_ms(t)["residency"] == 0.0
