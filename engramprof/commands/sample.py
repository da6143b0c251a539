"""`engramprof sample`: the samplers alone, no eBPF.

The degraded mode where tracing is impossible, and the field report's "memory evidence"
first look: PSI, reclaim and refault counters, kswapd, the target's memory cgroup and its
threads' context switches over a window.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from engramprof.commands.options import duration_option, output_option, pid_option
from engramprof.host.signals import install_stop_handlers


def run_sample(
    pid: int | None = None,
    duration: float | None = None,
    hz: float = 10.0,
    output: str | Path | None = None,
    *,
    live: bool = False,
    proc_root: str = "/proc",
    sys_root: str = "/sys",
    stop_event: threading.Event | None = None,
    selection=None,
) -> dict:
    """Sample until ``duration``, SIGINT/SIGTERM, ``stop_event`` or the exit of ``pid``.

    ``selection`` (engramprof.target.selection.Selection: --pid repeated, --children, --cgroup,
    --file): its processes, found in /proc about once a second; the first one found is ``pid``
    (its cgroup, the live line), every one gets process and thread rows.

    Returns the summary (see :func:`engramprof.sampling.sampler.summarize`); writes a TRACE bundle
    with the sample series when ``output`` is given.
    """
    from engramprof import validate
    from engramprof.sampling.sampler import Sampler  # pandas: imported when sampling, not for --help
    from engramprof.trace.writer import END_DURATION, END_SIGNAL, END_TARGET_EXIT

    validate.pid("--pid", pid)
    validate.duration("--duration", duration)
    validate.sample_hz("--sample-hz", hz)
    follow, waiting = None, []
    if selection is not None:
        for p in selection.pids:
            validate.live_process("--pid", p)
        several = len(selection.pids) != 1 or selection.children or selection.cgroups_v2 or selection.cgroups_v1 \
            or selection.files
        if several:
            follow = selection.processes_now
            now = sorted(follow())
            pid = selection.first_pid if selection.first_pid in now else (now[0] if now else None)
            waiting = selection.waiting()
        else:
            pid = selection.first_pid
    if proc_root == "/proc":
        validate.live_process("--pid", pid)
    sampler = Sampler(pid=pid, hz=hz, proc_root=proc_root, sys_root=sys_root, follow=follow)
    writer = None
    if output is not None:
        from engramprof.trace import TraceWriter

        writer = TraceWriter(output, meta={"command": "sample", "argv": sys.argv, "pid": pid, "sample_hz": hz,
                                           **(selection.meta() if selection is not None else {})})
    stop = stop_event or threading.Event()
    reason = {"why": END_DURATION, "signal": None}

    def on_signal(signum, _frame):
        reason["why"], reason["signal"] = END_SIGNAL, signal.Signals(signum).name
        stop.set()

    restore_signals = install_stop_handlers(on_signal)
    err = Console(stderr=True)
    try:
        sampler.start(writer)
        for line in waiting:  # not an error: the sampling waits for them
            print(f"engramprof: {line}", file=sys.stderr, flush=True)
        target = f" {selection.describe()}" if follow is not None else f" pid {pid}" if pid is not None else ""
        span = f" for {duration:g} s" if duration else " until Ctrl-C"
        print(f"Sampling{target} at {hz:g} Hz{span}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + duration if duration else None
        status = None
        if live:
            from rich.live import Live

            status = Live(sampler.status_line(), console=err, refresh_per_second=2, transient=True)
            status.start()
        try:
            while not stop.wait(0.1):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                # several processes: ends when all have exited (--pid, --children); a cgroup or a
                # file selects whoever comes: until the duration or a signal
                if sampler.target_exited.is_set() and (follow is None or (
                        selection.ends_with_targets and not sampler.followed)):
                    reason["why"] = END_TARGET_EXIT
                    break
                if status is not None:
                    status.update(sampler.status_line())
        finally:
            if status is not None:
                status.stop()
    finally:
        restore_signals()
        sampler.stop()
        if writer is not None:
            writer.close(end_reason=reason["why"])
    summary = sampler.summary()
    summary["end_reason"] = reason["why"]
    if reason["why"] == END_SIGNAL:
        summary["notes"].append(f"ended by {reason['signal']}: output covers the window sampled so far")
    if writer is not None:
        summary["output"] = str(output)
    return summary


def register(app: typer.Typer) -> None:
    @app.command("sample", epilog=(
        "Examples:\n\n"
        "engramprof sample --duration 10             # PSI, refaults, kswapd\n"
        "engramprof sample --pid 4242 --duration 10  # + its cgroup and threads\n"
        "engramprof sample --pid 4242 --duration 30 --json --output /var/tmp/s1\n"
        "engramprof sample --pid 4242 --children     # and its workers\n"
        "engramprof sample --file /data/engram.safetensors  # who holds it\n\n"
        "No eBPF needed. Page: docs/commands/sample.md"
    ))
    def sample(
        pid: Optional[list[int]] = pid_option("Target process: its cgroup, process and per-thread counters too; repeat for several."),
        children: bool = typer.Option(False, "--children", help="Also every descendant of --pid (found in /proc about once a second)."),
        cgroup: Optional[list[str]] = typer.Option(None, "--cgroup", metavar="CGROUP", help="Every process in this cgroup directory and its sub-groups (v2 or v1); repeatable."),
        file: Optional[list[str]] = typer.Option(None, "--file", metavar="PATH", help="The processes that have this file (a directory: any regular file under it) open or mapped; repeatable. With --pid / --cgroup: those of them."),
        duration: Optional[float] = duration_option(None, "Seconds to sample (default: until Ctrl-C or the target exits)."),
        sample_hz: float = typer.Option(10.0, "--sample-hz", metavar="HZ", help="Sampling rate."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        output: Optional[Path] = output_option("Write the sample series to this TRACE bundle (a new directory)."),
    ) -> None:
        """Sample PSI, reclaim/refault counters, kswapd, the target's memory cgroup and threads (no eBPF)."""
        selection = None
        if pid or children or cgroup or file:
            from engramprof import validate
            from engramprof.target.selection import Selection

            for p in pid or ():
                validate.pid("--pid", p)
            selection = Selection.parse(pids=pid, children=children, cgroups=cgroup, files=file)
        summary = run_sample(None, duration, sample_hz, output, live=not json_out and sys.stderr.isatty(),
                             selection=selection)
        if json_out:
            print(json.dumps(summary, indent=2))
        else:
            from engramprof.report import sample as report

            report.render(summary, Console())
