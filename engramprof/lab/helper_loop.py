"""The set-up the lab's helper processes share (engramprof/lab/dropper.py, streamer.py).

Each is a separate process a scenario starts next to the traced reader: it opens one file,
repeats one step until SIGTERM / SIGINT or until its parent exits, keeps its count of steps
in a new count file (the scenario's evidence) and prints ``{"<what>": N}`` on stdout at the end.

The stop signals are blocked and taken with sigtimedwait(2) rather than by a Python handler
setting a threading.Event: such a handler runs between two bytecodes of the main thread, and
if that is inside Event.wait() while it holds the Event's lock, set() deadlocks on it.
"""
from __future__ import annotations

import json
import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: the pid of the process that started the helper, set by it (lab/evicting.py)
PARENT_ENV = "ENGRAMPROF_HELPER_PARENT"


class HelperLoop:
    """One helper process's file, count file, stop signals and parent watch."""

    def __init__(self, prog: str, what: str):
        self.prog = prog  # the name its error lines start with
        self.what = what  # the key of the count it prints ("drops", "passes")
        self.count = 0
        self.fd: int | None = None
        self.count_fd: int | None = None
        self._stopped = False
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # pending until taken below
        # the starter names itself (PARENT_ENV): a parent that died before this line is then
        # noticed too (getppid() is already the reaper's pid, and PR_SET_PDEATHSIG set after
        # the parent's death never fires)
        try:
            self.parent = int(os.environ.get(PARENT_ENV) or os.getppid())
        except ValueError:
            self.parent = os.getppid()

    def open(self, path: str, count_file: str | None) -> bool:
        """Open ``path`` read-only and ``count_file`` (new, never through a link); False: an
        error line was printed (the exit status is then 1)."""
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            print(f"{self.prog}: {path}: {exc.strerror}", file=sys.stderr)
            return False
        if count_file:
            try:
                self.count_fd = os.open(count_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                        0o600)
            except OSError as exc:
                print(f"{self.prog}: {count_file}: {exc.strerror}", file=sys.stderr)
                return False
        return True

    @property
    def stopping(self) -> bool:
        """A stop signal came (checked without waiting), or the parent is gone."""
        if not self._stopped and set(STOP_SIGNALS) & signal.sigpending():
            self._stopped = True
        return self._stopped or os.getppid() != self.parent

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless a stop signal comes; True: go on (no signal, parent alive)."""
        if not self._stopped and signal.sigtimedwait(STOP_SIGNALS, seconds) is not None:
            self._stopped = True
        return not self.stopping

    def counted(self) -> None:
        """One more step done: the count file says so (fixed width, written in place)."""
        self.count += 1
        if self.count_fd is not None:
            os.pwrite(self.count_fd, b"%-20d" % self.count, 0)

    def __enter__(self) -> HelperLoop:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the files and print the count (also after an error inside the loop)."""
        for fd in (self.fd, self.count_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.count_fd = None
        print(json.dumps({self.what: self.count}), flush=True)
