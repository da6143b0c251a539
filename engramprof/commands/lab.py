"""`engramprof lab ...`: the built-in Engram-shaped table and workload (thin; see engramprof.lab)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from engramprof.commands.options import duration_option
from engramprof.errors import UserError
from engramprof.lab.readers import READERS

lab_app = typer.Typer(
    help="Built-in Engram-shaped workload: make a table on disk, read it like a model server.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
)

MAKE_TABLE_EPILOG = """Examples:

engramprof lab make-table /var/tmp/engram.safetensors      # 264 MiB
engramprof lab make-table /var/tmp/small.safetensors --rows 65536
engramprof lab make-table /var/tmp/big.safetensors --rows 4194304 --force

Page: docs/commands/lab.md
"""

RUN_EPILOG = """Examples:

engramprof lab run --table T --warm --reader pool --steps 500
engramprof lab run --table T --reader nowait --tokens 4096 --steps 5 --json
engramprof lab run --table T --duration 30 --gap-ms 20 --markers m.jsonl
engramprof lab run --table T --reader mmap --cold --no-random --steps 20
engramprof lab run --table T --reader mmap --prefetch willneed --gap-ms 20
engramprof lab run --table T --workers 2 --markers m.jsonl  # 2 ranks

T is a table made by `lab make-table`. Page: docs/commands/lab.md
"""


def _parse_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--layers must be comma-separated integers, got {text!r}") from None


@lab_app.command("make-table", epilog=MAKE_TABLE_EPILOG)
def make_table_cmd(
    path: Path = typer.Argument(..., metavar="FILE", help="safetensors file to create"),
    rows: int = typer.Option(1 << 19, "--rows", metavar="N", help="rows per tensor (524288: 264 MiB with 2 layers, dim 256)"),
    dim: int = typer.Option(256, "--dim", metavar="N", help="F8_E4M3 weights per row (a multiple of 32)"),
    layers: str = typer.Option("3,17", "--layers", metavar="N,N", help="Engram layer numbers, comma-separated"),
    force: bool = typer.Option(False, "--force", help="replace FILE if it exists"),
    seed: Optional[int] = typer.Option(None, "--seed", metavar="N", help="random seed for the contents"),
) -> None:
    """Write a safetensors Engram table (weight F8_E4M3 + scale U8 per layer) of random bytes."""
    from engramprof import validate
    from engramprof.lab import table
    from engramprof.report import lab as report

    validate.at_least("--rows", rows, 1)
    if dim < table.SCALE_BLOCK or dim % table.SCALE_BLOCK:
        raise validate.bad_number("--dim", f"a positive multiple of {table.SCALE_BLOCK}", dim)
    layer_list = _parse_layers(layers)
    if not layer_list or len(set(layer_list)) != len(layer_list) or min(layer_list) < 0:
        raise UserError(f"--layers must be distinct non-negative integers, e.g. 3,17 (got {layers!r})")
    validate.seed("--seed", seed)
    err = Console(stderr=True)
    t0 = time.monotonic()
    try:
        # every refusal (exists, a directory, no room) before the progress bar: one clean line
        table.check_can_create(path, rows, dim, layer_list, force=force)
        with report.writing(err, path.name) as progress:
            lay = table.make_table(path, rows, dim, layer_list, force=force, seed=seed, progress=progress)
    except table.TableExistsError as exc:
        raise UserError(f"{exc.path} already exists (use --force to replace it)") from None
    report.table_made(Console(), lay, rows, dim, layers, time.monotonic() - t0)


@lab_app.command("run", epilog=RUN_EPILOG)
def run_cmd(
    table_path: Path = typer.Option(..., "--table", metavar="FILE", help="table made by `lab make-table`"),
    reader: str = typer.Option("pool", "--reader", metavar="READER", help=" | ".join(READERS)),
    steps: Optional[int] = typer.Option(None, "--steps", metavar="N", help="batches to run (default 200, or unlimited with --duration)"),
    duration: Optional[float] = duration_option(None, "stop after SECONDS"),
    tokens: int = typer.Option(4, "--tokens", metavar="N", help="tokens per step: a few = decode, thousands = prefill"),
    heads: int = typer.Option(6, "--heads", metavar="N", help="hash heads per token (rows per token per job)"),
    gap_ms: float = typer.Option(0.0, "--gap-ms", metavar="MS", help="sleep between steps (stand-in for the GPU forward pass)"),
    zipf: float = typer.Option(1.1, "--zipf", metavar="EXPONENT", help="Zipf exponent of token popularity (0 = uniform)"),
    markers: Optional[Path] = typer.Option(None, "--markers", metavar="FILE", help="write one JSON line per batch here"),
    cache: Optional[bool] = typer.Option(None, "--warm/--cold", help="read the table once first / evict it first"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="seed of the row plan"),
    start_delay: float = typer.Option(0.0, "--start-delay", metavar="SECONDS", help="sleep SECONDS before the first step (attach a tracer); SIGUSR1 ends the wait early"),
    threads: int = typer.Option(32, "--threads", metavar="N", help="pool threads"),
    random: bool = typer.Option(True, "--random/--no-random", help="POSIX_FADV_RANDOM / MADV_RANDOM on the table; --no-random leaves readahead on"),
    prefetch: Optional[str] = typer.Option(None, "--prefetch", metavar="HINT", help="willneed: hint each step's rows with WILLNEED --prefetch-lead steps before reading them"),
    prefetch_lead: int = typer.Option(1, "--prefetch-lead", metavar="N", help="steps between a batch's WILLNEED hint and its read (0: just before the read)"),
    workers: int = typer.Option(0, "--workers", metavar="N", help="fork N rank processes, each reading its own shard of the table (or its --rank-table); markers carry pid and rank"),
    rank_table: Optional[list[str]] = typer.Option(None, "--rank-table", metavar="RANK:FILE", help="RANK:PATH: that rank reads its own table (whole) instead of its shard; repeatable"),
    rank_reader: Optional[list[str]] = typer.Option(None, "--rank-reader", metavar="RANK:READER", help="RANK:READER: that rank's reader; repeatable"),
    rank_cache: Optional[list[str]] = typer.Option(None, "--rank-cache", metavar="RANK:CACHE", help="RANK:warm|cold: that rank's cache preparation; repeatable"),
    rank_join: Optional[list[str]] = typer.Option(None, "--rank-join", metavar="RANK:FILE", help="RANK:CGROUP_PROCS: that rank joins this cgroup (its cgroup.procs file) before anything else; repeatable"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Read Engram rows like a model server: one batch of 2 jobs per layer per step."""
    from engramprof import validate
    from engramprof.lab import readers

    if reader not in readers.READERS:
        raise UserError(f"--reader must be one of {', '.join(readers.READERS)}, not {reader!r}")
    validate.at_least("--steps", steps, 1)
    validate.duration("--duration", duration)
    validate.at_least("--tokens", tokens, 1)
    validate.at_least("--heads", heads, 1)
    validate.non_negative("--gap-ms", gap_ms)
    validate.non_negative("--zipf", zipf)
    validate.seed("--seed", seed)
    validate.non_negative("--start-delay", start_delay)
    validate.threads("--threads", threads)
    validate.existing_file("--table", table_path)
    if markers is not None:
        validate.new_or_regular_file("--markers", markers)
    if prefetch is not None and prefetch != "willneed":
        raise UserError(f"--prefetch must be willneed, not {prefetch!r}")
    validate.at_least("--prefetch-lead", prefetch_lead, 0)
    from engramprof.tables import safetensors as layout

    layout.load(table_path)  # not a safetensors table: one line, before the pid line
    rank_plans = _rank_plans(workers, table_path, reader, cache, rank_table, rank_reader, rank_cache, rank_join)
    # a reader that cannot run here (tmpfs for O_DIRECT, io_uring disabled): one line, before the pid line
    for tbl, rdr in sorted({(str(table_path), reader)} if rank_plans is None else {(p.table, p.reader) for p in rank_plans}):
        try:
            readers.check_reader(rdr, tbl)
        except readers.ReaderUnavailable as exc:
            raise UserError(str(exc), exc.code) from None
    from engramprof.lab import run as lab_run

    result = lab_run.run(table_path, reader, rank_plans, steps=steps, duration=duration, tokens=tokens, heads=heads,
                         gap_ms=gap_ms, zipf=zipf, seed=seed, markers=markers, cache=cache, start_delay=start_delay,
                         threads=threads, random=random, prefetch=prefetch, prefetch_lead=prefetch_lead)
    if as_json:
        print(json.dumps(result))
        return
    from engramprof.report import lab as report

    report.run_summary(Console(), result)


