"""The commands' shared SIGINT/SIGTERM set-up."""
from __future__ import annotations

import os
import signal
import threading

from engramprof.host.signals import install_stop_handlers, stop_handlers


def test_handlers_installed_then_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    got = []
    restore = install_stop_handlers(lambda s, f: got.append(s), extra={signal.SIGUSR1: lambda s, f: got.append(-s)})
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        restore()
    assert got == [signal.SIGTERM, -signal.SIGUSR1]
    assert {s: signal.getsignal(s) for s in before} == before


def test_off_the_main_thread_changes_nothing():
    before = signal.getsignal(signal.SIGINT)
    out = []

    def run():
        with stop_handlers(lambda s, f: None):
            out.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out == [before] and signal.getsignal(signal.SIGINT) is before
