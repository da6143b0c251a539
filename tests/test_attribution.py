"""batch-tail attribution on hand-built traces: known answers, properties, verdict shapes.

The shape builders here (decode_trace, prefill_trace) are also used by test_batches.py and
test_batch_tail_cli.py.  All traces are small: the whole file runs in a few seconds.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engramprof.analysis.attribution import (
    CAUSES,
    VERDICTS,
    _distinct_per_batch,
    analyse,
    col,
    inflight_weights,
    verdict_of,
)
from engramprof.analysis.attribute import queue_depth_max
from engramprof.analysis.events import Chunk
from engramprof.errors import UserError
from engramprof.trace import EVIDENCE_COLUMNS

T0 = 1_000_000_000_000  # 1000 s of uptime, CLOCK_MONOTONIC ns
EV = ("pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns")


# --------------------------------------------------------------------- shape builders --

def _zeros(n):
    return {k: np.zeros(n) for k in EV}


def _batch(kind: str, rng, t: int) -> dict:
    """One batch's calls starting at t."""
    if kind == "python-scheduling":  # 96 cached ~3 µs calls spread through ~1 ms from 32 threads
        n = 96
        ts = t + np.sort(rng.integers(0, 950_000, n))
        dur = rng.integers(2_000, 4_000, n)
        tid = rng.integers(0, 32, n)
        ev = _zeros(n)
    elif kind == "healthy":  # serial: one thread, 96 calls back to back, ~95% in flight
        n = 96
        dur = rng.integers(9_000, 11_000, n)
        gaps = rng.integers(300, 700, n)
        gaps[0] = 0
        ts = t + np.cumsum(gaps) + np.r_[0, np.cumsum(dur)[:-1]]
        tid = np.zeros(n, int)
        ev = _zeros(n)
    elif kind in ("residency", "storage", "reclaim"):  # 32 threads x 3 rounds of cold reads
        n, rounds, per = 96, 3, 32
        base = {"residency": 150_000, "storage": 8_000_000, "reclaim": 400_000}[kind]
        dur = (base * rng.uniform(0.8, 1.3, n)).astype(np.int64)
        tid = np.tile(np.arange(32), rounds)
        ts = np.empty(n, np.int64)
        end_prev = np.full(32, t) + rng.integers(0, 20_000, 32)
        for r in range(rounds):
            sl = slice(r * per, (r + 1) * per)
            ts[sl] = end_prev + rng.integers(3_000, 10_000, per)
            end_prev = ts[sl] + dur[sl]
        rec = dur * 0.7 if kind == "reclaim" else np.zeros(n)
        io = dur - rec - 10_000
        ev = dict(pages_added=rng.integers(1, 4, n).astype(float), bio_count=np.ones(n), bio_ns=io * 0.95,
                  reclaim_ns=rec, offcpu_ns=io + rec * 0.5, runq_ns=np.zeros(n))
    elif kind == "lab-pool":  # as measured on the lab's pool reader (cached): one rotating worker
        # per batch runs 32 tasks of 3 rows; ~2 µs between rows, 8-30 µs of executor work between tasks
        n = 96
        dur = rng.integers(1_000, 5_000, n)
        gaps = np.where(np.arange(n) % 3 == 0, rng.integers(8_000, 30_000, n), rng.integers(1_500, 2_500, n))
        gaps[0] = 0
        ts = t + np.cumsum(gaps) + np.r_[0, np.cumsum(dur)[:-1]]
        tid = np.full(n, rng.integers(0, 32))
        ev = _zeros(n)
    elif kind == "lab-nowait":  # the submitting thread reads every row itself with RWF_NOWAIT
        n = 96
        dur = rng.integers(1_000, 2_000, n)
        gaps = rng.integers(1_200, 2_500, n)
        gaps[0] = 0
        ts = t + np.cumsum(gaps) + np.r_[0, np.cumsum(dur)[:-1]]
        tid = np.full(n, 999 - 1000)
        ev = _zeros(n)
    else:
        raise ValueError(kind)
    o = np.argsort(ts, kind="stable")
    out = dict(ts_ns=ts[o], dur_ns=dur[o], tid=1000 + tid[o])
    out.update({k: v[o] for k, v in ev.items()})
    return out


