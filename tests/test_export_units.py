"""engramprof.export's pure parts, without BPF: the markers tail, the window's marker
selection, the log2 -> Prometheus bucket mapping, the file names, the systemd unit."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from engramprof.export.files import UNKNOWN, FileNames
from engramprof.export.metrics import FIRST_BUCKET_LOG2, LAST_BUCKET_LOG2, log2_histogram
from engramprof.export.window import MarkerTail, WindowAnalyser
from engramprof.host.files import kernel_dev
from engramprof.target.selection import Selection


def _line(s, e, **kw):
    return json.dumps({"start_ns": s, "end_ns": e, **kw}) + "\n"


def test_marker_tail_reads_only_new_whole_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    t = MarkerTail(str(p))
    assert t.new_batches() == []  # not there yet: waited for
    p.write_text(_line(1, 2) + _line(3, 4) + '{"start_ns": 5, "end')
    assert t.new_batches() == [(1, 2), (3, 4)]
    with open(p, "a") as f:
        f.write('_ns": 6}\n' + "not json\n" + _line(9, 8))
    assert t.new_batches() == [(5, 6)]  # the partial line, completed; end < start is bad
    assert t.bad_lines == 2
    assert t.new_batches() == []


def test_marker_tail_rereads_a_replaced_file(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(_line(1, 2) + _line(3, 4))
    t = MarkerTail(str(p))
    assert len(t.new_batches()) == 2
    tmp = tmp_path / "new"
    tmp.write_text(_line(10, 20))
    os.replace(tmp, p)  # a new inode (a rotated file)
    assert t.new_batches() == [(10, 20)]


def test_window_takes_the_marked_batches_inside_it(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(_line(50, 90) + _line(100, 150) + _line(190, 210) + _line(250, 260))
    w = WindowAnalyser(str(p))
    got = w._markers_for(100, 200)
    assert list(map(tuple, got[["start_ns", "end_ns"]].to_numpy())) == [(100, 150)]
    # the one ending after the window waits; it began in this window, so the next one drops it
    got = w._markers_for(200, 300)
    assert list(map(tuple, got[["start_ns", "end_ns"]].to_numpy())) == [(250, 260)]


def test_log2_slots_become_cumulative_buckets_in_seconds():
    counts = np.zeros(40, dtype=np.int64)
    counts[3] = 2      # 8-15 ns: under the first bound
    counts[FIRST_BUCKET_LOG2 - 1] = 5   # 512-1023 ns: le 1.024 µs
    counts[FIRST_BUCKET_LOG2] = 7       # 1024-2047 ns: le 2.048 µs
    counts[39] = 1     # beyond the last bound: only +Inf
    buckets, total = log2_histogram(counts, 1.5)
    le = [float(b[0]) for b in buckets[:-1]]
    assert math.isclose(le[0], (1 << FIRST_BUCKET_LOG2) / 1e9, rel_tol=1e-12)
    assert math.isclose(le[-1], (1 << LAST_BUCKET_LOG2) / 1e9, rel_tol=1e-12)
    assert le == sorted(le)
    assert buckets[0][1] == 7 and buckets[1][1] == 14
    assert buckets[-2][1] == 14 and buckets[-1] == ("+Inf", 15)
    assert total == 1.5


def test_file_names_from_open_fds_and_fallbacks(tmp_path):
    f = tmp_path / "t.bin"
    f.write_bytes(b"x" * 4096)
    fd = os.open(f, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        names = FileNames(Selection(pids=[os.getpid()]), lambda: {os.getpid()})
        assert names.name(kernel_dev(st.st_dev), st.st_ino) == str(f)
    finally:
        os.close(fd)
    assert names.name(5, 0) == UNKNOWN
    assert names.name((259 << 20) | 3, 99999999) == "dev:259:3:ino:99999999"


def test_systemd_unit_verifies_and_keeps_its_privileges_small(tmp_path):
    import shutil
    import subprocess

    import pytest

    unit = (Path(__file__).resolve().parent.parent / "deploy" / "engramprof-export.service").read_text()
    caps = {ln.split("=", 1)[0]: set(ln.split("=", 1)[1].split()) for ln in unit.splitlines()
            if ln.startswith(("CapabilityBoundingSet=", "AmbientCapabilities="))}
    allowed = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_RESOURCE", "CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"}
    assert caps and all(v <= allowed for v in caps.values()), caps
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ReadOnlyPaths=/"):
        assert line in unit.splitlines(), line
    assert "--listen 127.0.0.1:" in unit
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the unit's syntax is not checked here")
    copy = tmp_path / "engramprof-export.service"  # the venv path does not exist here
    copy.write_text("\n".join("ExecStart=/bin/true" if ln.startswith("ExecStart=") else ln
                              for ln in unit.splitlines()) + "\n")
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


class _TotalsOnly:
    """What ExporterCollector asks of the exporter's state, with the probe's totals given."""

    fault_latency = False

    def __init__(self, totals, skipped=None):
        from engramprof.export.window import WindowTotals

        self.totals = totals
        self.skipped = skipped
        self.windows = WindowTotals()

    def snapshot(self):
        return {"at": 1.0, "stats": {}, "totals": self.totals, "bio": np.zeros(40, dtype=np.int64),
                "bio_seconds": 0.0, "skipped": self.skipped}

    def live_targets(self):
        return None

    def window_totals(self):
        return self.windows

    def vmstat(self):
        return {}


def test_the_probes_untracked_bios_are_a_counter_with_their_meaning():
    """export_totals.bios_untracked (probes/bios.h: a bio whose table slot another bio held)
    is exported as engramprof_bios_untracked_total, its HELP saying its time is not counted."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from engramprof.export.metrics import ExporterCollector

    tot = {"syscall_reads": 10, "faults": 0, "sampled": 10, "unsampled": 0, "sample_lost": 0,
           "files_overflow": 0, "bios_untracked": 7}
    reg = CollectorRegistry()
    reg.register(ExporterCollector(_TotalsOnly(tot), {"rank": "2"}))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    fam = fams["engramprof_bios_untracked"]
    assert fam.type == "counter"
    assert "queue -> complete time is not counted" in fam.documentation
    assert [(s.name, s.labels, s.value) for s in fam.samples if s.name.endswith("_total")] == \
        [("engramprof_bios_untracked_total", {"rank": "2"}, 7)]
    # the other totals keep their names and values
    assert [s.value for s in fams["engramprof_probe_reads"].samples if s.name.endswith("_total")] == [10, 0]


