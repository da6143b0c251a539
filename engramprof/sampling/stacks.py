"""The target's Python stacks and GIL holder, sampled with py-spy (the ``stacks`` series).

Every ``1 / hz`` seconds a background thread runs ``py-spy dump --json --nonblocking --pid P``
for each sampled process: one *round*.  ``--nonblocking``: the target is never paused (py-spy
reads its memory with process_vm_readv while it runs, so a stack can be torn; py-spy then
skips it or returns what it read).  A round gives, for every Python thread: its OS thread id,
whether it holds the GIL (py-spy compares the thread state with the interpreter's current
one), whether the OS has it runnable (``active``: state R in /proc, taken just before the
stacks), and its Python frames.

Timing: a dump is one short process (about 10-20 ms on this machine: ELF symbols, then the
reads); the stacks are read inside ``[ts_ns - window_ns, ts_ns]`` where ``ts_ns`` is
CLOCK_MONOTONIC when the dump exited and ``window_ns`` how long it ran.  The join
(engramprof/analysis/codeview.py) uses that window as the sample's time error; docs/model.md
("The code view") gives the bounds.

Cost: one process spawn and a few ms of CPU per round and process (``cpu_s`` in the summary,
from RUSAGE_CHILDREN).  A target that is not CPython, or whose frames py-spy cannot read (a
version it does not know, no permission): its first dump fails, one note says so with
py-spy's own words, and that process is not sampled again; nothing else changes.

Rows (``engramprof.trace.SAMPLE_SCHEMAS["stacks"]``) go through the trace writer about once a
second, like every sample series.  With them, ``tables/thread_kinds``: every thread of a
sampled process, ``python`` when py-spy listed it (it has an interpreter thread state) in some
round, else ``native`` (seen in /proc/PID/task at a round, never with a thread state: an
OpenMP team, a library's own pool, io-wq).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa

from engramprof.trace.schema import sample_schema, table_schema

#: rounds a second by default: a dump costs about 6 ms of CPU (quiet machine), so 5 Hz takes 3% of
#: one core; the lab pool reader's steps: p50 x1.03, p90 x1.05 at 5 Hz, x1.05 / x1.12 at 10 Hz
#: (benchmarks/RESULTS.md, "Stack sampling at 5 vs 10 Hz"; the target is at most 5% added)
DEFAULT_STACK_HZ = 5.0
#: processes dumped a round at most (a dump costs ~10 ms of CPU): a --cgroup of many processes
#: gets its lowest pids sampled, and one note says how many were left out
MAX_PROCESSES = 4
DUMP_TIMEOUT_S = 5.0
#: a dump that read the process while its threads changed (``--nonblocking`` does not pause it):
#: py-spy's reason, lowercased.  Such a failure of a process never sampled yet is tried again,
#: up to TORN_TRIES dumps in a row, before the process is taken as unreadable (CI run 14: the
#: pool reader's first dump came as its 8 threads started, and it was never sampled again)
TORN_DUMP_REASONS = ("failed to get stack traces",)
TORN_TRIES = 5
FLUSH_S = 1.0
SERIES = "stacks"


def find_py_spy() -> str | None:
    """The py-spy binary: beside this Python (the wheel installs it into the venv's bin, which
    need not be on PATH), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def frames_text(frames: list[dict]) -> str:
    """py-spy's frames (innermost first) as the ``frames`` column: one frame a line,
    ``function<TAB>filename<TAB>line``."""
    return "\n".join(f"{f.get('name', '?')}\t{f.get('filename', '')}\t{int(f.get('line') or 0)}" for f in frames)


def parse_dump(text: str) -> list[dict]:
    """The thread rows of one ``py-spy dump --json``: tid, thread_name, gil, active, frames,
    depth (a thread without an OS id is left out: it cannot be joined)."""
    rows = []
    for t in json.loads(text or "[]"):
        tid = t.get("os_thread_id")
        if tid is None:
            continue
        frames = t.get("frames") or []
        rows.append({"pid": int(t.get("pid") or 0), "tid": int(tid), "thread_name": t.get("thread_name") or "",
                     "gil": bool(t.get("owns_gil")), "active": bool(t.get("active")),
                     "frames": frames_text(frames), "depth": len(frames)})
    return rows


