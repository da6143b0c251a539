"""`engramprof residency PATH... [--tensors] [--ranges N] [--rows TRACE] [--json]`."""
from __future__ import annotations

import os
from typing import List, Optional

import typer

from engramprof.commands.options import LAYOUT_HELP, use_layout
from engramprof.errors import UserError


#: --ranges rows printed per tensor unless --ranges-shown says otherwise (--json has them all)
RANGES_SHOWN = 16


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

    from engramprof.report import residency as report

    if as_json:
        print(report.to_json(files, rows_summary))
        return
    report.render(files, rows_summary, ranges_shown)


def register(app: typer.Typer) -> None:
    app.command("residency", epilog=(
        "Examples:\n\n"
        "engramprof residency /data/engram.safetensors --tensors --ranges 4\n"
        "engramprof residency --rows /var/tmp/t1      # the trace's rows, now\n"
        "engramprof residency /data/*.safetensors --json\n\n"
        "Never reads a data page: cachestat(2), else mincore(2).\n"
        "Page: docs/commands/residency.md"
    ))(residency)
