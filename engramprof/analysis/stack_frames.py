"""What one sampled Python stack says: its code site, its state, and whether it is a pool worker.

Pure functions over the ``frames`` text of samples/stacks (innermost first, one frame a line:
function TAB filename TAB line; engramprof/trace/schema.py).  Used by the code view
(engramprof/analysis/codeview.py).

- **Machinery** frames are the interpreter's library: the standard library (``.../lib/pythonX.Y/``
  outside site-packages, ``<frozen ...>``).  The **code site** of a stack is its innermost frame
  of the user's own code (neither machinery nor an installed package's: numpy's ``take`` wrapper
  names the line that called it); the frames inside it are the ``via`` (``Future.result``,
  ``Condition.wait``, ``_wrapfunc``).
- A stack **waits** when its innermost frames are a wait of the threading / queue /
  concurrent.futures machinery; it waits **on a future** when a concurrent.futures frame is
  among them (``Future.result``, ``as_completed``, ``wait``).
- A **pool worker** has ``concurrent/futures/thread.py`` ``_worker`` at its root side; it is
  **idle** when ``_worker`` is its innermost frame (waiting for a work item).
"""
from __future__ import annotations

import re
from typing import NamedTuple

_LIBRARY = re.compile(r"/(site|dist)-packages/")
_STDLIB = re.compile(r"(^<frozen )|(/lib/python\d+(\.\d+)?t?/(?!.*(site|dist)-packages/))")
#: machinery functions that block: the step thread is waiting, not running, in them
_WAITS = {("threading.py", "Condition.wait"), ("threading.py", "Event.wait"), ("threading.py", "Semaphore.acquire"),
          ("threading.py", "Thread.join"), ("threading.py", "Thread._wait_for_tstate_lock"),
          ("threading.py", "Barrier.wait"), ("queue.py", "Queue.get"), ("queue.py", "Queue.put"),
          ("selectors.py", "EpollSelector.select"), ("selectors.py", "PollSelector.select"),
          ("selectors.py", "SelectSelector.select"), ("concurrent/futures/_base.py", "Future.result"),
          ("concurrent/futures/_base.py", "as_completed"), ("concurrent/futures/_base.py", "wait"),
          ("concurrent/futures/_base.py", "Future.exception")}
_FUTURES = "concurrent/futures/"
_WORKER = ("concurrent/futures/thread.py", "_worker")
#: executor machinery that runs (not waits): submit / complete, a work item's bookkeeping
_EXECUTOR = {("concurrent/futures/thread.py", "ThreadPoolExecutor.submit"),
             ("concurrent/futures/thread.py", "_WorkItem.run"), ("concurrent/futures/_base.py", "Future.set_result"),
             ("concurrent/futures/thread.py", "ThreadPoolExecutor._adjust_thread_count"),
             ("concurrent/futures/_base.py", "Future._invoke_callbacks")}

# a sample's state (what the thread was doing at the sample)
CPU = "on-CPU (Python, holds the GIL)"
NATIVE = "on-CPU, GIL released (native code or a syscall)"
READ = "in a read (blocked in the kernel)"
FUTURE = "waiting on a future"
WAIT = "waiting (lock, condition, queue)"
GIL_WAIT = "runnable, waiting for the GIL"
BLOCKED = "asleep in a call (sleep, socket, signal wait)"
RUNQ = "runnable, waiting for a CPU"
IDLE = "idle pool worker"
STATES = (CPU, NATIVE, READ, FUTURE, WAIT, GIL_WAIT, BLOCKED, RUNQ, IDLE)
#: states told by the frames alone in which a thread issues no read (the read join skips them)
WAITING = (IDLE, FUTURE, WAIT)
#: a thread waiting for the GIL wakes at least every switch interval (CPython: 5 ms) to ask for
#: it, so its off-CPU spans are about that long; a longer sleep outside a Python wait is a call
#: that blocks (time.sleep, a socket, sigwait), not the GIL
GIL_SPAN_NS = 10_000_000


class Frame(NamedTuple):
    func: str
    file: str
    line: int

    def short(self) -> str:
        return f"{self.func} ({short_file(self.file)}:{self.line})"


class Site(NamedTuple):
    """A stack's code site: the user's frame, and the machinery frames inside it."""

    frame: Frame | None  # None: every frame is machinery (or none was read)
    via: tuple[str, ...]  # machinery function names, innermost first, inside the site

    @property
    def key(self) -> str:
        return self.frame.short() if self.frame is not None else (self.via[-1] if self.via else "(no Python frame)")


def parse(text: str | None) -> list[Frame]:
    out = []
    for ln in (text or "").split("\n"):
        parts = ln.split("\t")
        if len(parts) == 3:
            out.append(Frame(parts[0], parts[1], int(parts[2]) if parts[2].lstrip("-").isdigit() else 0))
    return out