def _frame(parts: list[dict], rng) -> pd.DataFrame:
    calls = pd.DataFrame({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    n = len(calls)
    calls["pid"] = 4242
    calls["path"] = "/data/engram.safetensors"
    calls["offset"] = rng.integers(0, 1 << 20, n) * 4096
    calls["size"] = 4096
    calls["ret"] = 4096
    calls["flags"] = 0
    calls["ts_ns"] = calls["ts_ns"].astype(np.int64)
    calls["dur_ns"] = calls["dur_ns"].astype(np.int64)
    return calls.sort_values("ts_ns", kind="stable").reset_index(drop=True)


#: marker pre/post times (before the first read, after the last) and submitting tid, as
#: measured on the lab readers; other shapes use pre_ns/post_ns and no tid
LAB_MARKERS = {"lab-pool": (500_000, 85_000, 999), "lab-nowait": (170_000, 10_000, 999)}


def decode_trace(kind="python-scheduling", n_batches=20, seed=0, pre_ns=60_000, post_ns=20_000,
                 gap_ms=(2.0, 20.0), kinds=None, idle_every=None):
    """Decode-shaped trace and its markers: batches of 96 reads separated by a forward pass
    (log-uniform in gap_ms).  ``idle_every``: every n-th gap is a 2 s idle pause."""
    rng = np.random.default_rng(seed)
    t = T0
    parts, marks = [], []
    for b in range(n_batches):
        k = kinds[b] if kinds is not None else kind
        pre, post, mtid = LAB_MARKERS.get(k, (pre_ns, post_ns, -1))
        c = _batch(k, rng, t + pre)
        end = int((c["ts_ns"] + c["dur_ns"]).max()) + post
        marks.append((t, end, mtid))
        parts.append(c)
        gap = math.exp(rng.uniform(math.log(gap_ms[0]), math.log(gap_ms[1]))) * 1e6
        if idle_every and b % idle_every == idle_every - 1:
            gap = 2e9
        t = end + int(gap)
    return _frame(parts, rng), pd.DataFrame(marks, columns=["start_ns", "end_ns", "tid"])


def prefill_trace(n_batches=6, calls_per_batch=2048, threads=32, seed=1, gap_ms=(30.0, 120.0)):
    """Prefill-shaped: each batch 2048 cached reads from 32 threads, each thread serial with
    Python work between its reads, threads overlapping; forward pass 30-120 ms."""
    rng = np.random.default_rng(seed)
    t = T0
    parts, marks = [], []
    per = calls_per_batch // threads
    for _ in range(n_batches):
        start = t + 200_000
        dur = rng.integers(2_000, 6_000, (threads, per))
        think = rng.integers(5_000, 60_000, (threads, per))
        ts = start + rng.integers(0, 50_000, (threads, 1)) + np.cumsum(think + dur, axis=1) - dur
        tid = np.repeat(np.arange(threads)[:, None], per, axis=1)
        c = dict(ts_ns=ts.ravel(), dur_ns=dur.ravel(), tid=1000 + tid.ravel(), **_zeros(ts.size))
        end = int((c["ts_ns"] + c["dur_ns"]).max()) + 100_000
        marks.append((t, end))
        parts.append(c)
        t = end + int(rng.uniform(*gap_ms) * 1e6)
    return _frame(parts, rng), pd.DataFrame(marks, columns=["start_ns", "end_ns"])


def hand_calls(rows: list[tuple], cols=("ts_ns", "dur_ns", "tid") + EV) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(cols))
    df["pid"] = 1
    df["path"] = "/t"
    df["offset"] = np.arange(len(df)) * 4096
    df["size"] = 4096
    df["ret"] = 4096
    df["flags"] = 0
    return df


def shares_of(batches: pd.DataFrame, i: int = 0) -> dict:
    return {c: float(batches.loc[i, f"share_{col(c)}"]) for c in CAUSES}


def ms_of(batches: pd.DataFrame, i: int = 0) -> dict:
    return {c: float(batches.loc[i, f"ms_{col(c)}"]) for c in CAUSES}


# ------------------------------------------------------------------------ known answers --

def test_hand_built_batch_split_is_exact():
    # marker [0, 1000] ns.  A: [100, 500] tid 1, 1 miss, 1 bio of 200 ns, offcpu 250 (runq 50).
    # B: [300, 700] tid 2, cached, on CPU.  Overlap [300, 500] is shared 1/2 each:
    # u_A = 200 + 100 = 300, u_B = 100 + 200 = 300; union 600; no read in flight: 100 before, 300 after.
    # normal = 100 ns -> storage fraction of A's miss wait = 1 - 100/200 = 0.5.
    # A (scale 300/400): it slept on its miss, so its runq 50 is the wake-up -> residency 37.5;
    #   wait 200 -> storage 75 + residency 75; on-CPU 150 -> residency 112.5
    # B (scale 300/400): on-CPU 400 -> cpu-copy 300
    # no marker tid and two threads in the one batch: no submitter, so 100 before + 300 after
    # the reads are hand-offs -> python-scheduling 400
    calls = hand_calls([(100, 400, 1, 1, 1, 200, 0, 250, 50), (300, 400, 2, 0, 0, 0, 0, 0, 0)])
    markers = pd.DataFrame({"start_ns": [0], "end_ns": [1000]})
    b, s = analyse(calls, markers, normal_miss_us=0.1)
    got = {c: v * 1e6 for c, v in ms_of(b).items()}  # back to ns
    want = {"python-scheduling": 400.0, "storage": 75.0, "residency": 225.0, "cpu-copy": 300.0,
            "reclaim": 0.0, "unexplained": 0.0}
    for c in CAUSES:
        assert got[c] == pytest.approx(want[c], abs=1e-6), c
    assert b.loc[0, "inflight_ms"] * 1e6 == pytest.approx(600)
    assert b.loc[0, "wall_ms"] * 1e6 == pytest.approx(1000)
    assert b.loc[0, "sum_call_ms"] * 1e6 == pytest.approx(800)
    assert sum(shares_of(b).values()) == pytest.approx(1.0)
    assert s["verdict"] == "python-scheduling"
    assert s["batch_source"] == "markers"


def test_reclaim_and_refaults_move_miss_time_to_reclaim():
    # one call [0, 1000], 2 pages inserted, reclaim 300, offcpu 600 (runq 0); on-CPU 100.
    # vmstat: 1 refault in the interval for the 2 pages inserted -> half of the miss time is refaults.
    calls = hand_calls([(T0 + 0, 1000, 7, 2, 1, 500, 300, 600, 0)])
    vm = pd.DataFrame({"ts_ns": [T0 - 100_000_000, T0 + 100_000_000], "workingset_refault_file": [50, 1]})
    b, s = analyse(calls, samples={"vmstat": vm}, normal_miss_us=1000)
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    # R = 300; vol = 600 -> wait 600 capped at d-R-Q = 700 -> 600; on-CPU = 100 (miss CPU)
    # miss time 700, half refaults -> reclaim 300 + 350; residency 350; storage 0 (bio 500 < normal)
    assert got["reclaim"] == pytest.approx(650)
    assert got["residency"] == pytest.approx(350)
    assert got["storage"] == pytest.approx(0)
    assert s["samples_used"]["vmstat"] == ["ts_ns", "workingset_refault_file"]
    assert s["evidence"]["refault_frac_of_misses_est"] == pytest.approx(0.5)


def test_cgroup_refaults_are_preferred_to_system_wide():
    calls = hand_calls([(T0 + 0, 1000, 7, 2, 1, 500, 300, 600, 0)])
    vm = pd.DataFrame({"ts_ns": [T0 - 100_000_000, T0 + 100_000_000], "workingset_refault_file": [50, 2]})
    cg = pd.DataFrame({"ts_ns": [T0 - 100_000_000, T0 + 100_000_000], "refault_file": [0, 0],
                       "usage_bytes": [1, 1]})
    _, s = analyse(calls, samples={"vmstat": vm, "cgroup": cg}, normal_miss_us=1000)
    assert s["evidence"]["refault_source"] == "cgroup refault_file"
    assert s["evidence"]["refault_frac_of_misses_est"] == 0
    assert s["share"]["reclaim"] == pytest.approx(0.3)
    _, s = analyse(calls, samples={"vmstat": vm}, normal_miss_us=1000)
    assert "system-wide" in s["evidence"]["refault_source"]
    assert s["evidence"]["refault_frac_of_misses_est"] == 1.0
    assert any("system-wide" in n for n in s["notes"])


def test_storage_beyond_normal_and_override():
    calls = hand_calls([(T0, 10_000_000, 1, 1, 1, 9_000_000, 0, 9_500_000, 0)])
    b, s = analyse(calls, normal_miss_us=1000)
    sh = shares_of(b)
    # wait 9.5 ms for 1 bio of 9 ms: observed service = max(9, 9.5) ms; beyond normal = 1 - 1/9.5;
    # on-CPU 0.5 ms is miss CPU (residency)
    assert sh["storage"] == pytest.approx(9.5 / 10 * (1 - 1 / 9.5))
    assert s["verdict"] == "storage"
    b2, s2 = analyse(calls, normal_miss_us=9500)
    assert shares_of(b2)["storage"] == pytest.approx(0)
    assert s2["verdict"] == "residency"
    # from the trace alone: the device baseline of a 4 KiB bio (9 ms measured) is capped at
    # the ceiling for its size (1000 µs + 4 KiB at 100 MB/s)
    _, s3 = analyse(calls)
    assert s3["normal_miss_us"] == pytest.approx(1000 + 4096 / 100e6 * 1e6)
    assert "device baseline" in s3["normal_miss_source"]
    assert s3["device_baseline"]["classes"][0]["bytes"] == 4096


def test_throttled_io_shows_in_the_wait_not_in_bio_time():
    # a blkio throttle holds bios before the block layer: bio queue->complete stays ~100 µs
    # while the reader waits 20 ms.  Thread 2 waits as long on a page thread 1 is reading.
    rows = [(T0, 20_100_000, 1, 1, 1, 100_000, 0, 20_000_000, 0),
            (T0 + 50_000, 20_000_000, 2, 0, 0, 0, 0, 19_950_000, 0)]
    b, s = analyse(hand_calls(rows), normal_miss_us=100)
    assert shares_of(b)["storage"] > 0.95 and s["verdict"] == "storage"


def test_same_thread_gap_is_reader_loop_not_scheduling():
    # two calls on thread 1 with a 5 µs gap, then one on thread 2 after 5 µs.
    rows = [(T0, 10_000, 1) + (0,) * 6, (T0 + 15_000, 10_000, 1) + (0,) * 6, (T0 + 30_000, 10_000, 2) + (0,) * 6]
    calls = hand_calls(rows)
    # one batch: both threads read in 100% of the batches, so no submitter can be inferred
    b, s = analyse(calls)
    assert s["submitter"] == {"tid": None, "source": "none"}
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    assert got["cpu-copy"] == pytest.approx(30_000 + 2_000)  # worker loop allowance
    assert got["python-scheduling"] == pytest.approx(3_000 + 5_000)  # the rest + hand-off to thread 2
    # a second batch read by thread 1 only: thread 1 reads in every batch -> the submitter
    calls2 = hand_calls(rows + [(T0 + 10_000_000, 10_000, 1) + (0,) * 6, (T0 + 10_015_000, 10_000, 1) + (0,) * 6])
    b, s = analyse(calls2)
    assert s["submitter"]["tid"] == 1 and s["batches"] == 2
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    assert got["cpu-copy"] == pytest.approx(30_000 + 5_000)  # the submitter's own loop
    assert got["python-scheduling"] == pytest.approx(5_000)  # hand-off to thread 2
    # the marker names thread 3 as the submitter: threads 1 and 2 are pool workers, so of
    # worker 1's 5 µs gap only loop_gap_us (2 µs) is its loop, the rest executor machinery;
    # the 1 µs before the first read and 2 µs after the last are hand-offs
    markers = pd.DataFrame({"start_ns": [T0 - 1_000], "end_ns": [T0 + 42_000], "tid": [3]})
    b, s = analyse(calls, markers)
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    assert got["cpu-copy"] == pytest.approx(30_000 + 2_000)
    assert got["python-scheduling"] == pytest.approx(1_000 + 3_000 + 5_000 + 2_000)
    assert s["submitter"] == {"tid": 3, "source": "markers"}
    # the marker names thread 1: its gap and the time before its first read are its own work;
    # the time after thread 2's last read is the hand-off back
    markers["tid"] = 1
    b, _ = analyse(calls, markers)
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    assert got["cpu-copy"] == pytest.approx(30_000 + 5_000 + 1_000)
    assert got["python-scheduling"] == pytest.approx(5_000 + 2_000)
    b, _ = analyse(calls, markers.assign(tid=3), loop_gap_us=0)
    assert ms_of(b)["cpu-copy"] * 1e6 == pytest.approx(30_000)


def test_runq_counts_as_scheduling_and_unexplained_waits():
    # cached call, 100 µs: runq 30, voluntary off-CPU 50 with no miss anywhere -> unexplained
    calls = hand_calls([(T0, 100_000, 1, 0, 0, 0, 0, 80_000, 30_000)])
    b, _ = analyse(calls)
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    assert got["python-scheduling"] == pytest.approx(30_000)
    assert got["unexplained"] == pytest.approx(50_000)
    assert got["cpu-copy"] == pytest.approx(20_000)


def test_runq_after_a_miss_sleep_is_residency_preemption_is_scheduling():
    # one batch with misses: A slept 100 µs on its miss then waited 40 µs for a CPU (wake-up);
    # B never slept (cached) but was preempted for 30 µs: CPU contention
    calls = hand_calls([(T0, 150_000, 1, 1, 1, 100_000, 0, 140_000, 40_000),
                        (T0 + 200_000, 40_000, 1, 0, 0, 0, 0, 30_000, 30_000)])
    b, _ = analyse(calls, normal_miss_us=1000)
    got = {c: v * 1e6 for c, v in ms_of(b).items()}
    assert got["residency"] == pytest.approx(150_000)
    assert got["python-scheduling"] == pytest.approx(30_000)
    assert got["cpu-copy"] == pytest.approx(10_000 + 50_000)  # B on CPU + the submitter's gap


def test_waiting_on_another_threads_miss_is_residency():
    # A misses (150 µs, waits 140); B reads a page A's readahead brought in: no insertion of its
    # own, waits 100 µs off-CPU -> a miss wait (the batch has misses), not unexplained.
    calls = hand_calls([(T0, 150_000, 1, 4, 1, 140_000, 0, 140_000, 0),
                        (T0 + 20_000, 110_000, 2, 0, 0, 0, 0, 100_000, 0)])
    b, s = analyse(calls)
    sh = shares_of(b)
    assert sh["unexplained"] == pytest.approx(0)
    assert sh["residency"] > 0.9
    assert s["verdict"] == "residency"


# ------------------------------------------------------------------------- in-flight union --

def _brute_weights(s, e):
    grid = np.zeros(len(s))
    for t in range(int(min(s)), int(max(e))):
        on = [i for i in range(len(s)) if s[i] <= t < e[i]]
        for i in on:
            grid[i] += 1 / len(on)
    return grid


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), min_size=1, max_size=12))
def test_inflight_weights_match_brute_force(iv):
    s = np.array(sorted(a for a, _ in iv), dtype=np.int64)
    durs = np.array([d for _, d in iv], dtype=np.int64)
    e = s + durs
    u = inflight_weights(s, e)
    assert np.allclose(u, _brute_weights(s, e))


