"""`engramprof lab`'s reports: the table made (with its progress bar) and the run's summary."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from engramprof.report.render import Col, fit_table
from engramprof.units import mib, ms, pct


@contextlib.contextmanager
def writing(err: Console, name: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on ``err`` while the table is written (transient); yields the callback
    ``progress(done, total)`` for make_table, or None when ``err`` is not a terminal."""
    if not err.is_terminal:
        yield None
        return
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True) as prog:
        task = prog.add_task(f"writing {name}", total=None)

        def progress(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        yield progress


def table_made(out: Console, lay, rows: int, dim: int, layers: str, secs: float) -> None:
    out.print(f"wrote {lay.path}: {lay.size / 2**20:.1f} MiB, {len(lay.tensors)} tensors, "
              f"{rows} rows x dim {dim}, layers {layers}, in {secs:.2f} s")
    t = Table("tensor", "dtype", "shape", "start", "row bytes")
    for ten in lay.tensors:
        t.add_row(ten.name, ten.dtype, "x".join(map(str, ten.shape)), str(ten.start), str(ten.row_bytes))
    out.print(t)


#: what ``calls`` counts for the readers that do not read with preadv2 (engramprof.lab.readers)
CALLS_LABEL = {"uring": "io_uring SQEs", "aio": "AIO iocbs", "read": "read() calls", "direct": "O_DIRECT preadv2"}


def calls_label(reader: str | None) -> str:
    return CALLS_LABEL.get(reader or "", "preadv2 calls")


def run_summary(con: Console, result: dict) -> None:
    """`lab run`'s summary: one row, or one row per rank."""
    if "ranks" in result:
        _print_ranks(con, result)
        return
    bm = result["batch_ms"]
    # "rows read": each job's rows de-duplicated, summed; "distinct rows": over the whole run
    cols = [Col("steps"), Col("rows"), Col("rows read", drop=2), Col("distinct rows"), Col(calls_label(result["reader"])),
            Col("EAGAIN", drop_if_zero=True, drop=3), Col("fallback rows", drop_if_zero=True, drop=1),
            Col("batch p50 ms"), Col("p99 ms")]
    row = [f"{result[k]:,}" for k in ("steps", "rows", "unique_rows", "distinct_rows", "calls", "eagain",
                                      "fallback_rows")] + [ms(bm["p50"]), ms(bm["p99"])]
    con.print(fit_table(con, cols, [row], title=f"lab run: reader {result['reader']}, pid {result['pid']}"))
    if result["nowait_unsupported"]:
        Console(stderr=True).print("lab: RWF_NOWAIT is not supported here; the nowait reader used the pool")


def _print_ranks(con: Console, result: dict) -> None:
    cols = [Col("rank"), Col("pid"), Col("reader", drop=2), Col("steps"), Col("preadv2 calls"),
            Col("EAGAIN", drop_if_zero=True, drop=3), Col("batch p50 ms"), Col("p99 ms")]
    rows = [[str(r["rank"]), str(r["pid"]), r["reader"], f"{r['steps']:,}", f"{r['calls']:,}", f"{r['eagain']:,}",
             ms(r["batch_ms"]["p50"]), ms(r["batch_ms"]["p99"])] for r in result["ranks"]]
    con.print(fit_table(con, cols, rows, title=f"lab run: {result['workers']} ranks of pid {result['pid']}"))


def _fmt_evidence(ev: dict) -> str:
    parts = []
    for k, v in ev.items():
        if k == "table_resident":
            parts.append(f"table resident at end {pct(v)}")
        elif k in ("max_usage_bytes", "limit_bytes"):
            parts.append(f"{k.replace('_bytes', '')} {mib(v)}")
        else:
            parts.append(f"{k} +{v}")
    return ", ".join(parts)


def scenario_summary(out: Console, name: str, pid: int | None, markers: str | None, summary: dict, evidence: dict,
                     faulty_rank: int | None) -> None:
    """`lab scenario`'s end: the reader's run, each rank's, the fault's evidence, the markers."""
    t = Table("steps", "rows", calls_label(summary["reader"]), "EAGAIN", "batch p50 ms", "p99 ms", "max ms",
              title=f"lab scenario {name}: reader {summary['reader']}, pid {pid}")
    bm = summary["batch_ms"]
    t.add_row(str(summary["steps"]), str(summary["rows"]), str(summary["calls"]), str(summary["eagain"]),
              ms(bm["p50"]), ms(bm["p99"]), ms(bm["max"]))
    out.print(t)
    for r in summary.get("ranks") or []:
        fault = "" if faulty_rank is None else (" (faulty)" if r["rank"] == faulty_rank else " (healthy)")
        out.print(f"rank {r['rank']}: pid {r['pid']}, reader {r['reader']}{fault}, batch p50 {ms(r['batch_ms']['p50'])} ms, "
                  f"p99 {ms(r['batch_ms']['p99'])} ms", highlight=False)
    out.print(f"fault evidence: {_fmt_evidence(evidence)}", highlight=False)
    out.print(f"markers: {markers}", highlight=False)
