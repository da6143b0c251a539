"""`engramprof diagnose`: record a window, analyse it, answer with a verdict and its evidence."""
from __future__ import annotations

import json
import sys
import threading
from typing import Optional

import typer
from rich.console import Console

from engramprof.commands.options import (LAYOUT_HELP, check_stack_hz, duration_option, output_option, pid_option,
                                         stack_hz_option, use_layout)
from engramprof.host.signals import install_stop_handlers

EPILOG = """Examples:

engramprof diagnose --pid 4242              # 20 s: verdict, evidence, fix
engramprof diagnose --pid 4242 --markers batches.jsonl --output /var/tmp/d1
engramprof diagnose --pid 4242 --duration 30 --json | jq .verdict
engramprof diagnose --pid 4242 --children   # a server and its workers
engramprof diagnose --cgroup /sys/fs/cgroup/unified/kubepods.slice/POD
engramprof diagnose --file /data/engram.safetensors  # who reads it

Verdicts: residency, reclaim, storage, python-scheduling, healthy.
Page: docs/commands/diagnose.md
"""


def register(app: typer.Typer) -> None:
    @app.command("diagnose", epilog=EPILOG)
    def diagnose_cmd(
        pid: Optional[list[int]] = pid_option("The reader process (all its threads); repeat for several."),
        children: bool = typer.Option(False, "--children", help="Also every descendant of --pid, including processes forked while recording."),
        cgroup: Optional[list[str]] = typer.Option(None, "--cgroup", metavar="CGROUP", help="Every process in this cgroup directory and its sub-groups (v2, or a v1 hierarchy path); repeatable."),
        file: Optional[list[str]] = typer.Option(None, "--file", metavar="PATH", help="Only reads of this file (a directory: every regular file under it), by whichever process, matched in the kernel by device + inode; repeatable. With --pid / --cgroup: their reads of it."),
        duration: float = duration_option(20.0, "Seconds to record."),
        markers: Optional[str] = typer.Option(None, "--markers", metavar="FILE", help="Batch markers (JSON lines with start_ns/end_ns, CLOCK_MONOTONIC)."),
        output: Optional[str] = output_option("Keep the recorded trace here (a new directory); if not given: a private temporary one, removed."),
        slow_ms: float = typer.Option(4.0, "--slow-ms", metavar="MS", help="A call slower than this (ms) is 'slow'."),
        as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
        no_offcpu: bool = typer.Option(False, "--no-offcpu", help="Do not record the off-CPU spans of PID's threads (less scheduling evidence)."),
        no_fault_address: bool = typer.Option(False, "--no-fault-address", help="Record page faults without exceptions:page_fault_user (the generic path arm64 has: no faulting address)."),
        stack_hz: float = stack_hz_option(),
        layout_file: Optional[str] = typer.Option(None, "--layout", metavar="FILE", help=LAYOUT_HELP),
    ):
        """Which of residency, reclaim, storage or Python scheduling holds PID's batches back.

        Records PID's read calls and memory / scheduling context for --duration seconds, then
        answers with a verdict, the evidence chain, what the data cannot prove, and the fix to try.
        """
        from engramprof.analysis import batches, diagnose
        from engramprof import validate

        use_layout(layout_file)

        from engramprof.target.selection import Selection

        for p in pid or ():
            validate.pid("--pid", p)
        validate.duration("--duration", duration)
        validate.positive("--slow-ms", slow_ms)
        check_stack_hz(stack_hz)
        if markers is not None:  # a bad markers file fails now, not after the recording
            batches.check_markers_before_recording(markers)
        selection = Selection.parse(pids=pid, children=children, cgroups=cgroup, files=file)
        for p in selection.pids:
            validate.live_process("--pid", p)

        stop = threading.Event()

        def on_signal(signum, _frame):
            stop.set()

        restore_signals = install_stop_handlers(on_signal)
        try:
            result = diagnose.run(
                selection, duration=duration, markers=markers, output=output, slow_ms=slow_ms, stop=stop, argv=sys.argv,
                offcpu=not no_offcpu, fault_address=not no_fault_address, stack_hz=stack_hz,
                on_tracing=lambda t: [print(line, file=sys.stderr, flush=True) for line in
                                      [f"engramprof: {w}" for w in selection.waiting()]
                                      + [f"Tracing {selection.describe()} for {duration:g} s (diagnose)... "
                                         "Ctrl-C to stop early."]],
            )
        finally:
            restore_signals()
        if as_json:
            print(json.dumps(diagnose.jsonable(result), indent=2, default=str))
        else:
            from engramprof.report.diagnose import render

            render(Console(), result)
