"""`lab run` as one library call: one reader process, or N rank processes, until the steps,
the duration or a signal end it.

The reader's protocol lines on stderr (``lab: pid P``, ``lab: ready``) are part of the run:
scenarios and tracers wait for them.  SIGINT / SIGTERM stop the run; SIGUSR1 ends the
``start_delay`` wait early (a tracer is attached).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from engramprof.errors import UserError
from engramprof.host.signals import events_on_signals, install_stop_handlers
from engramprof.lab import ranks, workload
from engramprof.markers import MarkerFileError


def run(table_path: Path, reader: str, rank_plans: list | None, *, steps, duration, tokens, heads, gap_ms, zipf,
        seed, markers, cache: bool | None, start_delay, threads, random, prefetch, prefetch_lead) -> dict:
    """Run the workload (``rank_plans``: :func:`engramprof.lab.ranks.plans`, or None for one
    process) and return its summary; a bad --markers or table file is a UserError."""
    if rank_plans is None:
        print(f"lab: pid {os.getpid()}", file=sys.stderr, flush=True)
    stop = threading.Event()
    go = threading.Event()  # SIGUSR1: start now (a tracer is attached)

    def on_stop(*_):
        stop.set()
        go.set()

    restore_signals = install_stop_handlers(on_stop, extra={signal.SIGUSR1: lambda *_: go.set()})
    undo_events = lambda: None  # noqa: E731
    try:
        if rank_plans is not None:  # the ranks print the pid and ready lines once set up
            return ranks.run_ranks(rank_plans, stop, go, dict(
                steps=steps, duration=duration, tokens=tokens, heads=heads, gap_ms=gap_ms, zipf=zipf, seed=seed,
                markers=markers, start_delay=start_delay, threads=threads, random=random, prefetch=prefetch,
                prefetch_lead=prefetch_lead))
        undo_events = events_on_signals(stop, go)  # whichever thread takes them (signals.py)
        return workload.run_workload(
            table_path, reader, steps=steps, duration=duration, tokens=tokens, heads=heads,
            gap_ms=gap_ms, zipf=zipf, seed=seed, markers=markers,
            cache=None if cache is None else ("warm" if cache else "cold"),
            start_delay=start_delay, threads=threads, stop=stop, start_event=go,
            on_ready=lambda: print("lab: ready", file=sys.stderr, flush=True),
            random=random, prefetch=prefetch, prefetch_lead=prefetch_lead,
        )
    except MarkerFileError as exc:
        raise UserError(f"--markers: {exc}") from None
    except OSError as exc:  # e.g. --markers in a directory that does not exist
        raise UserError(f"{exc.filename or table_path}: {exc.strerror}") from None
    finally:
        undo_events()
        restore_signals()
