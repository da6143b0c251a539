"""`engramprof replay TRACE [--strategies pool,nowait,serial,mmap,io_uring,direct] [--cold-frac F] [--rounds N]
[--rows-per-batch K] [--allow-evict] [--json]`."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from engramprof.commands.options import LAYOUT_HELP, use_layout
from engramprof.errors import UserError


def replay(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace bundle written by `engramprof syscalls` / `diagnose`."),
    strategies: str = typer.Option("pool,nowait,serial", "--strategies", metavar="ARMS", help="Comma-separated reader arms: pool, nowait, serial, mmap, mmap-pool, io_uring, direct, aio, read (mmap: the same rows gathered through a numpy.memmap of each file; io_uring: liburing; direct: O_DIRECT preadv from the pool)."),
    cold_frac: float = typer.Option(0.0, "--cold-frac", metavar="FRACTION", help="Fraction of each job's rows that must be cold (not in the page cache) when its arm starts."),
    rounds: int = typer.Option(10, "--rounds", metavar="N", help="Rounds: in each, every arm reads every batch once, arms interleaved, order rotated per round. Medians and 95% intervals are over rounds (6 at least for an interval)."),
    rows_per_batch: Optional[int] = typer.Option(None, "--rows-per-batch", metavar="N", help="Re-batch the trace's distinct rows into batches of K rows (default: the trace's own batches)."),
    allow_evict: bool = typer.Option(False, "--allow-evict", help="With --cold-frac: evict (POSIX_FADV_DONTNEED) the pages of the rows chosen as cold before each timed batch. Drops those pages of the data file from the page cache."),
    threads: int = typer.Option(32, "--threads", metavar="N", help="Pool size of the pool / nowait-fallback readers."),
    batches: int = typer.Option(8, "--batches", metavar="N", help="Replay at most this many of the trace's batches (evenly spaced)."),
    markers: Optional[str] = typer.Option(None, "--markers", metavar="FILE", help="Application batch markers (JSON lines with start_ns/end_ns) for the trace's batch boundaries."),
    gap_ms: Optional[float] = typer.Option(None, "--gap-ms", metavar="MS", help="Without markers: a gap this long with no read in flight starts a new batch (default: chosen from the trace's gaps, as batch-tail does)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the row sampling."),
    layout_file: Optional[str] = typer.Option(None, "--layout", metavar="FILE", help=LAYOUT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    allow_changed: bool = typer.Option(False, "--allow-changed", help="Replay a file that changed since the trace (size, header, first MiB, inode or mtime) with a warning instead of refusing."),
) -> None:
    """Component A/B of reader strategies on the trace's recorded files, offsets and sizes."""
    from engramprof import validate
    from engramprof.lab import replay as rp

    use_layout(layout_file)

    validate.fraction("--cold-frac", cold_frac)
    validate.at_least("--rounds", rounds, 1)
    validate.at_least("--rows-per-batch", rows_per_batch, 1)
    validate.threads("--threads", threads)
    validate.at_least("--batches", batches, 1)
    validate.positive("--gap-ms", gap_ms)
    validate.seed("--seed", seed)
    arms = [s.strip() for s in strategies.split(",") if s.strip()]
    progress = None
    if not as_json and sys.stderr.isatty():
        progress = lambda msg: print(f"\r\033[K{msg}", end="", file=sys.stderr, flush=True)  # noqa: E731
    res = rp.replay(trace, arms, cold_frac=cold_frac, rounds=rounds, rows_per_batch=rows_per_batch,
                    allow_evict=allow_evict, threads=threads, max_batches=batches, markers=markers,
                    gap_ms=gap_ms, seed=seed, progress=progress, allow_changed=allow_changed)
    if progress:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        from engramprof.report import replay as report

        report.render(res)
    if res["mismatches"]:
        bad = ", ".join(f"{a} ({v['mismatched_rows']:,} rows)" for a, v in res["arms"].items() if v["mismatched_rows"])
        raise UserError(f"byte-for-byte check FAILED: {res['mismatches']:,} rows differ from the reference read: {bad}", 1)


def register(app: typer.Typer) -> None:
    app.command("replay", epilog=(
        "Examples:\n\n"
        "engramprof replay /var/tmp/t1 --markers m.jsonl    # pool, nowait, serial\n"
        "engramprof replay /var/tmp/t1 --batches 20 --rounds 12 --json\n"
        "engramprof replay /var/tmp/t1 --strategies pool,io_uring,direct\n"
        "engramprof replay /var/tmp/t1 --cold-frac 0.25 --allow-evict\n\n"
        "A component A/B of the reader alone, not a model result.\n"
        "Page: docs/commands/replay.md"
    ))(replay)
