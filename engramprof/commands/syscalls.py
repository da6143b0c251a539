"""`engramprof syscalls`: per-call preadv2 / preadv / pread64 tracing of one process."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console

from engramprof.commands.options import (LAYOUT_HELP, check_stack_hz, duration_option, output_option, pid_option,
                                         stack_hz_option, use_layout)
from engramprof.errors import UserError
from engramprof.host import tracepoints
from engramprof.host.signals import install_stop_handlers
from engramprof.report import syscalls as report_syscalls

EPILOG = """Examples:

engramprof syscalls --pid 4242 --duration 30       # live view, then summary
engramprof syscalls --pid 4242 --output /var/tmp/t1  # every call to a TRACE
engramprof syscalls --pid 4242 --min-us 1000 --json  # record calls >= 1 ms
engramprof syscalls --pid 4242 --ebpf              # print the BPF program
engramprof syscalls --pid 4242 --pid 4243         # two processes
engramprof syscalls --pid 4242 --children         # a process tree
engramprof syscalls --cgroup /sys/fs/cgroup/unified/kubepods.slice/POD
engramprof syscalls --file /data/engram.safetensors  # who reads it

Page: docs/commands/syscalls.md
"""


def register(app: typer.Typer) -> None:
    @app.command("syscalls", epilog=EPILOG)
    def syscalls_cmd(
        pid: Optional[list[int]] = pid_option("Process to trace (all its threads); repeat for several."),
        children: bool = typer.Option(False, "--children", help="Also every descendant of --pid, including processes forked while tracing."),
        cgroup: Optional[list[str]] = typer.Option(None, "--cgroup", metavar="CGROUP", help="Every process in this cgroup directory and its sub-groups (v2, or a v1 hierarchy path); repeatable."),
        file: Optional[list[str]] = typer.Option(None, "--file", metavar="PATH", help="Only reads of this file (a directory: every regular file under it), by whichever process, matched in the kernel by device + inode; repeatable. With --pid / --cgroup: their reads of it."),
        tid: int = typer.Option(0, "--tid", metavar="TID", help="Trace only this thread of PID."),
        duration: Optional[float] = duration_option(None, "Stop after SECONDS (default: until Ctrl-C or PID exits)."),
        min_us: float = typer.Option(0.0, "--min-us", metavar="US", help="Record only calls at least this long (all calls are still counted in the kernel)."),
        output: Optional[str] = output_option("Write a trace bundle (a new directory) with every recorded call."),
        as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON on stdout."),
        ebpf: bool = typer.Option(False, "--ebpf", help="Print the BPF program that would be loaded, and exit."),
        sample_hz: float = typer.Option(10.0, "--sample-hz", metavar="HZ", help="PSI / vmstat / thread sampling rate (0: off)."),
        stack_hz: float = stack_hz_option(),
        hook: str = typer.Option("auto", "--hook", metavar="HOOK", help="Syscall hook: auto | raw (raw_syscalls, x86_64) | tracepoint."),
        no_offcpu: bool = typer.Option(False, "--no-offcpu", help="Do not record the off-CPU spans of PID's threads (samples/offcpu)."),
        no_fault_address: bool = typer.Option(False, "--no-fault-address", help="Trace page faults without exceptions:page_fault_user (the x86-only tracepoint giving the address): the generic path, as on arm64."),
        layout_file: Optional[str] = typer.Option(None, "--layout", metavar="FILE", help=LAYOUT_HELP),
    ):
        """Trace every preadv2/preadv/pread64/read/readv call of PID with its latency, file, offset and
        in-kernel evidence (page-cache misses, bio time, reclaim, off-CPU and run-queue time).

        Prints a line starting with `Tracing` on stderr once the probes are attached. Ends on
        Ctrl-C, SIGTERM, --duration or the exit of PID; the trace is complete in every case.
        """
        from engramprof.bpf import syscalls as syscalls_probe
        from engramprof.trace.writer import END_SIGNAL
        from engramprof import validate
        from engramprof.record import recorder as sc

        use_layout(layout_file)

        if hook not in ("auto", "raw", "tracepoint"):
            raise UserError(f"--hook must be auto, raw or tracepoint (got {hook!r})")
        from engramprof.target.selection import Selection

        for p in pid or ():
            validate.pid("--pid", p)
        validate.at_least("--tid", tid, 0, validate.MAX_PID)
        validate.duration("--duration", duration)
        validate.non_negative("--min-us", min_us)
        validate.sample_hz("--sample-hz", sample_hz, zero_is_off=True)
        check_stack_hz(stack_hz)
        selection = Selection.parse(pids=pid, tid=tid, children=children, cgroups=cgroup, files=file)
        if ebpf:  # needs no privileges: where tracefs cannot be read, every feature is assumed
            config = syscalls_probe.SyscallsConfig(tgid=selection.first_pid, tid=tid, min_ns=int(min_us * 1000),
                                        syscall_hook=hook, selection=selection,
                                        native_every_ns=syscalls_probe.native_every_ns(stack_hz))
            try:
                plan = syscalls_probe.plan(config)
            except UserError as exc:
                if tracepoints.tracefs_root() is not None:
                    raise  # tracefs readable, the kernel really lacks a required tracepoint
                plan = syscalls_probe.assumed_plan(config, str(exc).replace("*/", "* /"))
            sys.stdout.write(syscalls_probe.program_text(plan))
            return
        for p in selection.pids:
            validate.live_process("--pid", p)
        err = Console(stderr=True)
        tracer = sc.Recorder(selection, tid=tid, output=output, argv=sys.argv, min_us=min_us, sample_hz=sample_hz,
                             syscall_hook=hook, offcpu=not no_offcpu, fault_address=not no_fault_address,
                             stack_hz=stack_hz)

        def on_signal(signum, _frame):
            tracer.end_reason = END_SIGNAL
            tracer.stop.set()

        restore_signals = install_stop_handlers(on_signal)
        try:
            tracer.start()
            for line in selection.waiting():  # not an error: the trace waits for it
                print(f"engramprof: {line}", file=sys.stderr, flush=True)
            paths = ["preadv2/preadv/pread64/read/readv"] + (["io_uring reads"] if tracer.uring is not None else []) \
                + (["libaio reads"] if tracer.libaio is not None else []) \
                + (["page faults"] if tracer.faults is not None else [])
            print(f"Tracing {', '.join(paths[:-1]) + ' and ' + paths[-1] if len(paths) > 1 else paths[0]} of {selection.describe()}"
                  f" ({'raw_syscalls' if tracer.plan.raw_syscalls else 'syscalls tracepoints'})"
                  f"{f', recording to {output}' if output else ''}... Ctrl-C to end.", file=sys.stderr, flush=True)
            live = report_syscalls.LiveView(err) if err.is_terminal else None
            try:
                if live:
                    live.__enter__()
                tracer.run(duration=duration, on_tick=live.update if live else None)
            finally:
                if live:
                    live.__exit__(None, None, None)
                summary = tracer.finish() if tracer.probe is not None else None
        finally:
            restore_signals()
        if summary is None:
            return
        if as_json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            report_syscalls.print_summary(Console(), summary)
        if tracer.write_error:  # disk full, ...: the summary above is complete, the trace is not
            kept = tracer.writer.meta.get("calls_written", 0) if tracer.writer else 0
            meta = "" if not tracer.meta_error else f"; meta.json not updated ({tracer.meta_error})"
            raise UserError(f"{tracer.end_reason}: {tracer.write_error}: recording stopped after "
                            f"{summary['duration_s']:.1f} s; the {kept:,} calls written before are in {output}{meta}",
                            code=1)