def _rank_plans(workers, table_path, reader, cache, rank_table, rank_reader, rank_cache, rank_join):
    """--workers N and the per-rank options: the ranks' plans, or None (one process)."""
    from engramprof import validate
    from engramprof.lab import ranks, readers

    given = [o for o, v in (("--rank-table", rank_table), ("--rank-reader", rank_reader),
                            ("--rank-cache", rank_cache), ("--rank-join", rank_join)) if v]
    if not workers:
        if given:
            raise UserError(f"{given[0]} needs --workers")
        return None
    validate.at_least("--workers", workers, 1, ranks.MAX_WORKERS)

    def check_reader(v):
        if v not in readers.READERS:
            raise UserError(f"--rank-reader: the reader must be one of {', '.join(readers.READERS)}, not {v!r}")

    def check_cache(v):
        if v not in ("warm", "cold"):
            raise UserError(f"--rank-cache: warm or cold, not {v!r}")

    def check_table(v):
        validate.existing_file("--rank-table", Path(v))
        from engramprof.tables import safetensors as layout

        layout.load(v)

    def check_join(v):
        if os.path.basename(v) != "cgroup.procs" or not os.path.isfile(v):
            raise UserError(f"--rank-join: {v} is not a cgroup's cgroup.procs file")

    tables = ranks.parse_rank_options(workers, rank_table, "--rank-table", check_table)
    rdrs = ranks.parse_rank_options(workers, rank_reader, "--rank-reader", check_reader)
    caches = ranks.parse_rank_options(workers, rank_cache, "--rank-cache", check_cache)
    joins: dict[int, list[str]] = {}
    for v in rank_join or ():
        for r, procs in ranks.parse_rank_options(workers, [v], "--rank-join", check_join).items():
            joins.setdefault(r, []).append(procs)
    return ranks.plans(workers, str(table_path), reader, None if cache is None else ("warm" if cache else "cold"),
                       tables, rdrs, caches, joins)


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