def short_file(path: str) -> str:
    """The path from its package on: ``.../engramprof/lab/readers.py`` -> ``lab/readers.py``
    (two components); stdlib files by their path inside the library."""
    m = re.search(r"/lib/python\d+(\.\d+)?t?/(?:(?:site|dist)-packages/)?(.+)$", path)
    if m:
        return m.group(2)
    parts = path.split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else path


def is_machinery(f: Frame) -> bool:
    return bool(_STDLIB.search(f.file))


def _key(f: Frame) -> tuple[str, str]:
    return short_file(f.file), f.func


def is_library(f: Frame) -> bool:
    """An installed package's frame (site-packages / dist-packages: numpy's ``take``, a client)."""
    return bool(_LIBRARY.search(f.file))


def site_of(frames: list[Frame]) -> Site:
    """The innermost frame of the user's own code (neither the standard library nor an installed
    package: numpy's Python wrappers name the line that called them); without one (an application
    installed as a package), the innermost frame outside the standard library."""
    for skip in (lambda f: is_machinery(f) or is_library(f), is_machinery):
        via = []
        for f in frames:
            if not skip(f):
                return Site(f, tuple(via))
            via.append(f.func)
    return Site(None, tuple(via))


def is_worker(frames: list[Frame]) -> bool:
    return any(_key(f) == _WORKER for f in frames)


def worker_idle(frames: list[Frame]) -> bool:
    """A pool worker waiting for its next work item (``_worker`` innermost, or a queue wait in it)."""
    for f in frames:
        if _key(f) == _WORKER:
            return True
        if not (is_machinery(f) and (_key(f) in _WAITS or f.file.endswith("queue.py"))):
            return False
    return False


def wait_kind(frames: list[Frame]) -> str | None:
    """FUTURE, WAIT, or None: the innermost machinery frames (before the first user frame)
    hold a blocking wait."""
    waiting, future = False, False
    for f in frames:
        if not is_machinery(f):
            break
        k = _key(f)
        waiting |= k in _WAITS
        future |= k[0].startswith(_FUTURES) and k in _WAITS
    return (FUTURE if future else WAIT) if waiting else None


def in_executor(frames: list[Frame]) -> bool:
    """The innermost machinery frames are the executor's submit / complete bookkeeping."""
    for f in frames:
        if not is_machinery(f):
            return False
        if _key(f) in _EXECUTOR:
            return True
    return False


def frame_state(frames: list[Frame]) -> str | None:
    """The state the frames alone tell: an idle pool worker, a wait on a future, another wait;
    None: the frames do not say (the thread runs, or waits for the GIL, a CPU, the kernel)."""
    if is_worker(frames) and worker_idle(frames):
        return IDLE
    return wait_kind(frames)


def run_state(gil: bool, active: bool, in_blocked_read: bool, offcpu: tuple[int, bool] | None = None) -> str:
    """The state of a thread the frames do not place in a wait (see :func:`state_of`)."""
    if gil:
        return CPU
    if in_blocked_read:
        return READ
    if offcpu is not None:
        span, preempted = offcpu
        if span == 0:
            return NATIVE if active else BLOCKED
        if preempted:
            return RUNQ
        return BLOCKED if span > GIL_SPAN_NS else GIL_WAIT
    if active:
        return NATIVE
    return GIL_WAIT


def state_of(frames: list[Frame], gil: bool, active: bool, in_blocked_read: bool,
             offcpu: tuple[int, bool] | None = None) -> str:
    """A sample's state from its stack, py-spy's GIL and run state, and the kernel's records
    (``in_blocked_read``: a read of this thread that slept in the kernel overlaps the sample's
    window; ``offcpu``: the thread's off-CPU span overlapping the sample's window, (length ns,
    preempted); (0, False) when none does; None when the trace has no off-CPU spans).

    Order: an idle worker; a wait (by its frames, whatever the run state: a thread woken from
    a wait is runnable before it returns); holding the GIL; in a blocked read; then, for a
    thread outside any Python wait and without the GIL, the kernel's off-CPU span decides:
    preempted -> waiting for a CPU; asleep longer than :data:`GIL_SPAN_NS` -> a blocking call;
    shorter -> waiting for the GIL.  No recorded span: runnable per py-spy -> native code (or a
    cached read's copy); asleep -> a sleep that began before the window or outlasted it (a
    blocking call).  Without off-CPU spans py-spy's run state alone decides (runnable ->
    native, asleep -> GIL)."""
    return frame_state(frames) or run_state(gil, active, in_blocked_read, offcpu)
