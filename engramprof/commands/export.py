"""`engramprof export`: always-on Prometheus metrics of a reader's reads (engramprof.export)."""
from __future__ import annotations

from typing import Optional

import typer

EPILOG = """Examples:

engramprof export --pid 4242 --label rank=2
engramprof export --cgroup /sys/fs/cgroup/unified/engram.slice --window 10
engramprof export --pid 4242 --markers /run/engram/batches.jsonl
engramprof export --cgroup G --listen 0.0.0.0:9435 --allow-remote

Metrics: curl -s 127.0.0.1:9435/metrics | grep ^engramprof_
Page: docs/commands/export.md
"""


def register(app: typer.Typer) -> None:
    @app.command("export", epilog=EPILOG)
    def export_cmd(
        pid: Optional[list[int]] = typer.Option(None, "--pid", "-p", metavar="PID", help="A reader process (all its threads); repeat for several. One that exits is waited for (engramprof_target_waiting)."),
        children: bool = typer.Option(False, "--children", help="Also every descendant of --pid, including processes forked later."),
        cgroup: Optional[list[str]] = typer.Option(None, "--cgroup", metavar="CGROUP", help="Every process in this cgroup directory and its sub-groups, now and later (v2, or a v1 hierarchy path); repeatable."),
        file: Optional[list[str]] = typer.Option(None, "--file", metavar="PATH", help="Only reads of this file (a directory: every regular file under it); repeatable."),
        listen: str = typer.Option("127.0.0.1:9435", "--listen", metavar="HOST:PORT", help="HOST:PORT to serve /metrics on (loopback unless --allow-remote)."),
        window: float = typer.Option(10.0, "--window", metavar="SECONDS", help="Seconds of reads per batch analysis (the cause split)."),
        markers: Optional[str] = typer.Option(None, "--markers", metavar="FILE", help="Batch markers the server appends to (JSON lines with start_ns/end_ns, CLOCK_MONOTONIC); default: batches inferred."),
        label: Optional[list[str]] = typer.Option(None, "--label", metavar="NAME=VALUE", help="NAME=VALUE added to every metric (for example rank=2); repeatable."),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --listen (the metrics name the files read)."),
        window_sample: int = typer.Option(25_000, "--window-sample", metavar="N", help="Reads recorded per window for its analysis, per read path's program (syscall reads and faults; io_uring; libaio); the rest are only counted."),
        hook: str = typer.Option("auto", "--hook", metavar="HOOK", help="Syscall hook: auto | raw (raw_syscalls, x86_64) | tracepoint."),
    ) -> None:
        """Serve Prometheus metrics of the target's reads until SIGTERM.

        Attaches one probe that aggregates in the kernel (per file and read kind: calls, bytes,
        EAGAIN, misses, pages inserted, bios, reclaim / off-CPU / run-queue time, latency
        histograms) and, every --window seconds, runs the batch analysis on a sample of that
        window's reads: batch time split into causes, and the window's verdict.
        """
        from engramprof.errors import UserError
        from engramprof.export import options
        from engramprof.export.server import ExportSettings, run
        from engramprof.target.process import check_privileges, check_target
        from engramprof.target.selection import Selection

        where = options.parse_listen(listen, allow_remote)
        labels = options.parse_labels(label)
        if hook not in ("auto", "raw", "tracepoint"):
            raise UserError(f"--hook {hook}: expected auto, raw or tracepoint", code=2)
        from engramprof import validate

        validate.at_least("--window-sample", window_sample, 1)
        for p in pid or ():
            check_target(p)  # a pid that exits later is waited for; one that does not exist now is a typo
        check_privileges()
        settings = ExportSettings(
            selection=Selection.parse(pids=pid, children=children, cgroups=cgroup, files=file),
            listen=where, window_s=options.check_window(window), labels=labels,
            markers=options.check_markers(markers), window_sample=window_sample, hook=hook)
        raise typer.Exit(run(settings))
