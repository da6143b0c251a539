"""The cause split on every read path (issue 22, "Analysis and verdicts"), on traces built here
with the columns each recorder source writes: O_DIRECT syscalls (bios queued, no page
inserted), plain ``read()`` calls, libaio iocbs and io_uring requests (submit -> complete, their
evidence columns null).  The real-eBPF runs are tests/test_uring_record.py and
tests/test_paths_record.py.

- a read that waited for the device is a miss whatever path it took: ``residency`` on a device
  at its normal speed, ``storage`` on one slower than that (as for buffered reads), never
  python-scheduling nor "unexplained";
- batch-tail names the paths (kind, syscall, O_DIRECT or buffered), each batch's queue depth
  and io_uring split; diagnose states the O_DIRECT evidence and fits the fix to it; compare's
  per-batch read path and residency count these reads like the others.
"""
from __future__ import annotations

from io import StringIO

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from engramprof.analysis import diagnose
from engramprof.analysis.advice import advice_for
from engramprof.analysis.attribution import analyse
from engramprof.analysis.paths import DIRECT_EVIDENCE, read_path_of, read_path_steps
from engramprof.compare.load import _read_paths
from engramprof.report import batch_tail as report

T0 = 1_000_000_000_000
EV = ("pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns")
SUBMITTER = 500
N_BATCHES = 30


def _frame(rows: list[tuple], **cols) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["ts_ns", "dur_ns", "tid", *EV])
    df["pid"] = 1
    df["path"] = "/t/engram.safetensors"
    df["offset"] = np.arange(len(df)) * 4096
    df["size"] = 4096
    df["ret"] = 4096
    df["flags"] = 0
    for k, v in cols.items():
        df[k] = v
    return df


