"""SIGINT / SIGTERM handling shared by the long-running commands."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def install_stop_handlers(handler: Callable, extra: dict | None = None) -> Callable[[], None]:
    """Route SIGINT and SIGTERM (and ``extra``: {signal: handler}) to ``handler``; returns the
    function that puts the previous handlers back.  Off the main thread (where Python cannot
    set handlers, e.g. a command run from a test's thread) it changes nothing."""
    old: dict = {}
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            old[s] = signal.signal(s, handler)
        for s, h in (extra or {}).items():
            old[s] = signal.signal(s, h)

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)
        old.clear()

    return restore


@contextlib.contextmanager
def stop_handlers(handler: Callable, extra: dict | None = None) -> Iterator[None]:
    """:func:`install_stop_handlers` for the duration of a ``with`` block."""
    restore = install_stop_handlers(handler, extra)
    try:
        yield
    finally:
        restore()


def events_on_signals(stop: threading.Event, go: threading.Event) -> Callable[[], None]:
    """SIGINT / SIGTERM set ``stop`` and ``go``, SIGUSR1 sets ``go``, whichever thread the
    kernel delivers them to; returns the function that undoes it.

    Not an Event.set() in a Python handler: that handler runs only when the main thread next
    runs bytecode (a signal delivered to a native thread, say numpy's BLAS pool, leaves a main
    thread blocked in ``go.wait(60)`` asleep for the whole 60 s), and when it does run it can
    deadlock on the lock of the very Event the main thread is inside.  Python's C-level handler
    writes the signal number to a wakeup pipe in whatever thread took the signal; a thread of
    our own reads the pipe and sets the events.  Off the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    import os

    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # the C handler's write must never block
    os.set_blocking(r, True)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    wanted = (*STOP_SIGNALS, signal.SIGUSR1)
    old = {s: signal.signal(s, lambda *_: None) for s in wanted}  # a Python handler: the C one writes

    def pump() -> None:
        while data := os.read(r, 64):  # b"": the write end closed (undo)
            for signum in data:
                if signum != signal.SIGUSR1:
                    stop.set()
                go.set()
        os.close(r)

    t = threading.Thread(target=pump, name="engramprof-signals", daemon=True)
    t.start()

    def undo() -> None:
        signal.set_wakeup_fd(old_fd)
        for s, h in old.items():
            signal.signal(s, h)
        os.close(w)
        t.join(5)

    return undo