@pytest.mark.parametrize("base", [0, 2**53 + 1, 2**62 - 40, 2**63 - 100, -(2**62) - 7])
def test_inflight_weights_exact_for_any_clock_value(base):
    # CLOCK_MONOTONIC passes 2**53 ns after 104 days of uptime (float64 no longer holds every
    # ns); beyond +-2**62 the merge key (time * 2 + exit) would overflow and another path runs:
    # the weights must be those of the same intervals near 0, exactly
    rng = np.random.default_rng(base % 1000)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        s = np.sort(rng.integers(0, 50, n))
        e = s + rng.integers(0, 20, n) * (rng.random(n) < 0.8)
        near_zero = inflight_weights(s, e)
        assert np.allclose(near_zero, _brute_weights(s, e))
        np.testing.assert_array_equal(inflight_weights(s + base, e + base), near_zero)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=60))
def test_distinct_per_batch_matches_pandas(seed, pairs):
    b = np.sort(np.random.default_rng(seed).integers(0, 4, len(pairs)))
    x = np.array([p[0] for p in pairs], dtype=np.int64)
    y = np.array([p[1] for p in pairs], dtype=np.int64)
    want = pd.DataFrame({"b": b, "x": x, "y": y}).drop_duplicates().groupby("b").size().reindex(range(4), fill_value=0)
    assert list(_distinct_per_batch(b, 4, x, y)) == list(want)
    firsts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    if len(firsts) == 4:  # every batch has an event: counted between the batches' first events
        assert list(_distinct_per_batch(b, 4, x, y, firsts=firsts)) == list(want)