@pytest.mark.parametrize("skipped, samples", [
    ({"block:block_rq_complete": 3, "sched:sched_wakeup": 1},
     [({"rank": "2", "hook": "block:block_rq_complete"}, 3), ({"rank": "2", "hook": "sched:sched_wakeup"}, 1)]),
    ({}, []),  # counted, none skipped: the family with no samples
    (None, None),  # not counted on this kernel: no family
])
def test_the_runs_the_kernel_skipped_are_a_counter_per_hook(skipped, samples):
    """engramprof/bpf/progstats.py's count, per hook, as engramprof_probe_skipped_runs_total."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from engramprof.export.metrics import ExporterCollector

    tot = {"syscall_reads": 10, "faults": 0, "sampled": 10, "unsampled": 0, "sample_lost": 0,
           "files_overflow": 0, "bios_untracked": 0}
    reg = CollectorRegistry()
    reg.register(ExporterCollector(_TotalsOnly(tot, skipped), {"rank": "2"}))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    if samples is None:
        assert "engramprof_probe_skipped_runs" not in fams
        return
    fam = fams["engramprof_probe_skipped_runs"]
    assert fam.type == "counter" and "another BPF program was running" in fam.documentation
    assert [(s.labels, s.value) for s in fam.samples if s.name.endswith("_total")] == samples


def test_a_window_of_a_process_that_is_not_cpython_has_no_python_scheduling(tmp_path):
    """The exporter's windows have no thread samples: a thread was taken for Python unless the
    markers listed the interpreter's threads.  Each window's processes are now judged by their
    executable mappings (once a pid): the gaps of a native program's reader are its own (a
    native pool's wait: cpu-copy), the same gaps in a CPython process are python-scheduling."""
    import subprocess

    from engramprof.bpf import structs as layout

    ms = 1_000_000
    p = tmp_path / "m.jsonl"
    p.write_text(_line(0, 10 * ms))
    native = subprocess.Popen(["sleep", "30"])
    try:
        shares = {}
        for name, pid in (("native", native.pid), ("python", os.getpid())):
            recs = np.zeros(2, dtype=layout.struct_dtype("call_record"))
            recs["ts_ns"], recs["dur_ns"] = [1 * ms, 6 * ms], [1 * ms, 1 * ms]
            # two pool threads: the 4 ms between their reads is a hand-off between threads
            recs["pid"], recs["tid"], recs["size"], recs["ret"] = pid, [pid + 1, pid + 2], 4096, 4096
            w = WindowAnalyser(str(p))
            w._markers_for(0, 0)  # nothing yet: the marker file is read from its start at the run
            w.pending_markers = [(0, 10 * ms)]
            w.run(recs, 0, 20 * ms, False)
            assert w.totals.analyses["ok"] == 1, (w.totals.analyses, w.last_error)
            shares[name] = dict(w.totals.cause_seconds)
            assert w.cpython_of[pid][0] is (name == "python"), w.cpython_of
    finally:
        native.kill()
        native.wait()
    assert shares["native"]["python-scheduling"] == 0.0 and shares["native"]["cpu-copy"] > 0.005, shares
    assert shares["python"]["python-scheduling"] > 0.005, shares