def dump_error(stderr: str, pid: int) -> str:
    """py-spy's own reason, in one line (its last non-empty ``Error:`` line, else the last line)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    err = [ln for ln in lines if ln.lower().startswith("error")]
    why = (err[-1] if err else (lines[-1] if lines else "no output")).removeprefix("Error:").strip()
    if why.lower().startswith("permission denied"):  # py-spy's advice is to rerun it with sudo
        why = "Permission Denied (py-spy may not read its memory)"
    return f"pid {pid}: {why}"


def stacks_table(rows: list[dict]) -> pa.Table:
    sch = sample_schema(SERIES)
    return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in sch}, schema=sch)


class StackSampler:
    """``StackSampler(pids, hz, writer, notes)``; :meth:`start`; ... :meth:`stop`; :meth:`summary`.

    ``pids``: a callable giving the processes to sample now (the recording's traced ones).
    Rows go to ``writer.append_samples("stacks", table)`` (None: kept in :attr:`rows`, tests)."""

    def __init__(self, pids: Callable[[], Iterable[int]], hz: float = DEFAULT_STACK_HZ, writer=None,
                 notes: list[str] | None = None, binary: str | None = None):
        self.pids = pids
        self.hz = float(hz)
        self.writer = writer
        self.notes = notes if notes is not None else []
        self.binary = binary or find_py_spy()
        self.rows: list[dict] = []
        self._pending: list[dict] = []
        self._refused: dict[int, str] = {}  # pid -> why py-spy cannot read it
        self._torn: dict[int, int] = {}  # pid never sampled -> its torn dumps so far
        self._sampled: set[int] = set()
        self._capped = False
        self._python: set[tuple[int, int]] = set()  # (pid, tid) py-spy listed
        self._tasks: set[tuple[int, int]] = set()  # (pid, tid) in /proc/PID/task at a sampled round
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.dumps = 0
        self.failed_dumps = 0
        self._cpu0 = 0.0
        self.cpu_s = 0.0
        self.wall_ns = 0

    # ---- one round ---------------------------------------------------------------------
    def dump(self, pid: int) -> tuple[int, int, list[dict] | None, str]:
        """(end ns, window ns, rows or None, error) of one ``py-spy dump`` of ``pid``."""
        t0 = time.monotonic_ns()
        try:
            r = subprocess.run([self.binary, "dump", "--json", "--nonblocking", "--pid", str(pid)],
                               capture_output=True, text=True, timeout=DUMP_TIMEOUT_S,
                               preexec_fn=_set_priority if DUMP_NICE else None)
        except subprocess.TimeoutExpired:
            t1 = time.monotonic_ns()
            return t1, t1 - t0, None, f"pid {pid}: py-spy dump took over {DUMP_TIMEOUT_S:g} s"
        t1 = time.monotonic_ns()
        if r.returncode != 0:
            return t1, t1 - t0, None, dump_error(r.stderr, pid)
        try:
            return t1, t1 - t0, parse_dump(r.stdout), ""
        except (ValueError, TypeError) as exc:
            return t1, t1 - t0, None, f"pid {pid}: unreadable py-spy output ({exc})"

    def sample_round(self) -> None:
        """One dump of every process to sample; a process whose first dump fails is noted once
        and not sampled again (a later failure of one already sampled is counted: it exited,
        or a stack was torn).  A torn first dump (TORN_DUMP_REASONS) is tried again, up to
        TORN_TRIES in a row."""
        self.rounds += 1
        pids = [p for p in sorted(set(self.pids())) if p > 0 and p not in self._refused]
        if len(pids) > MAX_PROCESSES and not self._capped:
            self._capped = True
            self.notes.append(f"Python stacks: {len(pids)} processes traced, the stacks of the first {MAX_PROCESSES} "
                              "(lowest pids) sampled; a dump costs ~10 ms of CPU each")
        for pid in pids[:MAX_PROCESSES]:
            tasks = _tasks(pid)  # before the dump: a thread listed here and alive at it, unlisted by py-spy, is native
            end, window, rows, err = self.dump(pid)
            self.dumps += 1
            self.wall_ns += window
            if rows is None:
                self.failed_dumps += 1
                if pid not in self._sampled:
                    torn = self._torn.get(pid, 0) + 1
                    if any(r in err.lower() for r in TORN_DUMP_REASONS) and torn < TORN_TRIES:
                        self._torn[pid] = torn
                        continue
                    self._refused[pid] = err
                    self.notes.append(f"Python stacks not sampled: {err} (not a CPython process, or its "
                                      "frames cannot be read); the rest of the recording is unchanged")
                continue
            self._sampled.add(pid)
            for row in rows:
                row.update(ts_ns=end, window_ns=window, round=self.rounds)
            self._pending.extend(rows)
            self._python.update((pid, r["tid"]) for r in rows)
            self._tasks.update((pid, t) for t in tasks)

    def thread_kinds(self) -> pa.Table:
        """``tables/thread_kinds``: python for every thread py-spy listed, native for the other
        threads of the sampled processes."""
        rows = sorted(self._python | self._tasks)
        return pa.table({"pid": [p for p, _ in rows], "tid": [t for _, t in rows],
                         "kind": ["python" if k in self._python else "native" for k in rows],
                         "source": ["py-spy: a Python thread state" if k in self._python else
                                    "py-spy: in /proc/PID/task, never with a Python thread state" for k in rows]},
                        schema=table_schema("thread_kinds"))

    def flush(self) -> None:
        rows, self._pending = self._pending, []
        if not rows:
            return
        if self.writer is None:
            self.rows.extend(rows)
            return
        try:
            self.writer.append_samples(SERIES, stacks_table(rows))
            self.writer.write_table("thread_kinds", self.thread_kinds())  # replaced each flush
        except OSError as exc:  # the recorder sees the failed writer and stops
            self.notes.append(f"stacks not written: {exc}")

    # ---- the thread --------------------------------------------------------------------
    def start(self) -> None:
        self._cpu0 = _children_cpu()
        self._thread = threading.Thread(target=self._loop, name="engramprof-stacks", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        interval = 1.0 / self.hz
        next_t = last_flush = time.monotonic()
        while not self._stop.is_set():
            self.sample_round()
            now = time.monotonic()
            if now - last_flush >= FLUSH_S:
                self.flush()
                last_flush = now
            next_t = max(next_t + interval, now)  # late: the next round now, never a burst
            self._stop.wait(max(0.0, next_t - now))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=DUMP_TIMEOUT_S + 1)
            self._thread = None
        self.cpu_s = _children_cpu() - self._cpu0
        self.flush()

    def summary(self) -> dict:
        return {"hz": self.hz, "rounds": self.rounds, "dumps": self.dumps, "failed_dumps": self.failed_dumps,
                "processes": sorted(self._sampled), "not_sampled": dict(sorted(self._refused.items())),
                # the sampler's own cost: py-spy's CPU (children of this process; the other
                # children of a recorder are none) and its mean wall time per dump
                "cpu_s": round(self.cpu_s, 3),
                "dump_ms": round(self.wall_ns / self.dumps / 1e6, 2) if self.dumps else None}


#: py-spy's nice value (0: the recorder's own).  Raised to -10 it took CPU from the target on
#: a loaded 2-core machine (3 of 4 runs lost 10-42% of the lab pool reader's steps) without
#: narrowing the window; benchmarks/stacks_overhead.py --nice compares
DUMP_NICE = 0


def _set_priority() -> None:
    if not DUMP_NICE:
        return
    try:
        os.nice(DUMP_NICE)
    except OSError:  # not root: the default priority
        pass


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
