"""Helpers for the real eBPF tests: run a lab reader under `engramprof syscalls`.

The lab waits (--start-delay) until SIGUSR1, so the tracer is attached before the first step
and the trace can be compared call for call with the lab's own count.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

PY = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python")
if not os.path.exists(PY):
    PY = sys.executable


class Proc:
    """A subprocess whose stderr lines are collected by a thread (so waits can look for a line)."""

    def __init__(self, argv: list[str], **kw):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self):
        for line in self.p.stderr:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_line(self, prefix: str, timeout: float = 90) -> str:
        with self._cv:
            ok = self._cv.wait_for(lambda: any(l.startswith(prefix) for l in self.lines) or self.p.poll() is not None,
                                   timeout=timeout)
            for l in self.lines:
                if l.startswith(prefix):
                    return l
        raise AssertionError(f"no line starting {prefix!r} (ok={ok}, rc={self.p.poll()}): {''.join(self.lines)[-2000:]}")

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        """Wait for the exit; (returncode, the rest of stdout, all of stderr).  Not communicate():
        it would read stderr too, racing the pump for the last lines (a lost error line)."""
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(self.p.stdout.read()), daemon=True)
        reader.start()
        self.p.wait(timeout=timeout)
        reader.join(30)
        self._t.join(30)
        return self.p.returncode, "".join(out), "".join(self.lines)

    @property
    def pid(self) -> int:
        return self.p.pid


def settle_writeback() -> None:
    """Write back every dirty page before a measured run starts (``sync``): the suite's own
    earlier writes (a venv, a wheel, the tables just made) would otherwise go to the device
    when they expire, 30 s later, in the middle of a cold reader's run.  Reads queued behind
    that writeback are served in ms, and the trace rightly calls them storage (a clean-clone
    CI run: storage 49% for a cold reader on a device otherwise serving in 25 µs)."""
    os.sync()


def device_slow_bios(calls) -> int:
    """How many of ``calls``' read events had a bio slower than the device baseline's latency
    ceiling (1 ms a bio: never normal service, engramprof/analysis/baseline.py).  A cold
    reader's verdict is residency on a device at its normal speed; when the kernel shows the
    device was not, storage is the verdict the trace supports, and a test says which it saw."""
    import numpy as np

    from engramprof.analysis.baseline import LATENCY_CEILING_NS
    n = calls["bio_count"].to_numpy(dtype=float, na_value=0.0)
    t = calls["bio_ns"].to_numpy(dtype=float, na_value=0.0)
    per = np.divide(t, n, out=np.zeros_like(t), where=n > 0)
    return int((per > LATENCY_CEILING_NS).sum())


def cold_verdict_ok(verdict: str, calls) -> bool:
    """A cold reader's verdict: residency; storage only where the reader's own bios show the
    device slower than normal service (:func:`device_slow_bios`)."""
    return verdict == "residency" or (verdict == "storage" and device_slow_bios(calls) > 0)


def kernel_direct_reclaims(calls, vmstat) -> int:
    """The kernel's own count of reclaim done by allocating tasks over ``calls``' window (its
    first entry to its last exit, to the 10 Hz sample after it): vmstat's ``allocstall``
    (direct reclaim entered) plus ``pgscan_memcg`` (pages scanned because a memory cgroup hit
    its limit).  0 without samples."""
    import numpy as np

    from engramprof.analysis.baseline import sample_rows_over

    if vmstat is None or len(vmstat) == 0 or len(calls) == 0:
        return 0
    ts = calls["ts_ns"].to_numpy(np.int64)
    window = sample_rows_over(vmstat, (int(ts.min()), int((ts + calls["dur_ns"].to_numpy(np.int64)).max())))
    cols = [c for c in ("allocstall", "pgscan_memcg") if c in window]
    return int(window[cols].fillna(0).to_numpy().sum()) if cols else 0


def warm_verdict_ok(verdict: str, calls, vmstat) -> bool:
    """A warm reader's verdict: healthy; reclaim only where its calls spent time in reclaim and
    the kernel counted reclaim by allocating tasks over its reads (:func:`kernel_direct_reclaims`):
    a host short of free memory, where the pages a read() copies into are allocated inside the
    call, and the verdict is then the trace's truth (a suite run saw a warm read() reader at 27%
    reclaim; a host short of memory is the cause taken, not proved)."""
    reclaimed = calls["reclaim_ns"].fillna(0).to_numpy().sum() > 0
    return verdict == "healthy" or (verdict == "reclaim" and reclaimed and kernel_direct_reclaims(calls, vmstat) > 0)


def engramprof(*args: str) -> list[str]:
    return [PY, "-m", "engramprof", *map(str, args)]


@dataclass
class TracedRun:
    lab: dict
    trace: Path
    summary: dict | None
    tracer_rc: int
    tracer_err: str


def traced_lab(tmp: Path, table: Path, *lab_args: str, tracer_args: tuple[str, ...] = (), name: str = "trace") -> TracedRun:
    lab = Proc(engramprof("lab", "run", "--table", table, "--json", "--start-delay", "120", *lab_args))
    lab.wait_line("lab: ready")
    settle_writeback()  # before the recording: its window holds the reads, not this writeback
    out = tmp / name
    tracer = Proc(engramprof("syscalls", "--pid", lab.pid, "--output", out, "--json", *tracer_args))
    tracer.wait_line("Tracing")
    os.kill(lab.pid, signal.SIGUSR1)
    rc, lab_out, lab_err = lab.finish()
    assert rc == 0, lab_err
    trc, tout, terr = tracer.finish()
    summary = json.loads(tout) if trc == 0 and tout.strip() else None
    return TracedRun(lab=json.loads(lab_out), trace=out, summary=summary, tracer_rc=trc, tracer_err=terr)


@dataclass
class LabSpec:
    """One lab reader of a shared recording: its ``lab run`` arguments, and a context manager to
    hold around its run (an evictor), or None."""

    name: str
    args: tuple[str, ...]
    around: object = None


def traced_labs(tmp: Path, specs: list[LabSpec], name: str = "trace") -> tuple[dict[str, dict], TracedRun]:
    """Several lab readers in one recording (one probe compile: most of a traced run's time on a
    loaded machine): all start and wait, one tracer attaches to every pid, then each reader runs
    alone in turn (no reader competes with another for the CPUs or the device).  Returns each
    reader's summary (with its ``pid``) and the recording."""
    labs = {}
    for s in specs:
        labs[s.name] = Proc(engramprof("lab", "run", "--json", "--start-delay", "120", *s.args))
    for p in labs.values():
        p.wait_line("lab: ready")
    settle_writeback()  # before the recording: its window holds the reads, not this writeback
    out = tmp / name
    pids = [a for p in labs.values() for a in ("--pid", str(p.pid))]
    tracer = Proc(engramprof("syscalls", *pids, "--output", out, "--json"))
    tracer.wait_line("Tracing")
    results = {}
    for s in specs:
        p = labs[s.name]
        ctx = s.around if s.around is not None else contextlib.nullcontext()
        with ctx:
            os.kill(p.pid, signal.SIGUSR1)
            rc, lab_out, lab_err = p.finish()
        assert rc == 0, lab_err
        results[s.name] = {**json.loads(lab_out), "pid": p.pid}
    trc, tout, terr = tracer.finish()
    summary = json.loads(tout) if trc == 0 and tout.strip() else None
    return results, TracedRun(lab={}, trace=out, summary=summary, tracer_rc=trc, tracer_err=terr)


@dataclass
class MarkedReads:
    """A lab recording's row reads against its own markers, as batch-tail would infer them:
    the syscall read events (the recorder's page faults on the lab's own code left out), the
    marked batches, and the trace's off-CPU spans (None when it has none)."""

    ts: object  # np.ndarray int64, call entries
    end: object  # np.ndarray int64, exits
    marked: object  # engramprof.analysis.batches.Batches
    markers_bad_lines: int
    offcpu: object  # pandas.DataFrame | None


def marked_reads(trace: Path, markers: Path) -> MarkedReads:
    import numpy as np

    from engramprof.analysis import batches
    from engramprof.trace import load_bundle

    bundle = load_bundle(trace)
    calls = bundle.calls[bundle.calls["kind"] == "syscall"].reset_index(drop=True)
    ts = calls["ts_ns"].to_numpy(np.int64)
    end = ts + calls["dur_ns"].to_numpy(np.int64)
    mk, bad = batches.read_markers(markers)
    return MarkedReads(ts=ts, end=end, marked=batches.from_markers(ts, end, mk), markers_bad_lines=bad,
                       offcpu=bundle.samples("offcpu"))
