"""engramprof replay: per-arm samples, byte-for-byte verification, cold mixes, bad input.

Traces are built by hand with TraceWriter from the lab workload's planned reads of a small
lab table in tmp_path (2 layers x 4096 rows: 2.1 MiB), so no BPF is needed.  Kept light:
small batches, one or two rounds, small pools.
"""
from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engramprof.lab import replay as rp
from engramprof.host import residency as res
from engramprof.errors import UserError
from tests.coldrun import until_nowait_refuses

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python")
ROWS = 4096
THREADS = 4


def _fs_type(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


def _write_trace(path: Path, table: Path, batches: list[list[tuple[int, int]]], gap_ns: int = 20_000_000) -> Path:
    from engramprof.trace import CALL_SCHEMA, TraceWriter

    recs, t = [], 1_000_000_000
    for b in batches:
        for off, size in b:
            recs.append((t, off, size))
            t += 3_000
        t += gap_ns
    a = np.array(recs, dtype=np.int64)
    n = len(a)
    df = pd.DataFrame({c: np.zeros(n, dtype=CALL_SCHEMA.field(c).type.to_pandas_dtype()) for c in CALL_SCHEMA.names})
    df["ts_ns"], df["dur_ns"] = a[:, 0], 2_000
    df["path"], df["offset"], df["size"], df["ret"] = str(table), a[:, 1], a[:, 2], a[:, 2]
    df["syscall"], df["tensor"], df["row"] = "preadv2", "", -1
    w = TraceWriter(path)
    w.append_calls(df)
    w.close()
    return path


def _fresh_cache(table: Path) -> None:
    """Evict the whole file, then read it back with random-advised reads: page-sized folios
    (a freshly written file sits in large folios, which per-row DONTNEED cannot drop)."""
    from engramprof.lab import workload

    workload.evict(table)
    workload.warm(table)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from engramprof.lab import table, workload

    d = tmp_path_factory.mktemp("replay")
    if _fs_type(d) in ("tmpfs", "ramfs"):
        pytest.skip("tmp is on tmpfs: its pages cannot be evicted")
    t = d / "table.safetensors"
    table.make_table(t, rows=ROWS, seed=7)
    batches = workload.planned_reads(t, steps=3, tokens=64)  # 4 jobs x <=384 rows per batch
    tr = _write_trace(d / "trace", t, batches)
    return {"dir": d, "table": t, "trace": tr, "batches": batches}


def test_cached_replay(lab):
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], rounds=2, threads=THREADS)
    assert r["mismatches"] == 0
    assert r["rows_verified"] > 0
    assert set(r["arms"]) == {"pool", "nowait", "serial"}
    assert r["batches"] == 3  # the trace's own batches (gap inference)
    assert r["jobs_per_batch"] == {"min": 4, "max": 4}
    assert r["rows_per_batch"]["max"] == max(len(b) for b in lab["batches"])
    assert r["speedup"]["pool"] == 1.0
    for name, a in r["arms"].items():
        assert a["batches"] == 2 * 3
        assert a["batch_ms"]["p50"] > 0 and a["batch_ms"]["p90"] >= a["batch_ms"]["p50"]
        for k in ("ctx_voluntary", "ctx_involuntary", "cpu_user_s", "cpu_sys_s", "fallback_rows"):
            assert a[k] >= 0
        assert a["cold_frac_observed"] <= 0.01  # asked for a cached mix
    assert r["arms"]["serial"]["fallback_rows"] == 0
    assert any("residual race" in n for n in r["notes"])
    assert r["cold_frac"] == 0.0
    # the rounds: interleaved, order rotated, every batch of every arm, the figures their medians
    assert r["rounds"] == 2 and len(r["per_round"]) == 2
    assert [x["order"] for x in r["per_round"]] == [["pool", "nowait", "serial"], ["nowait", "serial", "pool"]]
    for x in r["per_round"]:
        for name in r["arms"]:
            assert len(x["batch_ms"][name]) == 3
            assert x["median_ms"][name] == pytest.approx(np.median(x["batch_ms"][name]), abs=1e-3)
            assert x["cold_frac_observed"][name] <= 0.01
        assert x["speedup"]["pool"] == 1.0
    for name, a in r["arms"].items():
        assert a["rounds_ms"]["n"] == 2 and a["rounds_ms"]["lo"] is None  # 2 rounds: no 95% interval
        assert a["rounds_ms"]["estimate"] == pytest.approx(np.median([x["median_ms"][name] for x in r["per_round"]]),
                                                           abs=2e-3)
    assert set(r["speedup_ci"]) == {"nowait", "serial"}
    assert all(c["claim"] == "no interval" and "not supported" in c["statement"] for c in r["speedup_ci"].values())