def _brute_queue_depth(s, e, b, nb):
    """Per batch, the most of its events in flight at once (an exit before an entry at the
    same instant), from the events' own intervals, one instant at a time."""
    out = np.zeros(nb)
    for i in range(len(s)):  # the level just after entry i
        level = sum(1 for j in range(len(s)) if s[j] <= s[i] and e[j] > s[i] and b[j] == b[i])
        out[b[i]] = max(out[b[i]], level)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), min_size=1, max_size=8),
                min_size=1, max_size=5))
def test_queue_depth_max_matches_brute_force(batches):
    # batches disjoint in time, each event inside its batch's span (what segmentation gives);
    # zero-length events and events ending where the next batch begins included
    s, e, b, t0 = [], [], [], 0
    for k, evs in enumerate(batches):
        for start, dur in sorted(evs):
            s.append(t0 + start)
            e.append(t0 + start + dur)
            b.append(k)
        t0 = max(e[-len(evs):]) if evs else t0
        t0 = max(t0, max(s[-len(evs):]))
    order = np.argsort(s, kind="stable")
    s, e, b = np.array(s)[order], np.array(e)[order], np.array(b)[order]
    if (np.diff(b) < 0).any():
        return  # two batches at one instant: not a segmentation
    ch = Chunk(0, len(batches), 0, len(s), b, None)
    np.testing.assert_array_equal(queue_depth_max(ch, s, e), _brute_queue_depth(s, e, b, len(batches)))


# ----------------------------------------------------------------------- property tests --

maybe_ev = st.one_of(st.none(), st.integers(-5, 3_000), st.floats(allow_nan=True, allow_infinity=False, width=32))


@st.composite
def random_traces(draw):
    n = draw(st.integers(1, 30))
    rows = []
    for _ in range(n):
        ts = draw(st.integers(0, 5_000_000))
        dur = draw(st.integers(0, 400_000))
        tid = draw(st.integers(1, 4))
        ev = [draw(st.integers(0, 5)), draw(st.integers(0, 3))] + [draw(st.integers(-1000, 500_000)) for _ in range(4)]
        rows.append((T0 + ts, dur, tid, *ev))
    df = hand_calls(rows)
    drop = draw(st.lists(st.sampled_from(EV), unique=True, max_size=6))
    df = df.drop(columns=drop)
    markers = None
    if draw(st.booleans()):
        start = T0 + draw(st.integers(-100_000, 1_000_000))
        k = draw(st.integers(1, 4))
        edges = sorted(draw(st.lists(st.integers(1, 6_000_000), min_size=k, max_size=k, unique=True)))
        marks, prev = [], start
        for x in edges:
            marks.append((prev, max(prev + 1, start + x)))
            prev = max(prev + 1, start + x)
        markers = pd.DataFrame(marks, columns=["start_ns", "end_ns"])
    return df, markers


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_traces(), st.sampled_from([None, 0.3, 1.0]))
def test_shares_sum_to_one_and_times_to_wall(trace, gap_ms):
    calls, markers = trace
    try:
        b, s = analyse(calls, markers, gap_ms=gap_ms)
    except UserError as exc:  # markers with no call inside: a clear error, fine
        assert "marker" in str(exc)
        return
    sh = b[[f"share_{col(c)}" for c in CAUSES]].to_numpy()
    assert np.all(sh >= -1e-12)
    assert np.allclose(sh.sum(axis=1), 1.0)
    ms = b[[f"ms_{col(c)}" for c in CAUSES]].to_numpy().sum(axis=1)
    pos = b["wall_ms"].to_numpy() > 0
    assert np.allclose(ms[pos], b["wall_ms"].to_numpy()[pos], rtol=1e-9, atol=1e-9)
    assert set(b["verdict"]) <= set(VERDICTS)
    assert s["verdict"] in VERDICTS
    assert sum(s["share"].values()) == pytest.approx(1.0)
    assert sum(s["tail_share"].values()) == pytest.approx(1.0)
    assert s["calls_in_batches"] == int(b["calls"].sum())
    json.dumps(s, allow_nan=False, default=str)


