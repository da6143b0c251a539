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
from rich.table import Table

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


# ---------------------------------------------------------------------------------- output


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1e3:,.1f}"


def _pct(p) -> str:
    return "-" if p is None else f"{p:.2f}%"


def _n(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)


def _mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:,.1f} MiB"


def render(s: dict, console: Console) -> None:
    w = s["window"]
    console.print(f"[bold]engramprof sample[/]  window {w['duration_s']:.2f} s, {w['samples']} samples at {w.get('hz') or '?'} Hz")

    if s.get("psi"):
        t = Table(title="Pressure stall (PSI, /proc/pressure)", title_justify="left")
        for c in ("resource", "some ms", "some", "full ms", "full", "peak some", "avg10 end"):
            t.add_column(c, justify="right" if c != "resource" else "left")
        for r, v in s["psi"].items():
            t.add_row(r, _ms(v["some_us"]), _pct(v["some_pct"]), _ms(v["full_us"]), _pct(v["full_pct"]), _pct(v["some_peak_pct"]), _n(v["some_avg10_end"]) if v["some_avg10_end"] is None else f"{v['some_avg10_end']:.2f}")
        console.print(t)

    vm = s.get("vmstat") or {}
    if vm:
        rate = s.get("vmstat_per_s") or {}
        t = Table(title="Reclaim and refaults (/proc/vmstat, pages)", title_justify="left")
        t.add_column("counter")
        t.add_column("delta", justify="right")
        t.add_column("per s", justify="right")
        for c in ("workingset_refault_file", "workingset_activate_file", "workingset_restore_file", "pgscan_kswapd", "pgsteal_kswapd", "pgscan_direct", "pgsteal_direct", "allocstall", "pgscan_memcg", "pgsteal_memcg", "pgmajfault", "pgpgin"):
            if c in vm:
                label = c + (" (KiB)" if c == "pgpgin" else "")
                t.add_row(label, _n(vm[c]), _n(rate.get(c)) if c in rate else "")
        ks = s.get("kswapd")
        if ks:
            for th in ks["threads"]:
                t.add_row(f"{th['name']} cpu", f"{th['cpu_s']:.3f} s", f"{100 * th['cpu_s'] / w['duration_s']:.1f}%" if w["duration_s"] else "-")
        console.print(t)

    cg = s.get("cgroup")
    if cg:
        t = Table(title=f"Target memory cgroup ({cg.get('version')})", title_justify="left")
        t.add_column("what")
        t.add_column("value", justify="right")
        if cg.get("v1_memory"):
            t.add_row("v1 memory group", cg["v1_memory"])
        if cg.get("v2"):
            t.add_row("v2 group", cg["v2"])
        t.add_row("usage (end / max)", f"{_mib(cg.get('usage_bytes'))} / {_mib(cg.get('usage_max_bytes'))}")
        t.add_row("limit", _mib(cg.get("limit_bytes")) if cg.get("limited") else "none")
        for c in ("refault_file", "pgscan", "pgsteal", "failcnt", "events_max", "pgpgin", "pgpgout", "pgmajfault"):
            if cg.get(c) is not None:
                t.add_row(c, _n(cg[c]))
        for r, v in (cg.get("pressure") or {}).items():
            if v.get("some_us") is not None:
                t.add_row(f"{r} pressure some / full", f"{_ms(v['some_us'])} ms ({_pct(v['some_pct'])}) / {_ms(v['full_us'])} ms ({_pct(v['full_pct'])})")
        console.print(t)

    pr = s.get("process")
    if pr:
        t = Table(title=f"Target pid {pr.get('pid')} ({pr.get('name')})" + (" - exited" if pr.get("exited") else ""), title_justify="left")
        t.add_column("what")
        t.add_column("value", justify="right")
        if pr.get("samples"):
            t.add_row("cpu user / system", f"{pr['cpu_user_s']:.2f} s / {pr['cpu_system_s']:.2f} s ({_pct(pr.get('cpu_pct'))} of a core)")
            t.add_row("context switches vol / invol", f"{_n(pr.get('ctx_voluntary'))} / {_n(pr.get('ctx_involuntary'))} ({_n(pr.get('ctx_per_s'))}/s)")
            t.add_row("threads", _n(pr.get("threads_seen")))
            if pr.get("run_s") is not None:
                t.add_row("threads on CPU / waiting to run", f"{pr['run_s']:.2f} s / {pr['runq_s']:.2f} s")
            t.add_row("major / minor faults", f"{_n(pr.get('majflt'))} / {_n(pr.get('minflt'))}")
            if pr.get("rchar") is not None:
                t.add_row("read via syscalls / from storage", f"{_mib(pr['rchar'])} / {_mib(pr['read_bytes'])}")
        console.print(t)
        ths = pr.get("threads") or []
        if ths:
            tt = Table(title="Busiest threads (by context switches)", title_justify="left")
            for c in ("tid", "name", "vol cs", "invol cs", "cpu s"):
                tt.add_column(c, justify="left" if c == "name" else "right")
            for th in ths[:10]:
                tt.add_row(str(th["tid"]), th["name"], _n(th["ctx_voluntary"]), _n(th["ctx_involuntary"]), f"{th['cpu_s']:.2f}")
            if len(ths) > 10:
                tt.caption = f"{len(ths) - 10} more threads in --json"
            console.print(tt)

    procs = s.get("processes") or []
    if procs:
        t = Table(title=f"Traced processes ({len(procs)})", title_justify="left")
        for c in ("pid", "name", "cpu", "vol / invol cs", "threads", "major faults", "from storage"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for p in procs:
            t.add_row(str(p["pid"]), p.get("name") or "-", _pct(p.get("cpu_pct")),
                      f"{_n(p.get('ctx_voluntary'))} / {_n(p.get('ctx_involuntary'))}", _n(p.get("threads_seen")),
                      _n(p.get("majflt")), _mib(p.get("read_bytes")))
        console.print(t)

    console.print("[bold]Reading[/]")
    for line in s.get("interpretation") or []:
        console.print(f"  - {line}")
    if s.get("notes"):
        console.print("[bold]Notes[/]")
        for n in s["notes"]:
            console.print(f"  - {n}")
    if s.get("output"):
        console.print(f"samples written to {s['output']}")


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
            render(summary, Console())