def test_plan_gives_each_arm_page_disjoint_cold_rows(lab):
    """The planner, without I/O: cold rows of different arms never share a page, and never
    share one with any arm's resident rows."""
    rows = rp._row_table(__import__("engramprof.trace", fromlist=["x"]).load_bundle(lab["trace"]), None, None, None, [])
    pops = []
    for (path, tensor, size), g in rows.groupby(["path", "tensor", "size"]):
        if size < 64:
            continue  # the 8-byte scale tensors span 8 pages: too few for three arms' cold shares
        p = rp.Population(rp.JobKey(path, tensor, int(size)), np.unique(g["offset"].to_numpy(np.int64)))
        # pretend half the rows are resident, alternating by page so both kinds are spread out
        first, last = p.offsets // res.PAGE_SIZE, (p.offsets + size - 1) // res.PAGE_SIZE
        p.frac = ((first % 2) + (last % 2)) / 2.0  # rows over two pages: 0.5 ("partly")
        pops.append(p)
    shapes = [rp.Shape(0, [(i, len(p.offsets) // 8) for i, p in enumerate(pops)])]
    assert len(pops) == 2
    arms = ["pool", "nowait", "serial"]
    # without eviction every cold page can be used once (it is cached after the read), so the
    # small trace only has enough cold rows for one round; with eviction arms reuse their share
    for allow_evict, rounds in ((False, 1), (True, 2)):
        planned = rp.plan(pops, shapes, arms, 0.5, rounds, allow_evict, np.random.default_rng(1), [])
        assert len(planned) == 3 * rounds
        pages = {a: {"cold": set(), "hot": set()} for a in arms}
        cold_rows_by_batch = []
        for pb in planned:
            for pi, offs, is_cold in pb.jobs:
                size = pops[pi].key.size
                for off, c in zip(offs.tolist(), is_cold.tolist()):
                    pg = set(range(off // res.PAGE_SIZE, (off + size - 1) // res.PAGE_SIZE + 1))
                    pages[pb.arm]["cold" if c else "hot"] |= pg
                assert abs(is_cold.mean() - 0.5) < 0.01
            cold_rows_by_batch.append((pb.arm, pb.round))
        for a in arms:
            for b in arms:
                if a != b:
                    assert not pages[a]["cold"] & pages[b]["cold"], (allow_evict, a, b)
                assert not pages[a]["cold"] & pages[b]["hot"], (allow_evict, a, b)


def test_cold_mix_needs_allow_evict_and_evicts_nothing_without_it(lab):
    _fresh_cache(lab["table"])
    with res.open_file(lab["table"]) as f:
        before = res.mincore_bitmap(f.fd, 0, f.pages)
    with pytest.raises(UserError, match="allow_evict"):
        rp.replay(lab["trace"], cold_frac=0.5, rounds=1, threads=THREADS)
    with res.open_file(lab["table"]) as f:
        after = res.mincore_bitmap(f.fd, 0, f.pages)
    assert not (after & ~before).any()


def test_cold_mix_with_allow_evict(lab):
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["pool", "nowait"], cold_frac=0.5, rounds=1, allow_evict=True, threads=THREADS)
    assert r["mismatches"] == 0
    for a in r["arms"].values():
        assert a["evicted_pages"] > 0
        assert 0.4 <= a["cold_frac_observed"] <= 0.55, a
    assert any("--allow-evict" in n for n in r["notes"])


def test_already_cold_rows_need_no_flag(lab):
    # cold rows: NOWAIT refuses at least the first try (in one of a few cold runs, each judged
    # whole: tests/coldrun.py; CI saw one run with no EAGAIN at all)
    def cold_replay(_attempt):
        r = rp.replay(lab["trace"], ["pool", "nowait"], cold_frac=1.0, rounds=1, threads=THREADS, max_batches=1)
        assert r["mismatches"] == 0
        for a in r["arms"].values():
            assert a["evicted_pages"] == 0
            assert a["cold_frac_observed"] >= 0.95
        return r

    r = until_nowait_refuses(cold_replay, lambda r: r["arms"]["nowait"]["eagain"], evict=lab["table"])
    assert r["arms"]["nowait"]["eagain"] > 0


def _corrupting_preadv(fd, bufs, offset, flags=0):
    n = os.preadv(fd, bufs, offset, flags)
    if n > 0 and offset % 3 == 0:
        bufs[0][0] = (bufs[0][0] + 1) % 256  # one wrong byte in a third of the rows
    return n


def test_mismatch_fails_the_run(lab, monkeypatch):
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["pool", "serial"], rounds=1, threads=THREADS, max_batches=1,
                  preadv=_corrupting_preadv)
    assert r["mismatches"] > 0
    assert r["arms"]["pool"]["mismatched_rows"] > 0 and r["arms"]["serial"]["mismatched_rows"] > 0
    # through the CLI: the result is printed, then a one-line error and exit 1
    from typer.testing import CliRunner

    from engramprof.cli import app
    monkeypatch.setattr(rp, "replay", functools.partial(rp.replay, preadv=_corrupting_preadv))
    out = CliRunner().invoke(app, ["replay", str(lab["trace"]), "--rounds", "1", "--batches", "1",
                                   "--threads", "4", "--json"])
    assert isinstance(out.exception, UserError) and out.exception.code == 1
    assert "byte-for-byte check FAILED" in str(out.exception)
    assert json.loads(out.stdout)["mismatches"] > 0


def _no_nowait_preadv(fd, bufs, offset, flags=0):
    if flags:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    return os.preadv(fd, bufs, offset)


def test_filesystem_without_nowait(lab):
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["pool", "nowait"], rounds=1, threads=THREADS, max_batches=2,
                  preadv=_no_nowait_preadv)
    assert r["mismatches"] == 0
    nw = r["arms"]["nowait"]
    assert nw["nowait_unsupported"] is True
    assert nw["fallback_rows"] == nw["rows"]
    assert any("nowait: RWF_NOWAIT is not supported" in n for n in r["notes"])


def test_moved_and_shrunk_files(lab, tmp_path):
    t = tmp_path / "copy.safetensors"
    shutil.copy(lab["table"], t)
    tr = _write_trace(tmp_path / "trace", t, lab["batches"][:1])
    with open(t, "r+b") as f:
        f.truncate(t.stat().st_size // 2)
    with pytest.raises(UserError, match="shrank since the trace"):
        rp.replay(tr, rounds=1)
    moved = tmp_path / "moved.safetensors"
    t.rename(moved)
    with pytest.raises(UserError, match=r"copy.safetensors: no longer exists \(moved or deleted"):
        rp.replay(tr, rounds=1)
    # the CLI: one line, exit 2
    out = subprocess.run([PY, "-m", "engramprof", "replay", str(tr)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "no longer exists" in out.stderr and "Traceback" not in out.stderr


def test_bad_arguments(lab, tmp_path):
    with pytest.raises(UserError, match="unknown bogus"):
        rp.replay(lab["trace"], ["pool", "bogus"])
    with pytest.raises(UserError, match="cold_frac"):
        rp.replay(lab["trace"], cold_frac=1.5)
    with pytest.raises(UserError, match="no such trace"):
        rp.replay(tmp_path / "nothing")
    # a trace with no positional reads
    empty = _write_trace(tmp_path / "t2", lab["table"], [[(-1, 256)]])
    with pytest.raises(UserError, match="no positional row reads"):
        rp.replay(empty)


def test_rows_per_batch_and_markers(lab, tmp_path):
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["serial"], rounds=1, rows_per_batch=500, max_batches=2)
    assert r["rows_per_batch"]["max"] == 500 and r["batches"] == 2
    assert r["speedup"] == {"serial": None}
    # markers: one marker around the first two batches -> one batch of both
    calls = __import__("engramprof.trace", fromlist=["x"]).load(lab["trace"])
    n0 = len(lab["batches"][0]) + len(lab["batches"][1])
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"start_ns": int(calls.ts_ns.iloc[0]), "end_ns": int(calls.ts_ns.iloc[n0 - 1]) + 10_000}) + "\n")
    r = rp.replay(lab["trace"], ["serial"], rounds=1, markers=m)
    assert r["batches"] == 1 and any("markers" in n for n in r["notes"])


def test_cli_human_output(lab):
    _fresh_cache(lab["table"])
    out = subprocess.run([PY, "-m", "engramprof", "replay", str(lab["trace"]), "--rounds", "6", "--batches", "1",
                          "--threads", "4"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    for word in ("pool", "nowait", "serial", "speedup", "byte-for-byte", "all identical", "residual race",
                 "6 round(s)", "95% CI", "order-statistic", "speedup, "):
        assert word in out.stdout, (word, out.stdout)
    # one claim line per arm compared with the pool, in the interval's words
    claims = [c for c in re.sub(r"\n  ", " ", out.stdout).splitlines() if c.startswith("speedup, ")]
    assert len(claims) == 2 and all("95% interval" in l for l in claims), out.stdout


def test_cold_quota_spreads_over_jobs_that_have_cold_rows():
    n = np.array([100, 100, 10, 10])
    # the small jobs (scale rows, say) are all resident: their cold share moves to the others
    q = rp._cold_quota(n, 0.5, cold_avail=np.array([500, 500, 0, 0]), hot_avail=np.array([500, 500, 10, 10]))
    assert q.tolist() == [55, 55, 0, 0] and q.sum() == 110
    assert rp._cold_quota(n, 0.5, np.array([50, 50, 0, 0]), np.array([500] * 4)) == "cold"
    assert rp._cold_quota(n, 0.0, np.array([0] * 4), np.array([100, 100, 10, 5])) == "resident"
    assert rp._cold_quota(n, 0.0, np.array([0] * 4), np.array([100, 100, 10, 10])).tolist() == [0, 0, 0, 0]


def test_mmap_arms_cached_and_cold_with_per_arm_eviction(lab):
    """The mmap arms gather the same rows through a mapping: byte-identical, no read syscall,
    and the same per-arm residency control (a mapped page survives fadvise DONTNEED, so the
    cold rows are unmapped first: round 2 re-evicts pages the first round mapped)."""
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["pool", "mmap", "mmap-pool"], rounds=1, threads=THREADS, max_batches=2)
    assert r["mismatches"] == 0 and r["arms"]["mmap"]["rows"] == r["arms"]["pool"]["rows"] > 0
    for name in ("mmap", "mmap-pool"):
        assert r["arms"][name]["calls"] == 0 and r["arms"][name]["cold_frac_observed"] <= 0.01
        assert r["arms"][name]["faults_major"] == 0
    assert r["arms"]["pool"]["calls"] > 0
    assert any("numpy.memmap" in n for n in r["notes"])
    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["serial", "mmap"], cold_frac=0.5, rounds=2, allow_evict=True,
                  threads=THREADS, max_batches=2)
    assert r["mismatches"] == 0, r
    for name in ("mmap",):
        a = r["arms"][name]
        assert 0.4 <= a["cold_frac_observed"] <= 0.55, (name, a)
        assert a["calls"] == 0 and a["faults_major"] > 0, (name, a)
        assert a["unmapped_pages"] > 0 and a["evicted_pages"] > 0, (name, a)
    assert 0.4 <= r["arms"]["serial"]["cold_frac_observed"] <= 0.55
    assert any("MADV_DONTNEED" in n for n in r["notes"])


def test_mmap_gather_at_unaligned_offsets(tmp_path):
    """A trace's reads need not be row-aligned: the mapping gathers at any byte offset."""
    from engramprof.lab import readers

    data = np.random.default_rng(3).integers(0, 256, 100_003, dtype=np.uint8)
    f = tmp_path / "t.bin"
    f.write_bytes(data.tobytes())
    offs = np.array([0, 7, 4095, 12_345, 100_003 - 40], dtype=np.int64)
    fd = readers.open_table(f)
    try:
        for name in ("mmap", "mmap-pool"):
            out = np.zeros((len(offs), 40), dtype=np.uint8)
            with readers.make_reader(name, 2) as rd:
                rd.read_batch([readers.Job(fd, offs, 40, out)])
                assert rd.unmap(fd, offs, 40) > 0
            for i, o in enumerate(offs.tolist()):
                assert out[i].tobytes() == data[o:o + 40].tobytes(), (name, o)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- io_uring and direct arms

NEW_ARMS = ["pool", "io_uring", "direct"]


def _flip_first_byte(view) -> None:
    view[0] = (view[0] + 1) % 256


def test_io_uring_and_direct_arms_read_the_bytes_pool_reads(lab, monkeypatch):
    """Cached mix: the new arms read every row byte-identical to the reference (and so to the
    pool); the O_DIRECT arm's unaligned rows are read by their covering extent and said so;
    and the byte check does see a wrong byte in either new arm."""
    from engramprof.lab import direct_io, uring

    _fresh_cache(lab["table"])
    r = rp.replay(lab["trace"], ["pool", "uring", "direct"], rounds=1, threads=THREADS, max_batches=2)
    assert r["strategies"] == NEW_ARMS  # the lab's name "uring" is the io_uring arm
    assert r["mismatches"] == 0 and r["rows_verified"] == 3 * r["arms"]["pool"]["rows"] > 0
    for name in NEW_ARMS:
        a = r["arms"][name]
        assert a["rows"] == r["arms"]["pool"]["rows"] and a["calls"] > 0, (name, a)
        assert a["cold_frac_observed"] <= 0.01, (name, a)  # warm arms warm (mincore before each batch)
    od = r["arms"]["direct"]["o_direct"]
    assert od["alignment"] and all(x >= 512 and x & (x - 1) == 0 for x in od["alignment"])
    assert 0 < od["unaligned_rows"] <= r["arms"]["direct"]["rows"]  # the lab's 8-byte scale rows at least
    assert od["bytes_read"] > od["bytes_requested"] > 0
    assert any("aligned covering extent" in n for n in r["notes"])
    assert any("O_DIRECT bypasses the page cache" in n for n in r["notes"])
    assert "o_direct" not in r["arms"]["io_uring"]

    # a wrong byte in either new arm fails the check for that arm only
    real_extent, real_read_all = direct_io.read_extent, uring.Ring.read_all

    def bad_extent(dfd, arena, slot, start, need, length, align):
        calls = real_extent(dfd, arena, slot, start, need, length, align)
        _flip_first_byte(arena[slot + (need - 1):])  # the row's last byte is always in the extent
        return calls

    def bad_read_all(self, reqs):
        n = real_read_all(self, reqs)
        for _, buf, _ in reqs:
            _flip_first_byte(buf)
        return n

    monkeypatch.setattr(direct_io, "read_extent", bad_extent)
    monkeypatch.setattr(uring.Ring, "read_all", bad_read_all)
    r = rp.replay(lab["trace"], NEW_ARMS, rounds=1, threads=THREADS, max_batches=1)
    rows = r["arms"]["pool"]["rows"]
    assert r["arms"]["pool"]["mismatched_rows"] == 0
    assert r["arms"]["io_uring"]["mismatched_rows"] == rows and r["arms"]["direct"]["mismatched_rows"] == rows


def _cached_pages(path) -> int:
    """Pages of the file in the page cache: cachestat where the kernel has it, else mincore."""
    with res.open_file(path) as f:
        if res.cachestat_available(f.fd):
            return int(res.cachestat(f.fd).nr_cache)
        return int(res.mincore_bitmap(f.fd, 0, f.pages).sum())


def test_io_uring_and_direct_arms_keep_their_residency(lab):
    """A cold mix: every arm, every round, starts from the mix asked (mincore just before
    the batch); the O_DIRECT arm leaves the page cache as it found it (cachestat), so it cannot
    warm another arm's cold rows; the buffered io_uring arm caches what it reads."""
    from engramprof.lab import readers

    _fresh_cache(lab["table"])
    # a quarter cold: three arms' cold shares and the shared resident one fit the small trace
    r = rp.replay(lab["trace"], NEW_ARMS, cold_frac=0.25, rounds=2, allow_evict=True, threads=THREADS,
                  max_batches=2)
    assert r["mismatches"] == 0, r
    for x in r["per_round"]:
        for name in NEW_ARMS:
            assert 0.2 <= x["cold_frac_observed"][name] <= 0.3, (x["round"], name, x["cold_frac_observed"])
    for name in NEW_ARMS:
        assert r["arms"][name]["evicted_pages"] > 0
    # the readers on the whole cold table: O_DIRECT adds no page, io_uring (buffered) does
    from engramprof.lab import workload

    big = [(o, s) for b in lab["batches"] for o, s in b if s >= 64]
    size = big[0][1]
    offs = np.unique(np.array([o for o, s in big if s == size], dtype=np.int64))[:256]
    pages = len({p for o in offs.tolist() for p in range(o // res.PAGE_SIZE, (o + size - 1) // res.PAGE_SIZE + 1)})
    fd = readers.open_table(lab["table"])
    try:
        for name, adds in (("direct", False), ("uring", True)):
            workload.evict(lab["table"])
            before = _cached_pages(lab["table"])
            with readers.make_reader(name, THREADS) as rd:
                rd.read_batch([readers.Job(fd, offs, size, np.empty((len(offs), size), np.uint8))])
            after = _cached_pages(lab["table"])
            assert (after - before >= pages) if adds else after == before, (name, before, after, pages)
    finally:
        os.close(fd)


def test_new_arms_that_cannot_run_here_are_one_line(lab, monkeypatch, tmp_path):
    from engramprof.lab import uring

    def refused(self, entries=uring.ENTRIES):
        raise uring.setup_error(errno.ENOSYS)

    monkeypatch.setattr(uring.Ring, "__init__", refused)
    _fresh_cache(lab["table"])
    with pytest.raises(UserError, match="arm io_uring: the uring reader cannot set up an io_uring") as e:
        rp.replay(lab["trace"], NEW_ARMS, rounds=1, threads=THREADS, max_batches=1)
    assert e.value.code == 1
    if not os.path.isdir("/dev/shm") or _fs_type(Path("/dev/shm")) != "tmpfs":
        return  # no tmpfs to try O_DIRECT's refusal on (the io_uring half ran)
    d = Path(__import__("tempfile").mkdtemp(dir="/dev/shm"))
    try:
        t = d / "t.safetensors"
        shutil.copy(lab["table"], t)
        tr = _write_trace(tmp_path / "shm-trace", t, lab["batches"][:1])
        with pytest.raises(UserError, match="arm direct: the direct reader reads with O_DIRECT.*tmpfs"):
            rp.replay(tr, ["pool", "direct"], rounds=1, threads=THREADS)
    finally:
        shutil.rmtree(d)


# --------------------------------------------------------------------------- the rounds' statistics


def test_order_statistic_interval_by_hand():
    from engramprof.lab import replay_stats as st

    # P(B <= 1) for B ~ Bin(10, 1/2) is 11/1024 <= 2.5% and P(B <= 2) = 56/1024 is not: [x(2), x(9)]
    assert st.order_rank(10) == (2, pytest.approx(1 - 2 * 11 / 1024))
    assert st.order_rank(6) == (1, pytest.approx(1 - 2 / 64))  # the fewest rounds with a 95% interval
    assert st.order_rank(5) is None and st.MIN_ROUNDS == 6
    # the CLI's --rounds default is the library's, and gives an interval
    from engramprof.commands import replay as cmd
    import inspect
    assert inspect.signature(cmd.replay).parameters["rounds"].default.default == rp.DEFAULT_ROUNDS >= st.MIN_ROUNDS
    assert st.order_rank(20)[0] == 6  # P(B <= 5) = 21700 / 2**20 = 2.07%; P(B <= 6) = 5.77%
    iv = st.median_interval([2.4, 2.1, 2.9, 2.0, 2.6, 2.2, 3.5, 2.3, 1.9, 2.5])
    assert (iv.estimate, iv.lo, iv.hi, iv.rank, iv.n) == (pytest.approx(2.35), 2.0, 2.9, 2, 10)
    assert st.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]).lo is None


def test_speedup_claim_flips_when_the_interval_holds_one():
    from engramprof.lab import replay_stats as st

    arm = [1.0] * 10
    clear = [2.4, 2.1, 2.9, 2.0, 2.6, 2.2, 3.5, 2.3, 1.9, 2.5]  # ratios 1.9 .. 3.5: interval 2.0-2.9
    iv = st.paired_speedup(clear, arm)
    assert (iv.lo, iv.hi) == (2.0, 2.9)
    claim, words = st.speedup_claim("nowait", iv)
    assert claim == "supported" and "2.35x" in words and "2.00x-2.90x" in words
    mixed = [2.4, 0.9, 2.9, 0.8, 2.6, 2.2, 3.5, 0.95, 1.9, 2.5]  # three rounds where the arm lost
    iv = st.paired_speedup(mixed, arm)
    assert (iv.lo, iv.hi) == (0.9, 2.9)
    claim, words = st.speedup_claim("nowait", iv)
    assert claim == "not supported" and "contains 1.0" in words and "cannot tell nowait from pool" in words
    # excludes 1.0 but 1.57x .. 5.52x (issue 25's two runs): the direction, not the figure
    wide = [1.57, 1.6, 2.0, 3.0, 4.0, 5.0, 5.52, 2.5, 1.5, 6.0]
    claim, words = st.speedup_claim("nowait", st.paired_speedup(wide, arm))
    assert claim == "direction only" and "faster" in words and "not supported" in words
    claim, words = st.speedup_claim("direct", st.paired_speedup([0.1, 0.12, 0.11, 0.13, 0.1, 0.12], [1.0] * 6))
    assert claim == "supported" and "0.1" in words
    claim, words = st.speedup_claim("serial", st.paired_speedup(clear[:5], arm[:5]))
    assert claim == "no interval" and "at least 6" in words


def test_pairing_takes_the_host_drift_out_of_the_ratio():
    """Rounds on a host whose speed drifts 5x: unpaired medians overlap, the paired ratio is exact."""
    from engramprof.lab import replay_stats as st

    drift = [1.0, 5.0, 2.0, 4.0, 1.5, 3.0, 2.5, 1.2]
    pool, arm = [2 * f for f in drift], drift
    a, p = st.median_interval(arm), st.median_interval(pool)
    assert a.hi > p.lo  # the arms' own intervals overlap: no claim from them
    iv = st.paired_speedup(pool, arm)
    assert (iv.estimate, iv.lo, iv.hi) == (2.0, 2.0, 2.0)
    assert st.speedup_claim("nowait", iv)[0] == "supported"