# --------------------------------------------------------------------------- verdict shapes --

@pytest.mark.parametrize("use_markers", [True, False])
@pytest.mark.parametrize("kind", ["python-scheduling", "healthy", "residency", "storage", "reclaim"])
def test_synthetic_lab_shapes_get_their_verdict(kind, use_markers):
    calls, markers = decode_trace(kind, n_batches=12, seed=3)
    b, s = analyse(calls, markers if use_markers else None)
    assert s["batches"] == 12
    assert s["verdict"] == kind
    assert (b["verdict"] == kind).mean() >= 0.9
    assert s["batch_source"] == ("markers" if use_markers else "inferred")


def test_python_scheduling_shape_numbers():
    calls, markers = decode_trace("python-scheduling", n_batches=12, seed=5)
    b, s = analyse(calls, markers)
    assert s["share"]["python-scheduling"] > 0.6
    assert s["outside_read_path_frac"] > 0.6
    assert s["frac_batches_with_slow_call"] == 0
    # nothing in flight for most of the batch; reads are cheap
    assert s["inflight_ms"]["p50"] < 0.4 < s["batch_ms"]["p50"]


@pytest.mark.parametrize("use_markers", [True, False])
def test_lab_reader_shapes(use_markers):
    # shapes measured on the lab (engramprof lab run, cached table): the pool reader is
    # python-scheduling with or without markers, the NOWAIT reader healthy
    calls, markers = decode_trace("lab-pool", n_batches=40, seed=7)
    _, s = analyse(calls, markers if use_markers else None)
    assert s["verdict"] == "python-scheduling"
    assert s["submitter"]["tid"] == (999 if use_markers else None)
    calls, markers = decode_trace("lab-nowait", n_batches=40, seed=7)
    _, s = analyse(calls, markers if use_markers else None)
    assert s["verdict"] == "healthy"
    assert s["submitter"]["tid"] == 999
    assert s["share"]["cpu-copy"] > 0.9


def test_nowait_serial_cached_reader_is_healthy():
    calls, markers = decode_trace("healthy", n_batches=10, seed=2)
    calls["flags"] = 0x8
    _, s = analyse(calls, markers)
    assert s["verdict"] == "healthy"
    assert s["share"]["cpu-copy"] > 0.8
    assert s["evidence"]["nowait_calls"] == len(calls)


def test_tail_share_separates_cold_batches():
    # 18 cached pool batches (~1 ms) and 2 throttled-storage batches (~30 ms): the tail is storage
    kinds = ["python-scheduling"] * 9 + ["storage"] + ["python-scheduling"] * 9 + ["storage"]
    calls, markers = decode_trace(kinds=kinds, n_batches=20, seed=9)
    b, s = analyse(calls, markers)
    assert s["tail_verdict"] == "storage"
    assert s["tail_batches"] == 2
    assert set(b.nlargest(2, "wall_ms")["verdict"]) == {"storage"}
    assert s["frac_batches_with_slow_call"] == pytest.approx(0.1)


def test_context_switches_from_thread_samples():
    calls, markers = decode_trace("python-scheduling", n_batches=5, seed=4)
    tids = np.unique(calls["tid"])
    t0, t1 = int(markers["start_ns"].min()) - 10**8, int(markers["end_ns"].max()) + 10**8
    xs = np.arange(t0, t1, 10**8)
    rows = [(x, t, "pool", (x - t0) / 1e5, (x - t0) / 1e6, 0.0, 0.0) for t in tids for x in xs]
    thr = pd.DataFrame(rows, columns=["ts_ns", "tid", "name", "ctx_voluntary", "ctx_involuntary", "utime_s", "stime_s"])
    b, s = analyse(calls, markers, samples={"threads": thr})
    # each thread: 10 voluntary + 1 involuntary switches per ms
    want = len(tids) * 11 * b["wall_ms"].to_numpy()
    assert np.allclose(b["ctx_switches_est"].to_numpy(), want, rtol=1e-6)
    assert s["samples_used"]["threads"] == ["ts_ns", "tid", "ctx_voluntary", "ctx_involuntary"]


