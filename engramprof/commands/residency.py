"""`engramprof residency PATH... [--tensors] [--ranges N] [--rows TRACE] [--json]`."""
from __future__ import annotations

import json
import os
from typing import List, Optional

import typer

from engramprof.commands.options import LAYOUT_HELP, use_layout
from engramprof.errors import UserError


#: --ranges rows printed per tensor unless --ranges-shown says otherwise (--json has them all)
RANGES_SHOWN = 16


def _fmt(v) -> str:
    return "-" if v is None else f"{v:,}"


def _pct(resident: int, pages: int) -> str:
    return f"{100.0 * resident / pages:.1f}%" if pages else "-"


def residency(
    paths: Optional[List[str]] = typer.Argument(None, metavar="PATH...", help="Files to report on (not read: cachestat/mincore only)."),
    tensors: bool = typer.Option(False, "--tensors", help="Also per safetensors tensor."),
    ranges: int = typer.Option(0, "--ranges", metavar="N", help="Also per N row ranges of each tensor (implies --tensors)."),
    rows: Optional[str] = typer.Option(None, "--rows", metavar="TRACE", help="Classify the distinct rows a TRACE read as resident / partly / cold."),
    method: str = typer.Option("auto", "--method", metavar="METHOD", help="auto (cachestat, else mincore) | cachestat | mincore."),
    layout_file: Optional[str] = typer.Option(None, "--layout", metavar="FILE", help=LAYOUT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    ranges_shown: int = typer.Option(RANGES_SHOWN, "--ranges-shown", metavar="N", help="With --ranges: print at most N ranges per tensor, and say how many were left out (0: all; --json has all of them)."),
    allow_changed: bool = typer.Option(False, "--allow-changed", help="With --rows: classify the rows of a file that changed since the trace, with a warning, instead of refusing."),
) -> None:
    """Non-perturbing page-cache residency per file / tensor (never reads a data page)."""
    from engramprof.host import residency as res

    use_layout(layout_file)

    from engramprof import validate

    validate.at_least("--ranges", ranges, 0)
    validate.at_least("--ranges-shown", ranges_shown, 0)
    if not paths and rows is None:
        raise UserError("give at least one PATH, or --rows TRACE")
    if method not in res.METHODS:
        raise UserError(f"--method must be one of {', '.join(res.METHODS)}")
    rows_summary = None
    file_list = [str(p) for p in (paths or [])]
    if rows is not None:
        from engramprof.target import identity
        from engramprof.trace import load_bundle

        trace = load_bundle(rows)
        if not len(trace.calls):  # as batch-tail: nothing to classify is an error, not an empty table
            raise UserError(f"--rows {rows}: the trace has no calls: no rows to classify (was the target reading "
                            "while traced?)")
        traced = sorted(p for p in set(trace.calls["path"]) if p)
        checked = [p for p in traced if not file_list or p in {os.path.realpath(f) for f in file_list} | set(file_list)]
        id_notes = identity.verify(trace, checked, allow_changed)
        from engramprof.analysis.trace_residency import classify_trace_rows

        rows_summary = classify_trace_rows(trace.calls, file_list or None, method)
        rows_summary.notes[:0] = trace.notes + id_notes
        if not file_list:
            file_list = [f["path"] for f in rows_summary.files]
    files = [res.file_residency(p, method, tensors=tensors or ranges > 0, ranges=ranges) for p in file_list]

    if as_json:
        out = {"page_size": res.PAGE_SIZE, "files": [f.to_dict() for f in files],
               "notes": [res.RACE_NOTE]}
        if rows_summary is not None:
            out["rows"] = rows_summary.to_dict()
        print(json.dumps(out, indent=2))
        return
    _print(files, rows_summary, res, ranges_shown)


def _print(files, rows_summary, res, ranges_shown: int = RANGES_SHOWN) -> None:
    from rich.console import Console

    from engramprof.report.render import Col, fit_table, say

    con = Console()  # the terminal's width; piped: COLUMNS, else 80
    if files:
        cols = [Col("path", "left", shrink=True), Col("pages"), Col("resident"), Col("dirty", drop_if_zero=True, drop=3),
                Col("writeback", drop_if_zero=True, drop=4), Col("evicted", drop=2),
                Col("recently evicted", drop_if_zero=True, drop=1), Col("method", "left", drop=5)]
        rows = []
        for f in files:
            r = f.residency
            rows.append([f.path, _fmt(r.pages), f"{_fmt(r.resident)} ({_pct(r.resident, r.pages)})",
                         _fmt(r.dirty), _fmt(r.writeback), _fmt(r.evicted), _fmt(r.recently_evicted), r.method])
        con.print(fit_table(con, cols, rows, title=f"page-cache residency (page size {res.PAGE_SIZE} B)"))
        for f in files:
            if f.tensor_note:
                say(con, f"{f.path}: {f.tensor_note}")
            if not f.tensors:
                continue
            cols = [Col("tensor", "left"), Col("rows"), Col("pages", drop=3), Col("resident"),
                    Col("dirty", drop_if_zero=True, drop=2), Col("evicted", drop_if_zero=True, drop=4),
                    Col("recently evicted", drop_if_zero=True, drop=1)]
            rows, left_out = [], 0
            for tr in f.tensors:
                r = tr.residency
                rows.append([tr.name, _fmt(tr.rows), _fmt(r.pages), f"{_fmt(r.resident)} ({_pct(r.resident, r.pages)})",
                             _fmt(r.dirty), _fmt(r.evicted), _fmt(r.recently_evicted)])
                shown = tr.ranges if not ranges_shown else tr.ranges[:ranges_shown]
                left_out += len(tr.ranges) - len(shown)
                for rg in shown:
                    rows.append([f"  rows {rg['row_start']:,}-{rg['row_end'] - 1:,}", _fmt(rg["row_end"] - rg["row_start"]),
                                 _fmt(rg["pages"]), f"{_fmt(rg['resident'])} ({_pct(rg['resident'], rg['pages'])})",
                                 _fmt(rg["dirty"]), _fmt(rg["evicted"]), _fmt(rg["recently_evicted"])])
            con.print(fit_table(con, cols, rows, title=f"{f.path}: per tensor"))
            if left_out:
                say(con, f"{left_out:,} more row ranges left out (the first {ranges_shown:,} of each tensor are "
                         "shown; --ranges-shown 0 prints all, --json has all)")
    if rows_summary is not None:
        cols = [Col("file / tensor", "left", shrink=True), Col("rows"), Col("resident"), Col("partly"), Col("cold")]
        rows = []
        for f in rows_summary.files:
            rows.append([f["path"], _fmt(f["rows"]), f"{_fmt(f['resident'])} ({_pct(f['resident'], f['rows'])})",
                         _fmt(f["partly"]), f"{_fmt(f['cold'])} ({_pct(f['cold'], f['rows'])})"])
            for tr in f.get("tensors", []):
                rows.append([f"  {tr['tensor']}", _fmt(tr["rows"]), f"{_fmt(tr['resident'])} ({_pct(tr['resident'], tr['rows'])})",
                             _fmt(tr["partly"]), f"{_fmt(tr['cold'])} ({_pct(tr['cold'], tr['rows'])})"])
        con.print(fit_table(con, cols, rows, title="rows of the trace, by residency now (page-granular, not read)"))
        for n in rows_summary.notes:
            say(con, f"note: {n}")
    else:
        say(con, f"note: {res.RACE_NOTE}")


def register(app: typer.Typer) -> None:
    app.command("residency", epilog=(
        "Examples:\n\n"
        "engramprof residency /data/engram.safetensors --tensors --ranges 4\n"
        "engramprof residency --rows /var/tmp/t1      # the trace's rows, now\n"
        "engramprof residency /data/*.safetensors --json\n\n"
        "Never reads a data page: cachestat(2), else mincore(2).\n"
        "Page: docs/commands/residency.md"
    ))(residency)
