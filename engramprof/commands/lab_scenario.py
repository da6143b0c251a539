"""`engramprof lab scenario NAME`: the lab reader under one real fault (thin; see
engramprof.lab.scenarios).  ``register(app)`` adds the ``scenario`` command to ``lab_app``."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from engramprof.commands.lab import lab_app
from engramprof.host.signals import install_stop_handlers
from engramprof.lab import scenarios as sc_mod
from engramprof.lab.readers import READERS

SCENARIO_EPILOG = """Scenarios: python-scheduling, healthy, residency, reclaim, storage, dropper,
boot-stream.

Examples:

engramprof lab scenario residency --duration 30
engramprof lab scenario reclaim --json --start-delay 3 > sc.jsonl &
                          # the reader's pid: first JSON line, key pid
engramprof lab scenario storage --keep-running --iops 200  # to Ctrl-C
engramprof lab scenario residency --workers 2 --faulty-rank 1

Page: docs/commands/lab-scenario.md
"""


def _abort_setup(signum, frame) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def scenario_cmd(
    name: str = typer.Argument(..., metavar="SCENARIO", help=" | ".join(sc_mod.SCENARIOS)),
    steps: Optional[int] = typer.Option(None, "--steps", metavar="N", help="batches to run"),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", metavar="SECONDS",
                                             help=f"seconds to run (default {sc_mod.DEFAULT_DURATION:g})"),
    tokens: int = typer.Option(4, "--tokens", metavar="N", help="tokens per step: a few = decode, thousands = prefill"),
    gap_ms: float = typer.Option(sc_mod.DEFAULT_GAP_MS, "--gap-ms", metavar="MS", help="sleep between steps"),
    rows: Optional[int] = typer.Option(None, "--rows", metavar="N",
                                       help=f"rows per tensor of the table made (default {sc_mod.DEFAULT_ROWS}: 132 MiB)"),
    table: Optional[Path] = typer.Option(None, "--table", metavar="FILE",
                                         help="reuse this table (storage copies it into the loop filesystem)"),
    markers: Optional[Path] = typer.Option(None, "--markers", metavar="FILE",
                                           help="batch markers file (default: a new private temp dir, kept)"),
    as_json: bool = typer.Option(False, "--json", help="JSON lines on stdout: a 'ready' object, then 'done'"),
    start_delay: float = typer.Option(0.0, "--start-delay", metavar="SECONDS", help="reader sleeps SECONDS after ready, before step 1"),
    keep_running: bool = typer.Option(False, "--keep-running", help="run until Ctrl-C / SIGTERM"),
    reader: Optional[str] = typer.Option(None, "--reader", metavar="READER", help=f"override the scenario's reader (one of: {', '.join(READERS)}; mmap: a numpy.memmap gather, its rows read by page faults)"),
    evict_ms: float = typer.Option(sc_mod.DEFAULT_EVICT_MS, "--evict-ms", metavar="MS", help="residency, dropper: eviction period"),
    memory_mib: float = typer.Option(sc_mod.DEFAULT_MEMORY_MIB, "--memory-mib", metavar="MIB",
                                     help="reclaim: page cache allowed in the cgroup"),
    iops: int = typer.Option(sc_mod.DEFAULT_IOPS, "--iops", metavar="N", help="storage: read IOPS limit of the loop device"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="seed of the row plan and the table contents"),
    threads: int = typer.Option(32, "--threads", metavar="N", help="pool threads"),
    workers: int = typer.Option(0, "--workers", metavar="N", help="N rank processes forked from one reader process (lab run --workers)"),
    faulty_rank: Optional[int] = typer.Option(None, "--faulty-rank", metavar="RANK", help="the fault applies to this rank only; the others run the healthy reader on a cached table of their own"),
) -> None:
    """Run the lab reader under one real fault, print its pid, remove everything on exit."""
    from engramprof import validate
    from engramprof.lab import readers

    if name not in sc_mod.SCENARIOS:
        raise sc_mod.UserError(f"unknown scenario {name!r}; choose one of {', '.join(sc_mod.SCENARIOS)}")
    if reader is not None and reader not in readers.READERS:
        raise sc_mod.UserError(f"--reader must be one of {', '.join(readers.READERS)}, not {reader!r}")
    validate.at_least("--steps", steps, 1)
    validate.duration("--duration", duration)
    validate.at_least("--tokens", tokens, 1)
    validate.non_negative("--gap-ms", gap_ms)
    validate.at_least("--rows", rows, 1)
    validate.non_negative("--start-delay", start_delay)
    validate.positive("--evict-ms", evict_ms)
    validate.positive("--memory-mib", memory_mib)
    validate.at_least("--iops", iops, 1)
    validate.seed("--seed", seed)
    validate.threads("--threads", threads)
    from engramprof.lab.ranks import MAX_WORKERS

    validate.at_least("--workers", workers, 0, MAX_WORKERS)
    validate.existing_file("--table", table)
    if markers is not None:
        validate.new_or_regular_file("--markers", markers)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    sc = sc_mod.Scenario(
        name, steps=steps, duration=duration, tokens=tokens, gap_ms=gap_ms, rows=rows, table=table,
        markers=markers, keep_markers=True, start_delay=start_delay, keep_running=keep_running,
        reader=reader, threads=threads, seed=seed, evict_ms=evict_ms, memory_mib=memory_mib,
        iops=iops, log=log, workers=workers, faulty_rank=faulty_rank)
    try:
        # Ctrl-C / SIGTERM while setting up: clean up and exit, also when this process was
        # started with SIGINT ignored (a background job of a shell without job control)
        restore_setup_signals = install_stop_handlers(_abort_setup)
        try:
            sc.start()
        finally:
            restore_setup_signals()
        if as_json:
            print(json.dumps({"event": "ready", **sc.info}), flush=True)
        log(f"scenario: ready: reader pid {sc.pid}"
            + ("; Ctrl-C stops it" if keep_running else "; Ctrl-C stops it early"))
        hits = [0]

        def on_signal(signum, frame):  # first: let the reader finish its batch; second: abort
            hits[0] += 1
            if hits[0] > 1:
                raise KeyboardInterrupt
            log("scenario: stopping the reader (again to abort)")
            sc.stop()

        restore_signals = install_stop_handlers(on_signal)
        try:
            summary = sc.wait()
        finally:
            restore_signals()
        evidence = sc.evidence()
    finally:
        sc.close()
    if as_json:
        print(json.dumps({"event": "done", "scenario": name, "pid": sc.pid, "markers": sc.markers_path,
                          "summary": summary, "evidence": evidence}), flush=True)
        return
    from engramprof.report import lab as report

    report.scenario_summary(Console(), name, sc.pid, sc.markers_path, summary, evidence, faulty_rank)


def register(app: typer.Typer) -> None:
    """Attach ``scenario`` to ``lab_app`` (``app`` gets ``lab`` from engramprof.commands.lab)."""
    if any(c.name == "scenario" for c in lab_app.registered_commands):
        return
    lab_app.command("scenario", epilog=SCENARIO_EPILOG)(scenario_cmd)