def test_calls_outside_markers_change_nothing_inside():
    calls, markers = decode_trace("residency", n_batches=8, seed=6)
    # stray calls between batches (another code path reading): in no marker
    mids = ((markers["end_ns"].to_numpy()[:-1] + markers["start_ns"].to_numpy()[1:]) // 2)
    stray = calls.iloc[: len(mids)].copy()
    stray["ts_ns"] = mids
    stray["dur_ns"] = 1000
    both = pd.concat([calls, stray]).sort_values("ts_ns", kind="stable").reset_index(drop=True)
    b1, s1 = analyse(calls, markers)
    b2, s2 = analyse(both, markers)
    assert s2["calls"] == s1["calls"] + len(mids) and s2["calls_in_batches"] == s1["calls_in_batches"]
    assert any("outside every marker" in n for n in s2["notes"])
    cols = [c for c in b1.columns if c.startswith(("ms_", "share_")) or c in ("calls", "rows", "misses", "slowest_call_ms")]
    pd.testing.assert_frame_equal(b1[cols], b2[cols])
    # and an unsorted DataFrame gives the same answer as a sorted one
    b3, _ = analyse(both.sample(frac=1.0, random_state=1), markers)
    pd.testing.assert_frame_equal(b2[cols], b3[cols])


@pytest.mark.parametrize("use_markers", [True, False])
def test_chunking_does_not_change_results(monkeypatch, use_markers):
    import engramprof.analysis.events as A

    kinds = ["python-scheduling", "residency", "healthy", "storage", "reclaim"] * 3
    calls, markers = decode_trace(kinds=kinds, n_batches=len(kinds), seed=8)
    b1, s1 = analyse(calls, markers if use_markers else None)
    monkeypatch.setattr(A, "CHUNK_CALLS", 150)  # ~1.5 batches per chunk
    b2, s2 = analyse(calls, markers if use_markers else None)
    pd.testing.assert_frame_equal(b1, b2)
    assert s1["share"] == pytest.approx(s2["share"])
    flat = lambda d, p="": {f"{p}{k}": v for k, x in d.items()  # noqa: E731
                            for k, v in (flat(x, f"{p}{k}.").items() if isinstance(x, dict) else [(k, x)])}
    e1, e2 = flat(s1["evidence"]), flat(s2["evidence"])
    assert e1.keys() == e2.keys()
    for k in e1:
        assert e1[k] == pytest.approx(e2[k], rel=1e-9), k


# ------------------------------------------------------------------------------ bad input --

def test_without_evidence_columns_says_what_is_missing():
    calls, markers = decode_trace("residency", n_batches=6, seed=1)
    bare = calls.drop(columns=list(EV))
    b, s = analyse(bare, markers)
    assert s["missing_evidence"] == list(EVIDENCE_COLUMNS)
    # only time with nothing in flight can be attributed; reads in flight are unexplained
    assert s["share"]["unexplained"] == pytest.approx(1 - s["share"]["python-scheduling"])
    assert any("unexplained" in n for n in s["notes"])
    # pages only: miss calls are residency even without off-CPU evidence
    b, s = analyse(calls.drop(columns=["bio_count", "bio_ns", "offcpu_ns", "runq_ns", "reclaim_ns"]), markers)
    assert s["verdict"] == "residency"
    assert "no bio columns" in s["normal_miss_source"]  # storage judged per inserted page
    # no miss evidence at all but off-CPU known: waits are unexplained, cached CPU is cpu-copy
    b, s = analyse(calls.drop(columns=["pages_added", "bio_count", "bio_ns"]), markers)
    assert s["share"]["residency"] == 0 and s["share"]["unexplained"] > 0.5


def test_null_evidence_values_are_counted():
    calls, _ = decode_trace("residency", n_batches=4, seed=1)
    calls["offcpu_ns"] = calls["offcpu_ns"].astype(float)
    calls.loc[::5, "offcpu_ns"] = np.nan
    _, s = analyse(calls)
    assert any("offcpu_ns" in n for n in s["notes"])


def test_empty_and_unusable_inputs_raise_user_errors():
    with pytest.raises(UserError, match="no calls"):
        analyse(hand_calls([]))
    with pytest.raises(UserError, match="lacks required"):
        analyse(pd.DataFrame({"ts_ns": [1]}))
    with pytest.raises(UserError, match="slow-call threshold"):
        analyse(hand_calls([(T0, 10, 1) + (0,) * 6]), slow_ms=-1)
    bad = hand_calls([(T0, 10, 1) + (0,) * 6])
    bad["dur_ns"] = -5
    with pytest.raises(UserError, match="usable"):
        analyse(bad)


def test_verdict_rule():
    assert verdict_of({"python-scheduling": 0.3, "cpu-copy": 0.7}) == "python-scheduling"
    assert verdict_of({"python-scheduling": 0.2, "cpu-copy": 0.8}) == "healthy"
    assert verdict_of({"residency": 0.3, "storage": 0.31}) == "storage"
    assert verdict_of({"residency": 0.3}, meaningful_share=0.5) == "healthy"


def test_all_null_evidence_column_counts_as_missing():
    """A recorder on a kernel without the sched tracepoints writes offcpu_ns/runq_ns all-null:
    the analysis must say they are missing, not read them as 'never off CPU'."""
    import numpy as np
    import pandas as pd

    from engramprof.analysis.attribution import analyse

    n = 40
    calls = pd.DataFrame({
        "ts_ns": np.arange(n) * 1_000_000 + (np.arange(n) // 4) * 20_000_000, "dur_ns": 50_000, "pid": 1, "tid": 1,
        "path": "/t", "offset": np.arange(n) * 4096, "size": 4096, "ret": 4096, "flags": 0,
        "pages_added": 1, "bio_count": 1, "bio_ns": 40_000, "reclaim_ns": 0,
        "offcpu_ns": pd.array([None] * n, dtype="Int64"), "runq_ns": pd.array([None] * n, dtype="Int64"),
    })
    res = analyse(calls)
    assert "offcpu_ns" in res.summary["missing_evidence"] and "runq_ns" in res.summary["missing_evidence"]


# ------------------------------------------------------------------ one ranking, one "slow" --

def test_one_verdict_ranking_breaks_ties_the_same_way_everywhere():
    from engramprof.analysis.verdicts import VERDICT_CAUSES, rank_causes, verdicts_of_rows
    from engramprof.analysis.diagnose import verdict_and_confidence

    # every pair of causes tied at the top: the first in VERDICT_CAUSES order wins everywhere
    for i, a in enumerate(VERDICT_CAUSES):
        for b in VERDICT_CAUSES[i + 1:]:
            shares = {c: 0.0 for c in VERDICT_CAUSES}
            shares[a] = shares[b] = 0.4
            row = np.array([[shares[c] for c in VERDICT_CAUSES]])
            assert verdict_of(shares) == a
            assert verdicts_of_rows(row, 0.25)[0] == a
            assert verdict_and_confidence(shares, 0.25)[0] == a
            assert verdict_and_confidence(shares, 0.25)[2] == b  # the runner-up
            assert rank_causes(shares)[0][0] == a


def test_slow_means_strictly_longer_than_the_threshold():
    from engramprof.analysis.verdicts import is_slow

    d = np.array([3_999_999, 4_000_000, 4_000_001])
    assert is_slow(d, 4.0).tolist() == [False, False, True]
    rows = [(T0 + i * 10_000_000, int(x), 7) + (0,) * len(EV) for i, x in enumerate(d)]
    _, s = analyse(hand_calls(rows), gap_ms=1.0)
    assert s["evidence"]["slow_calls"] == 1


def test_threads_do_not_change_results(monkeypatch):
    import engramprof.analysis.attribute as AT
    import engramprof.analysis.events as EV

    kinds = ["python-scheduling", "residency", "healthy", "storage", "reclaim"] * 4
    calls, markers = decode_trace(kinds=kinds, n_batches=len(kinds), seed=9)
    monkeypatch.setattr(EV, "CHUNK_CALLS", 200)  # many chunks, several in flight at once
    results = []
    for threads in (1, 2):
        monkeypatch.setattr(AT, "ANALYSIS_THREADS", threads)
        results.append(analyse(calls, markers))
    pd.testing.assert_frame_equal(results[0][0], results[1][0])  # bit for bit: merged in chunk order
    assert results[0][1]["evidence"] == results[1][1]["evidence"]
    assert results[0][1]["share"] == results[1][1]["share"]


# ---------------------------------------------------- holes of lost records (issue 11, item 4) --

def test_batches_overlapping_lost_records_are_left_out_and_the_blind_time_is_stated():
    calls, markers = decode_trace("python-scheduling", n_batches=30, seed=21)
    ts = calls["ts_ns"].to_numpy()
    # the recorder stopped delivering for 3 s: from the middle of batch 10 to the middle of
    # batch 12 the calls are gone, and the hole is longer than any forward pass
    mid = lambda k: int((markers["start_ns"].iloc[k] + markers["end_ns"].iloc[k]) // 2)  # noqa: E731
    b0, b1 = mid(10), mid(12)
    kept = calls[(ts < b0) | (ts > b1)].copy()
    shift = 3_000_000_000
    later = kept["ts_ns"] > b1
    kept.loc[later, "ts_ns"] += shift
    hole = pd.DataFrame({"start_ns": [b0 - 100_000], "end_ns": [b1 + shift + 100_000], "lost": [150]})
    _, blind = analyse(kept)
    _, seen = analyse(kept, samples={"lost_records": hole})
    assert blind["lost_records"]["records"] == 0
    lr = seen["lost_records"]
    assert lr["records"] == 150 and lr["intervals"] == 1 and lr["source"] == "intervals"
    assert lr["blind_ms"] == pytest.approx((b1 + shift - b0 + 200_000) / 1e6, rel=1e-6)
    assert 0.5 < lr["blind_frac"] < 1.0
    # the two half batches at the edges of the hole are left out, the rest kept
    assert lr["batches_excluded"] == 2 and seen["batches"] == blind["batches"] - 2
    assert any("were lost in 1 interval" in n for n in seen["notes"])


def test_lost_records_without_intervals_are_noted():
    calls, _ = decode_trace("healthy", n_batches=10, seed=22)
    _, s = analyse(calls, meta={"totals": {"lost_records": 1234}})
    assert s["lost_records"]["source"] == "total only" and s["lost_records"]["records"] == 1234
    assert any("1,234 call records were lost" in n for n in s["notes"])


# ------------------------------------------ memory-mapped readers: batches with no read event --

def _mmap_markers(n=40, step_ms=1.0, gap_ms=10.0, tid=500):
    start = T0 + np.arange(n) * int((step_ms + gap_ms) * 1e6)
    return pd.DataFrame({"start_ns": start, "end_ns": start + int(step_ms * 1e6), "tid": tid})


def _window(markers):
    return {"start_ns": int(markers["start_ns"].min()) - 10**6, "end_ns": int(markers["end_ns"].max()) + 10**6}


def _faults(markers, every=8):
    """A few minor faults (page mapped around) in every ``every``-th batch, on the submitter."""
    rows = []
    for k in range(0, len(markers), every):
        t = int(markers["start_ns"].iloc[k]) + 100_000
        rows.append((t, 3_000, 500) + (0,) * len(EV))
    df = hand_calls(rows)
    df["kind"] = "fault"
    df["ret"] = np.nan
    return df


def test_cached_mmap_gather_on_the_calling_thread_is_healthy():
    markers = _mmap_markers()
    calls = _faults(markers)
    b, s = analyse(calls, markers, meta=_window(markers))
    assert s["batches"] == len(markers)  # kept, although most hold no read event
    assert s["batches_without_read_events"]["batches"] == len(markers) - len(calls)
    assert s["read_events"] == {"fault": len(calls)}
    assert s["verdict"] == "healthy" and s["share"]["cpu-copy"] > 0.9
    assert any("no read event" in n and "without off-CPU spans" in n for n in s["notes"])


def test_cached_mmap_gather_split_across_a_pool_is_python_scheduling():
    # the submitting thread waits off-CPU for the pool's workers most of each step
    markers = _mmap_markers()
    calls = _faults(markers)
    spans = pd.DataFrame({"tid": 500, "start_ns": markers["start_ns"] + 150_000,
                          "end_ns": markers["start_ns"] + 850_000, "preempted": False, "waker_tid": 501})
    b, s = analyse(calls, markers, samples={"offcpu": spans}, meta=_window(markers))
    assert s["verdict"] == "python-scheduling", s["share"]
    # 35 of the 40 batches hold no read event: 70% of each is the submitter off-CPU
    unread = b["calls"] == 0
    assert unread.sum() == 35
    assert b.loc[unread, "share_python_scheduling"].to_numpy() == pytest.approx(0.7, abs=1e-9)
    assert s["batches_without_read_events"]["source"] == "offcpu spans of the submitting thread"
    # spans of another thread are not the submitter's waits
    other = spans.assign(tid=999)
    _, s2 = analyse(calls, markers, samples={"offcpu": other}, meta=_window(markers))
    assert s2["verdict"] == "healthy"


def test_mmap_reader_with_no_read_event_at_all_is_still_analysed():
    markers = _mmap_markers(n=10)
    calls = _faults(markers).iloc[0:0]
    meta = {"read_paths": ["syscall", "fault"], **_window(markers)}
    b, s = analyse(calls, markers, meta=meta)
    assert s["batches"] == 10 and s["calls"] == 0 and s["verdict"] == "healthy"
    assert s["batches_without_read_events"]["batches"] == 10


# ------------------------------------------------ several processes (issue 13, analysis side) --

def _two_ranks(seed=31):
    a, ma = decode_trace("healthy", n_batches=30, seed=seed)
    b, mb = decode_trace("storage", n_batches=30, seed=seed + 1)
    shift = 700_000  # rank 1 runs interleaved with rank 0, its batches between rank 0's
    b = b.assign(ts_ns=b["ts_ns"] + shift, pid=2, tid=b["tid"] + 5000)
    mb = mb.assign(start_ns=mb["start_ns"] + shift, end_ns=mb["end_ns"] + shift)
    a = a.assign(pid=1)
    return pd.concat([a, b], ignore_index=True), ma.assign(pid=1), mb.assign(pid=2)


def test_processes_are_analysed_on_their_own_and_the_slowest_leads():
    calls, ma, mb = _two_ranks()
    table, s = analyse(calls, pd.concat([ma, mb], ignore_index=True))
    rows = {r["pid"]: r for r in s["processes"]}
    assert set(rows) == {1, 2}
    assert rows[1]["verdict"] == "healthy" and rows[2]["verdict"] == "storage"
    assert rows[1]["batches"] == len(ma) and rows[2]["batches"] == len(mb)
    assert rows[2]["batch_ms"]["p99"] > rows[1]["batch_ms"]["p99"]
    assert s["slowest_process"] == 2 and s["verdict"] == "storage"  # the slowest process's summary
    assert set(table["pid"]) == {1, 2} and len(table) == len(ma) + len(mb)
    # without markers the two interleaved streams are still segmented apart
    table2, s2 = analyse(calls)
    by = {r["pid"]: r for r in s2["processes"]}
    assert by[1]["batches"] == pytest.approx(len(ma), abs=2) and by[2]["batches"] == pytest.approx(len(mb), abs=2)
    assert by[2]["verdict"] == "storage" and by[1]["verdict"] == "healthy"
    for r in s2["processes"]:
        assert set(r) == {"pid", "comm", "cmdline", "batches", "batch_ms", "verdict", "share"}


def test_one_process_has_a_processes_list_of_one():
    calls, markers = decode_trace("healthy", n_batches=10, seed=33)
    _, s = analyse(calls, markers)
    assert [r["pid"] for r in s["processes"]] == [4242] and s["slowest_process"] == 4242
    assert s["processes"][0]["verdict"] == s["verdict"]


def test_faults_on_the_process_code_are_not_table_reads():
    markers = _mmap_markers(n=20)
    calls = _faults(markers, every=4)
    lib = calls.copy()
    lib["path"] = ["/usr/lib/x86_64-linux-gnu/libm.so.6", "/usr/bin/python3.11", "/venv/lib/numpy/core/_mu.cpython-311-x86_64-linux-gnu.so",
                   "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13", "/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311.so"]
    both = pd.concat([calls, lib], ignore_index=True)
    _, s = analyse(both, markers, meta=_window(markers))
    assert any("5 page fault(s) on the process's own code" in n for n in s["notes"])
    _, s0 = analyse(calls, markers, meta=_window(markers))
    assert s["share"] == s0["share"]
    # only code faults, no markers: nothing to analyse, said so
    with pytest.raises(UserError, match="only page faults on the process's own code"):
        analyse(lib)


def test_report_shows_each_process_and_the_slowest_at_80_columns():
    from io import StringIO

    from rich.console import Console

    from engramprof.report import batch_tail as report
    calls, ma, mb = _two_ranks()
    table, s = analyse(calls, pd.concat([ma, mb], ignore_index=True))
    buf = StringIO()
    report.render((table, s), Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert "Processes (2), each analysed on its own" in text
    assert max(len(l) for l in text.splitlines()) <= 80
    block = text[text.index("Processes (2)"):text.index("Where batch time went")]
    cells = [[c.strip() for c in l.strip("│").split("│")] for l in block.splitlines() if l.startswith("│")]
    rows = {int(c[0]): " ".join(c) for c in cells if c[0]}
    assert "storage" in rows[2] and "(slowest)" in rows[2] and "(slowest)" not in rows[1] and "healthy" in rows[1]
    # one process: no process table (the whole report is that process)
    calls1, m1 = decode_trace("healthy", n_batches=10, seed=33)
    buf = StringIO()
    report.render(analyse(calls1, m1), Console(file=buf, width=80, color_system=None))
    assert "Processes (" not in buf.getvalue()


# --------------------------------------------------------------------- io_uring requests --

def _uring_calls(markers, path: str, per_batch=16, dur_ns=2_000_000, tid=500):
    """``per_batch`` requests submitted together at each marker's start, completing over
    ``dur_ns`` (the thread sleeps in io_uring_enter meanwhile); evidence null (not measured)."""
    rows = []
    for k in range(len(markers)):
        t = int(markers["start_ns"].iloc[k]) + 20_000
        for j in range(per_batch):
            rows.append((t + j * 1_000, dur_ns - j * 1_000, tid) + (np.nan,) * len(EV))
    df = hand_calls(rows)
    df["kind"] = "io_uring"
    df["uring_path"] = path
    df["direct"] = False
    return df


@pytest.mark.parametrize("path,verdict", [("async", "residency"), ("punted", "residency"), ("inline", "healthy")])
def test_io_uring_wait_is_a_miss_never_scheduling(path, verdict):
    """An io_uring request that waited (async / punted) is a miss wait for its whole interval,
    although its evidence columns are null; an inline one is on-CPU (the page cache had it)."""
    markers = _mmap_markers(n=30, step_ms=2.1, gap_ms=5.0)
    calls = _uring_calls(markers, path)
    b, s = analyse(calls, markers, meta=_window(markers))
    assert s["read_events"] == {"io_uring": len(calls)}
    assert s["verdict"] == verdict, s["share"]
    assert s["share"]["python-scheduling"] < 0.05 and s["share"]["unexplained"] < 0.05, s["share"]
    assert not any("evidence values missing" in n for n in s["notes"]), s["notes"]
    assert not any("not a plausible cached copy" in n for n in s["notes"]), s["notes"]


def test_o_direct_io_uring_request_is_a_miss_even_inline():
    markers = _mmap_markers(n=30, step_ms=2.1, gap_ms=5.0)
    calls = _uring_calls(markers, "inline")
    calls["direct"] = True
    _, s = analyse(calls, markers, meta=_window(markers))
    assert s["verdict"] == "residency", s["share"]


def test_figures_computed_beside_the_pipeline_are_the_direct_ones():
    """The device baseline and the durations' percentiles run on a thread beside the pipeline
    (analysis._beside): the summary holds exactly what the functions give on the same input."""
    from engramprof.analysis.baseline import device_baseline

    calls, markers = decode_trace("storage", n_batches=12, seed=5)
    _, s = analyse(calls, markers)
    dur = calls["dur_ns"].to_numpy(np.int64)
    assert s["call_ms"] == {"p50": float(np.percentile(dur, 50)) / 1e6, "p99": float(np.percentile(dur, 99)) / 1e6}
    base = device_baseline(calls)
    assert base.known and s["device_baseline"] == base.as_json()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 40), min_size=0, max_size=60))
def test_exit_holders_is_the_last_event_holding_the_latest_exit(exits):
    from engramprof.analysis.components import exit_holders

    e = np.asarray(exits, dtype=np.int64)
    reach = np.maximum.accumulate(e) if len(e) else e
    got = exit_holders(e, reach)
    want = [max(j for j in range(i + 1) if e[j] == reach[i]) for i in range(len(e))]
    assert got.dtype == np.int64 and got.tolist() == want
