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
