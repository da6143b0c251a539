"""Helpers for the real eBPF tests: run a lab reader under `engramprof syscalls`.

The lab waits (--start-delay) until SIGUSR1, so the tracer is attached before the first step
and the trace can be compared call for call with the lab's own count.
"""
from __future__ import annotations

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
    out = tmp / name
    tracer = Proc(engramprof("syscalls", "--pid", lab.pid, "--output", out, "--json", *tracer_args))
    tracer.wait_line("Tracing")
    os.kill(lab.pid, signal.SIGUSR1)
    rc, lab_out, lab_err = lab.finish()
    assert rc == 0, lab_err
    trc, tout, terr = tracer.finish()
    summary = json.loads(tout) if trc == 0 and tout.strip() else None
    return TracedRun(lab=json.loads(lab_out), trace=out, summary=summary, tracer_rc=trc, tracer_err=terr)