def _markers(ends: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": [a for a, _ in ends], "end_ns": [b for _, b in ends], "tid": SUBMITTER})


def _window(markers: pd.DataFrame) -> dict:
    return {"start_ns": int(markers["start_ns"].min()) - 10**6, "end_ns": int(markers["end_ns"].max()) + 10**6}


def pool_direct(bio_us: float = 100.0, workers: int = 8, per_batch: int = 96, direct=True, pages: int = 0):
    """A pool of ``workers`` threads reading ``per_batch`` rows a batch with O_DIRECT preadv:
    each read queues one bio (``bio_us`` at the device) and sleeps for it; nothing enters the
    page cache.  The submitter hands the batch out (50 µs) and collects it (30 µs)."""
    rows, marks, t = [], [], T0
    dur = int(bio_us * 1e3) + 20_000
    for _ in range(N_BATCHES):
        start = t
        w_t = [start + 50_000 + 2_000 * w for w in range(workers)]
        for j in range(per_batch):
            w = j % workers
            rows.append((w_t[w], dur, 600 + w, pages, 1, int(bio_us * 1e3), 0, dur - 15_000, 0))
            w_t[w] += dur + 5_000
        end = max(w_t) + 30_000
        marks.append((start, end))
        t = end + 5_000_000
    return _frame(rows, kind="syscall", syscall="preadv2", direct=direct), _markers(marks)


def serial_read(cold: bool, per_batch: int = 24):
    """One thread doing lseek + read() per row: cold, each read inserts a page and sleeps 150 µs
    for its bio; warm, each read is a 3 µs copy.  2 µs of its own loop between reads."""
    rows, marks, t = [], [], T0
    for _ in range(N_BATCHES):
        start, at = t, t + 20_000
        for _ in range(per_batch):
            if cold:
                rows.append((at, 160_000, SUBMITTER, 1, 1, 150_000, 0, 150_000, 0))
                at += 162_000
            else:
                rows.append((at, 3_000, SUBMITTER, 0, 0, 0, 0, 0, 0))
                at += 5_000
        marks.append((start, at + 10_000))
        t = at + 5_000_000
    return _frame(rows, kind="syscall", syscall="read", direct=False), _markers(marks)


def requests(kind: str, interval_us: float, direct, uring_path=None, per_batch: int = 16):
    """``per_batch`` requests submitted together by the step thread at each batch's start; the
    device returns one every ``interval_us`` (request j completes (j + 1) intervals after the
    submit) while the thread sleeps in io_uring_enter / io_getevents.  Their evidence columns
    are null (their probes do not measure them)."""
    rows, marks, t = [], [], T0
    step = int(interval_us * 1e3)
    for _ in range(N_BATCHES):
        at = t + 20_000
        for j in range(per_batch):
            rows.append((at + j * 1_000, (j + 1) * step, SUBMITTER) + (np.nan,) * len(EV))
        end = at + per_batch * step + 15_000
        marks.append((t, end))
        t = end + 5_000_000
    return _frame(rows, kind=kind, syscall=kind, direct=direct, uring_path=uring_path), _markers(marks)


def _bt(calls, markers):
    return analyse(calls, markers, meta=_window(markers))


# --------------------------------------------------------------------------- verdicts --

@pytest.mark.parametrize("direct", [True, None], ids=["direct-flag", "bios-only"])
def test_o_direct_pool_reads_are_residency_not_unexplained(direct):
    """The RocksDB shape: every call queued a bio and inserted nothing.  Its sleep is the device
    read (residency), not "unexplained"; the pool's hand-offs stay small.  Without the direct
    flag (an older trace) its bios alone make it a miss."""
    calls, markers = pool_direct(direct=direct)
    table, s = _bt(calls, markers)
    assert s["verdict"] == "residency", s["share"]
    assert s["share"]["unexplained"] < 0.02 and s["share"]["python-scheduling"] < 0.15, s["share"]
    assert s["evidence"]["calls_with_misses_frac"] == 1.0
    assert (table["calls_with_misses"] == table["calls"]).all()
    assert not any("unexplained" in n for n in s["notes"]), s["notes"]


def test_o_direct_on_a_slow_device_is_storage_as_for_buffered_reads():
    """Every bio 6 ms (a throttled device): the normal miss service is capped at 1 ms, so most
    of each wait is storage -- the same answer as the same reads buffered (a page each)."""
    direct, markers = pool_direct(bio_us=6000.0)
    buffered, _ = pool_direct(bio_us=6000.0, direct=False, pages=1)
    d, b = _bt(direct, markers)[1], _bt(buffered, markers)[1]
    assert d["verdict"] == b["verdict"] == "storage", (d["share"], b["share"])
    assert abs(d["share"]["storage"] - b["share"]["storage"]) < 0.02


@pytest.mark.parametrize("cold,verdict", [(True, "residency"), (False, "healthy")])
def test_serial_read_calls(cold, verdict):
    """``read()`` on one thread: cold its waits are residency (never python-scheduling, which
    the old trace without read events said); warm it is healthy."""
    calls, markers = serial_read(cold)
    _, s = _bt(calls, markers)
    assert s["verdict"] == verdict, s["share"]
    assert s["share"]["python-scheduling"] < 0.05, s["share"]
    assert s["read_paths"] == [{"kind": "syscall", "syscall": "read", "direct": False, "events": len(calls),
                                "share": 1.0}]


@pytest.mark.parametrize("kind,path", [("libaio", None), ("io_uring", "inline"), ("io_uring", "async")])
def test_o_direct_requests_are_io_waits(kind, path):
    """libaio and io_uring requests on an O_DIRECT file, submitted together and waited for in
    io_getevents / io_uring_enter: residency, whatever io_uring's path; no evidence column is
    missing and no share is unexplained."""
    calls, markers = requests(kind, 100.0, direct=True, uring_path=path)
    table, s = _bt(calls, markers)
    assert s["read_events"] == {kind: len(calls)}
    assert s["verdict"] == "residency", s["share"]
    assert s["share"]["python-scheduling"] < 0.05 and s["share"]["unexplained"] < 0.02, s["share"]
    assert s["missing_evidence"] == [] and not any("missing" in n for n in s["notes"]), s["notes"]
    assert "requests that waited" in s["normal_miss_source"]
    assert (table["queue_depth_max"] == 16).all() and (table["direct_calls"] == 16).all()


def test_buffered_libaio_without_evidence_is_not_a_miss():
    """A buffered AIO read is done inside io_submit: without evidence it is the copy it almost
    always is (a cached row), not a device wait."""
    calls, markers = requests("libaio", 1.0, direct=False)
    _, s = _bt(calls, markers)
    assert s["verdict"] == "healthy" and s["share"]["residency"] == 0.0, s["share"]


@pytest.mark.parametrize("kind,path", [("libaio", None), ("io_uring", "async")])
def test_requests_on_a_slow_device_are_storage(kind, path):
    """A device that returns one request every 5 ms (a throttle): slower than any normal device
    service (capped at 1 ms), so storage -- a request path could never be storage before."""
    calls, markers = requests(kind, 5000.0, direct=kind == "libaio", uring_path=path)
    _, s = _bt(calls, markers)
    assert s["verdict"] == "storage", s["share"]


@pytest.mark.parametrize("with_bios", [False, True], ids=["no-evidence", "own-bios"])
def test_a_deep_queue_on_a_device_at_normal_speed_is_residency_not_storage(with_bios):
    """64 requests submitted at once, returned one per 100 µs: the last waits 64 times longer
    than the first, but the device served each at its normal interval -- no storage share.  (Each
    request's own submit -> complete against the median would call half of them slow; so would
    its bio's queue -> complete, which holds the same queue: the io_uring source's per-request
    bios.)"""
    calls, markers = requests("io_uring", 100.0, direct=False, uring_path="async", per_batch=64)
    if with_bios:  # the request's own page and bio, its bio waiting in the device queue as long
        calls["pages_added"], calls["bio_count"], calls["bio_ns"] = 1.0, 1.0, calls["dur_ns"] - 5_000
    _, s = _bt(calls, markers)
    assert s["verdict"] == "residency" and s["share"]["storage"] < 0.02, s["share"]
    dev = s["io_uring"]["device_ms"]  # the requests' own bios where the source credits them
    assert (dev is None) if not with_bios else (dev["bios"] == len(calls) and dev["method"] == "the requests' own bios")
    assert s["normal_miss_us"] == pytest.approx(100.0, rel=0.05)


def reaped(kind: str, reap_us: list[float], bio_us: float = 300.0, per_batch: int = 32, with_bio=None):
    """``per_batch`` O_DIRECT requests submitted at once each batch (one io_submit /
    io_uring_enter: one entry time), each with one bio of its own served in ``bio_us`` at the
    device, all reaped together ``reap_us[i % len(reap_us)]`` after the submit (a reaping thread
    that runs late under CPU load).  ``with_bio``: per request index, it has its bio (else: the
    bio was held by a throttle and queued by its worker: not credited to the request)."""
    rows, marks, t = [], [], T0
    for i in range(N_BATCHES):
        at, dur = t + 20_000, int(reap_us[i % len(reap_us)] * 1e3)
        for j in range(per_batch):
            bio = with_bio is None or with_bio(j)
            rows.append((at, dur, SUBMITTER, np.nan, int(bio), int(bio_us * 1e3) + 7 * j if bio else 0)
                        + (np.nan,) * 3)
        marks.append((t, at + dur + 15_000))
        t = at + dur + 5_000_000
    path = "async" if kind == "io_uring" else None
    return _frame(rows, kind=kind, syscall=kind, direct=True, uring_path=path), _markers(marks)


@pytest.mark.parametrize("kind", ["libaio", "io_uring"])
def test_requests_reaped_late_are_not_storage(kind):
    """Each request's bio takes 300 µs at the device in every batch, but one batch in three is
    reaped 6 ms after the submit instead of 0.5 ms (the lab's aio reader under CPU load: bio p50
    0.73 ms, submit -> reap p50 5.3 ms).  The device was at its normal speed: residency, no
    storage share; the time after the bios were done is the reap's (shown apart), never
    storage.  (Judged by submit -> reap, the late batches came back 12x slower than the others:
    storage ~80%.)"""
    calls, markers = reaped(kind, [500.0, 500.0, 6000.0])
    # one request a batch has a bio time longer than its own interval (seen on io_uring
    # requests with readahead): not a measure of it; its device part ends with its batch's
    calls.loc[calls.index % 32 == 5, "bio_ns"] = 10**10
    table, s = _bt(calls, markers)
    assert s["verdict"] == "residency", s["share"]
    assert s["share"]["storage"] < 0.02, s["share"]
    late = table["wall_ms"] > 5
    assert late.sum() == N_BATCHES // 3
    # the time after the device was done (5.7 of 6 ms, 0.2 of 0.5 ms) is the reap's; each batch's
    # wall time is 35 µs longer (submit 20 µs after the start, end 15 µs after the reap)
    assert s["evidence"]["reap_wait_share"] == pytest.approx((5.7 * 10 + 0.2 * 20) / (6.035 * 10 + 0.535 * 20),
                                                             rel=0.01)
    assert s["share"]["residency"] > 0.95
    seen = {x["step"]: x for x in read_path_steps(s)}["read paths"]["finding"]
    assert "not yet reaped 86%" in seen and "never storage" in seen
    buf = StringIO()
    report.render((table, s), Console(file=buf, width=80, color_system=None))
    assert "not yet reaped 86%" in " ".join(buf.getvalue().split())
    assert max(len(x) for x in buf.getvalue().splitlines()) <= 80


def test_throttled_requests_stay_storage_beside_requests_with_fast_bios():
    """The throttled loop device (lab scenario storage): of 32 requests submitted together, 6
    got their bio through at once (300 µs at the device), 26 were held by the blkio throttle
    (no bio of theirs is seen: the throttle's worker queues it) and the batch is reaped when the
    last comes back, 32 x 5 ms later.  The held requests' whole interval is the device's: storage,
    as before; no time is a reap's."""
    calls, markers = reaped("libaio", [160_000.0], with_bio=lambda j: j < 6)
    _, s = _bt(calls, markers)
    assert s["verdict"] == "storage" and s["share"]["storage"] > 0.7, s["share"]
    assert "reap_wait_share" not in s["evidence"]


def test_device_weights_split_the_union_into_device_and_reap():
    """Two requests from 0: A at the device until 2, B until 6, both reaped at 10; a call from
    8 to 12.  [0, 2) is shared by A and B at the device, [2, 6) is B's, [6, 8) both wait for
    their reap, [8, 10) the call is the only one at the device (its whole interval is its own),
    [10, 12) the call's."""
    from engramprof.analysis.components import device_weights, inflight_weights

    s, e, t = np.array([0, 0, 8]), np.array([10, 10, 12]), np.array([2, 6, 12])
    dev, tail = device_weights(s, e, t)
    assert dev.tolist() == [1.0, 5.0, 4.0] and tail.tolist() == [1.0, 1.0, 0.0]
    assert (dev + tail).sum() == inflight_weights(s, e).sum() == 12
    dev, tail = device_weights(s, e, e)  # no device end before the exit: the in-flight shares
    assert np.allclose(dev, inflight_weights(s, e)) and not tail.any()


# ---------------------------------------------------------------- what the answer shows --

def test_io_uring_batches_show_queue_depth_and_split():
    calls, markers = requests("io_uring", 100.0, direct=False, uring_path="async")
    calls.loc[calls.index % 4 == 0, "uring_path"] = "inline"
    calls.loc[calls.index % 8 == 1, "uring_path"] = "punted"
    table, s = _bt(calls, markers)
    assert (table["uring_inline"] == 4).all() and (table["uring_punted"] == 2).all()
    assert (table["uring_async"] == 10).all() and (table["queue_depth_max"] == 16).all()
    u = s["io_uring"]
    assert u["requests"] == len(calls) and u["paths"] == {"inline": 120, "async": 300, "punted": 60}
    assert u["queue_depth_max"] == {"p50": 16.0, "p99": 16.0} and u["device_ms"] is None
    assert u["submit_complete_ms"]["p50"] == pytest.approx(np.median(calls["dur_ns"]) / 1e6)
    assert s["slowest_batches"][0]["uring_async"] == 10 and s["slowest_batches"][0]["queue_depth_max"] == 16
    step = {x["step"]: x for x in read_path_steps(s)}["io_uring"]
    assert "inline 25%" in step["finding"] and "punted to io-wq 12%" in step["finding"]
    assert "queue depth" in step["finding"] and "not measured" in step["finding"]
    buf = StringIO()
    report.render((table, s), Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert "read paths: io_uring (buffered) 480 (100%)" in " ".join(text.split())
    assert max(len(x) for x in text.splitlines()) <= 80


def test_device_time_from_the_bio_histogram():
    from engramprof.analysis.paths import device_ms

    h = pd.DataFrame({"log2_slot": [16, 17, 20], "ns_lower": [65536, 131072, 1048576], "count": [60, 39, 1]})
    assert device_ms(h) == {"p50": 0.065536, "p99": 0.131072, "bios": 100, "method": "log2 histogram, lower bucket edge"}
    assert device_ms(h.iloc[0:0]) is None and device_ms(None) is None


def test_diagnose_states_o_direct_and_fits_the_fix():
    calls, markers = pool_direct()
    _, s = _bt(calls, markers)
    assert s["direct"]["share"] == 1.0 and s["direct"]["evidence"] == DIRECT_EVIDENCE
    steps = {x["step"]: x for x in read_path_steps(s)}
    assert steps["read paths"]["finding"].startswith("preadv2 (O_DIRECT) 2,880 (100%)")
    assert DIRECT_EVIDENCE in steps["O_DIRECT"]["finding"]
    qd = s["queue_depth"]["max"]["p50"]
    assert qd == 8  # eight workers, one read each at a time
    fix = advice_for("residency", read_path_of(s), s)
    assert "in flight" in fix["fix"] and f"at most {qd:.0f} at once" in fix["fix"] and "memory" in fix["fix"]
    # the buffered reader's fix is unchanged
    buffered, _ = serial_read(True)
    _, sb = _bt(buffered, markers)
    assert "O_DIRECT" not in advice_for("residency", read_path_of(sb), sb)["fix"]
    # the evidence chain counts every O_DIRECT read as a miss (it inserted no page)
    chain = diagnose.evidence_chain(s, calls, {}, None, None, {})
    res = next(x for x in chain if x["step"] == "residency of their pages")
    assert res["value"] == 1.0 and "O_DIRECT" in res["finding"]


def test_read_path_of_names_libaio():
    assert read_path_of({"read_events": {"libaio": 4}}) == "libaio"
    assert read_path_of({"read_events": {"libaio": 4, "syscall": 1}}) == "both"


def test_compare_read_path_and_residency_per_batch():
    """compare's per-batch read path knows each kind (a stray syscall in a libaio batch does not
    make it mixed), and a batch of O_DIRECT reads is not "resident" because it inserted nothing."""
    aio, markers = requests("libaio", 100.0, direct=True)
    stray = aio.iloc[:1].assign(kind="syscall", ts_ns=aio["ts_ns"].iloc[0] + 10)
    calls = pd.concat([aio, stray], ignore_index=True).sort_values("ts_ns", kind="stable")
    starts, ends = markers["start_ns"].to_numpy(), markers["end_ns"].to_numpy()
    n = np.array([16] * N_BATCHES)
    n[0] = 17
    got = _read_paths(calls, starts, ends, n)
    assert list(got) == ["libaio"] * N_BATCHES
    half = calls.copy()
    half.loc[half.index % 2 == 0, "kind"] = "io_uring"
    assert set(_read_paths(half, starts, ends, n)) == {"mixed"}
    direct, dm = pool_direct()
    table, _ = _bt(direct, dm)
    assert (1.0 - table["calls_with_misses"] / table["calls"] == 0.0).all()
