"""The lab reader as a scenario's child process: its command line, its start through an exec
wrapper (it joins the fault's cgroups before any code of its own runs), the relay of its
stderr, its JSON summary, its stop; and the scenario's signal handling around it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable

from engramprof.lab.catalog import IMPAIRMENTS

STOP_TIMEOUT = 15.0
KEEP_RUNNING_S = 10 * 365 * 86400.0  # "until stopped"
_PKG_ROOT = str(Path(__file__).resolve().parents[2])

_WRAPPER = r"""
import ctypes, os, sys
ppid, sig, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
procs, cmd = sys.argv[4:4 + n], sys.argv[4 + n:]
if sig:
    ctypes.CDLL(None).prctl(1, sig, 0, 0, 0)
    if os.getppid() != ppid:
        os._exit(1)
for p in procs:
    with open(p, "w") as f:
        f.write(str(os.getpid()))
os.execv(cmd[0], cmd)
"""



class ReaderProcess:
    """The lab reader child: started through :data:`_WRAPPER` (so it joins the fault's cgroups
    before any code of its own runs), its stderr relayed line by line, its stdout kept for
    the JSON summary.  ``on_pid`` runs (in the relay thread) when it prints ``lab: pid``;
    ``ready`` is set on ``lab: ready``, after which the relay waits for ``armed``."""

    def __init__(self, relay: Callable[[str], None], on_pid: Callable[[], None], armed: threading.Event):
        self._relay, self._on_pid, self._armed = relay, on_pid, armed
        self.ready = threading.Event()
        self.proc: subprocess.Popen | None = None
        self._stdout: list[str] = []
        self._threads: list[threading.Thread] = []

    def start(self, cmd: list[str]) -> int:
        env = dict(os.environ)
        env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, close_fds=True)
        for target, name in ((self._read_stderr, "stderr"), (self._read_stdout, "stdout")):
            t = threading.Thread(target=target, name=f"engramprof-scenario-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self.proc.pid

    def _read_stderr(self) -> None:
        for raw in self.proc.stderr:
            line = raw.rstrip("\n")
            if line.startswith("lab: pid "):
                self._on_pid()
            if line.strip() == "lab: ready":
                self._relay(line)  # before ready: the scenario's own "ready" line comes after it
                self.ready.set()
                self._armed.wait(30)
                continue
            self._relay(line)

    def _read_stdout(self) -> None:
        for raw in self.proc.stdout:
            self._stdout.append(raw)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def join_relays(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)

    def summary(self) -> dict | None:
        """The reader's JSON summary: its last stdout line that starts with ``{``."""
        for line in reversed(self._stdout):
            if line.strip().startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    return None
        return None

    def terminate_and_reap(self) -> None:
        """SIGTERM (finish the batch and exit), SIGKILL after STOP_TIMEOUT."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close_pipes(self) -> None:
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f and f.close()
            except OSError:
                pass


def reader_command(sc, procs: list[str], pdeath: int) -> list[str]:
    """The command line that starts ``sc``'s (a Scenario's) reader: :data:`_WRAPPER` joins
    ``procs`` (cgroup.procs files), sets the parent-death signal ``pdeath`` and execs
    ``engramprof lab run`` with the scenario's options."""
    cmd = [sc.python, "-m", "engramprof", "lab", "run", "--table", sc.table_path,
           "--reader", sc.reader, "--json", "--markers", sc.markers_path,
           "--tokens", str(sc.tokens), "--gap-ms", f"{sc.gap_ms:g}", "--seed", str(sc.seed),
           "--threads", str(sc.threads), "--start-delay", f"{sc.start_delay:g}",
           "--warm" if sc.spec.cache == "warm" else "--cold"]
    if sc.steps is not None:
        cmd += ["--steps", str(sc.steps)]
    else:
        cmd += ["--duration", f"{sc.duration if sc.duration is not None else KEEP_RUNNING_S:g}"]
    if sc.workers:
        cmd += ["--workers", str(sc.workers)]
    if sc.faulty_rank is not None:
        healthy = IMPAIRMENTS["healthy"]().spec
        for r in range(sc.workers):
            if r != sc.faulty_rank:
                cmd += ["--rank-table", f"{r}:{sc.healthy_table}", "--rank-reader", f"{r}:{healthy.reader}",
                        "--rank-cache", f"{r}:{healthy.cache}"]
        for p in sc.rank_join:
            cmd += ["--rank-join", f"{sc.faulty_rank}:{p}"]
    return [sc.python, "-c", _WRAPPER, str(os.getpid()), str(pdeath), str(len(procs)),
            *procs, *cmd]


def exit_on_term() -> dict:
    """In the main thread, SIGTERM and SIGHUP (where still default) raise SystemExit, so that
    the scenario's clean-up runs; returns the handlers replaced (for :func:`restore_signals`)."""
    old: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return old

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                old[sig] = signal.signal(sig, on_term)
        except (ValueError, OSError):
            pass
    return old


def ignore_stop_signals() -> dict:
    """In the main thread, ignore SIGINT, SIGTERM and SIGHUP (a clean-up must finish);
    returns the handlers replaced."""
    masked: dict = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                masked[sig] = signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):
                pass
    return masked


def restore_signals(masked: dict, old: dict) -> None:
    for sig, h in masked.items():
        signal.signal(sig, h)
    for sig, h in old.items():
        try:
            signal.signal(sig, h)
        except (ValueError, OSError):
            pass
