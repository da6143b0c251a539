"""The exporter probe's block-I/O and sched evidence (probes/export.bpf.c): real eBPF.

The exporter keeps its syscall reads' bios in the in-flight bio table of probes/bios.h (as the
syscall and fault probes do) and completes them at block_rq_complete (request-based devices)
and block_bio_complete (bio-based ones: zram, device-mapper, md), so:

* cold preadv calls on a private zram device get their bios' queue -> complete time in the
  exporter's bio seconds and per-file bio_ns, and every slot ends free (fails on the exporter
  probe before the table: no block_bio_complete hook, its LRU hash kept every zram bio and the
  bio seconds stayed 0).  The root disk is not used for this check: it is shared, and with
  another process's I/O on it some of a target's bios are not matched at block_rq_complete
  (the syscall probe's test in tests/test_fault_bios.py fails the same way then);
* with one slot, bios queued while another is in flight are counted in bios_untracked;
* sched_switch (next) and sched_wakeup test a bit of call_out_bits first: a thread blocked
  inside a read has its bit and entry, both gone after the return, and its sleep is credited
  (fails on the probe before the bitmap: no call_out_bits).

The zram device, the cold-run driver and the readers are tests/test_fault_bios.py's, the
blocked-reader helpers tests/test_syscall_sched_bits.py's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.test_fault_bios import BIG_READ, PAGE, PAGES, PREADER, _cold_run, _slots_left, zram_filesystem
from tests.kernel_skips import completions_skipped
from tests.test_syscall_sched_bits import PIPE_READER, SYS_PREADV2, _bits_set, _blocked_in, _offcpu_entries

pytestmark = pytest.mark.bpf


class KeptExportProbe:
    """Loads the exporter probe for one pid (sample budget unlimited) and keeps what the tests
    read of its maps when it is closed (tests/test_fault_bios.py's _cold_run closes it)."""

    def __init__(self, pid: int, **config):
        from engramprof.export import probe as ep
        from engramprof.target.selection import Selection

        self.probe = ep.ExportProbe(ep.plan(ep.ExportProbeConfig(selection=Selection.parse(pids=[pid]), **config)))
        self.probe.set_sample_budget(1 << 40)
        self.plan, self.bpf, self.ring = self.probe.plan, self.probe.bpf, self.probe.ring
        self.kept = None

    def totals(self):
        return self.probe.totals()

    def skipped_runs(self):
        return self.probe.skipped_runs()

    def close(self):
        p = self.probe
        if p.bpf is not None:
            self.kept = {"bio_seconds": p.bio_seconds(), "bio_histogram": p.bio_histogram(),
                         "stats": p.read_stats(), "totals": p.totals(), "slots": _slots_left(p),
                         "taken": _taken_slots(p)}
        p.close()


def _taken_slots(probe) -> list[tuple[int, int, int, int]]:
    """(dev, sector, queued ns, tid) of every slot of the bio table still taken (none: a probe
    without the table)."""
    try:
        slots = probe.bpf["bio_slots"]
    except KeyError:
        return []
    return [(v.dev, v.sector, v.ts, v.tid) for v in slots.values() if v.tag]


def _exporter(**config):
    loaded = []

    def load(pid):
        loaded.append(KeptExportProbe(pid, **config))
        return loaded[-1]
    return load, loaded


@pytest.fixture
def zram_dir():
    """An ext4 filesystem on a zram device of this test's own, removed afterwards."""
    with zram_filesystem() as mp:
        yield mp


def test_cold_preadv_reads_on_zram_get_the_exporters_bio_seconds_and_free_their_slots(zram_dir):
    load, loaded = _exporter()
    recs, answer, taken, left, totals, skipped = _cold_run(zram_dir, PREADER, load)
    kept = loaded[0].kept
    assert int(answer) == PAGES * PAGE
    # one page, one bio a call (POSIX_FADV_RANDOM): each call's bio completed inside it
    with_bio = recs[recs["bio_count"] > 0]
    assert len(with_bio) >= 0.9 * PAGES, (len(recs), len(with_bio))
    assert (with_bio["bio_ns"] > 0).mean() >= 0.9, with_bio["bio_ns"]
    assert kept["bio_seconds"] > 0
    assert kept["bio_histogram"].sum() >= 0.9 * PAGES, kept["bio_histogram"].sum()
    rows = [r for (dev, ino, kind), r in kept["stats"].items() if kind == "syscall" and ino]
    assert len(rows) == 1, kept["stats"].keys()
    assert rows[0]["bio_count"] >= 0.9 * PAGES and rows[0]["bio_ns"] > 0, rows[0]
    assert rows[0]["bio_ns"] * 1e-9 <= kept["bio_seconds"] + 1e-9
    # every bio completed and left the table; one in flight at a time: none untracked
    assert taken == left <= completions_skipped(skipped), (kept["taken"], skipped)
    assert totals["bios_untracked"] == 0 or completions_skipped(skipped), (totals["bios_untracked"], skipped)


def test_bios_whose_slot_another_bio_holds_are_counted_untracked_by_the_exporter(tmp_path):
    """One slot, a 16 MiB cold read on the root disk (a readahead window's bios queued before
    the first completes, in most runs: up to 3 runs, as in tests/test_fault_bios.py)."""
    untracked = []
    for attempt in range(3):
        run_dir = tmp_path / str(attempt)
        run_dir.mkdir()
        load, loaded = _exporter(bio_slots=1)
        recs, answer, taken, left, totals, skipped = _cold_run(run_dir, BIG_READ, load, pages=256)
        assert answer.isdigit()
        queued = int(recs["bio_count"].sum())
        assert totals["bios_untracked"] < queued, (queued, totals)  # the slot's own bio was tracked
        assert loaded[0].kept["bio_seconds"] > 0
        assert taken == left <= completions_skipped(skipped), (taken, left, skipped)
        untracked.append(totals["bios_untracked"])
        if untracked[-1]:
            break
    assert untracked[-1] >= 1, untracked


def test_a_thread_blocked_in_a_read_has_its_exporter_bit_and_the_return_clears_it():
    if os.uname().machine != "x86_64":
        pytest.skip("the blocked-in-syscall check reads x86_64's preadv2 number")
    go_r, go_w = os.pipe()
    w = subprocess.Popen([sys.executable, "-c", PIPE_READER, str(go_r)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, pass_fds=(go_r,))
    os.close(go_r)
    loaded = None
    try:
        assert w.stdout.readline().strip() == "ready"
        loaded = KeptExportProbe(w.pid)
        if not loaded.plan.features.get("HAVE_SCHED"):
            pytest.skip("this kernel lacks sched_switch / sched_wakeup: no off-CPU evidence to check")
        probe = loaded.probe
        assert _bits_set(probe) == {} and _offcpu_entries(probe) == {}
        os.write(go_w, b"g")
        assert _blocked_in(w.pid, SYS_PREADV2), "the reader never blocked in preadv2"
        assert _bits_set(probe) == {w.pid >> 6: 1 << (w.pid & 63)}
        entries = _offcpu_entries(probe)
        assert list(entries) == [w.pid] and entries[w.pid][0] > 0, entries
        time.sleep(0.3)
        w.stdin.write("x" * 10)
        w.stdin.flush()
        assert w.stdout.readline().strip() == "10"
        bits_after, entries_after = _bits_set(probe), _offcpu_entries(probe)
        stats = probe.read_stats()
    finally:
        os.write(go_w, b"e")
        os.close(go_w)
        if w.poll() is None:
            w.stdin.close()
            w.wait(timeout=30)
        if loaded is not None:
            loaded.close()
    rows = [r for (_dev, _ino, kind), r in stats.items() if kind == "syscall"]
    assert len(rows) == 1 and rows[0]["reads"] == 1, stats
    # the whole sleep is credited, not as run-queue wait (woken on an idle CPU)
    assert 300_000_000 <= rows[0]["offcpu_ns"] <= rows[0]["sum_ns"], rows[0]
    assert rows[0]["runq_ns"] < rows[0]["offcpu_ns"] // 10, rows[0]
    assert (bits_after, entries_after) == ({}, {})
