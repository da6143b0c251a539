"""`engramprof batch-tail TRACE`: per-batch tail analysis and cause attribution (thin)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("batch-tail", epilog=(
        "Examples:\n\n"
        "engramprof batch-tail /var/tmp/t1             # verdict, causes, slowest\n"
        "engramprof batch-tail /var/tmp/t1 --markers m.jsonl --json | jq .share\n"
        "engramprof batch-tail /var/tmp/t1 --gap-ms 5 --plot /tmp/bt.png\n\n"
        "Verdicts: residency, reclaim, storage, python-scheduling, healthy.\n"
        "Page: docs/commands/batch-tail.md"
    ))
    def batch_tail(
        trace: Path = typer.Argument(..., metavar="TRACE", help="Trace written by `syscalls` / `diagnose` (bundle directory or a per-call Parquet file)."),
        markers: Optional[Path] = typer.Option(None, "--markers", metavar="FILE", help="JSON lines with start_ns/end_ns per batch (CLOCK_MONOTONIC ns)."),
        slow_ms: float = typer.Option(4.0, "--slow-ms", metavar="MS", help="A call slower than this is 'slow'."),
        gap_ms: Optional[float] = typer.Option(None, "--gap-ms", metavar="MS", help="Split inferred batches where no read is in flight for longer than this (default: chosen from the trace)."),
        normal_miss_us: Optional[float] = typer.Option(None, "--normal-miss-us", metavar="US", help="Normal device service per miss I/O (default: the trace's median, at most 1000 µs)."),
        min_share: float = typer.Option(0.25, "--min-share", metavar="SHARE", help="Share of batch time a cause needs to be the verdict (else healthy)."),
        top: int = typer.Option(10, "--top", metavar="N", help="How many of the slowest batches to list."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="Write a PNG: batch timeline by cause, latency vs offset heatmap."),
    ) -> None:
        """Per-batch tail analysis: which cause holds each decode batch back, with evidence."""
        from engramprof.analysis import attribution, batches
        from engramprof import validate
        from engramprof.extras import require_plot
        from engramprof.report import batch_tail as report
        from engramprof.trace import EVENT_READ_COLUMNS, LATER_COLUMNS, load_bundle

        for flag, value in (("--slow-ms", slow_ms), ("--gap-ms", gap_ms), ("--normal-miss-us", normal_miss_us)):
            validate.positive(flag, value)
        validate.share("--min-share", min_share)
        validate.at_least("--top", top, 1)

        if plot is not None:
            require_plot()  # matplotlib is the optional `plot` extra
            report.check_plot_path(plot)
        # the plot draws every event's row: then read with the rest, else only the slowest ones'
        tr = load_bundle(trace, columns=EVENT_READ_COLUMNS, compact=True, later=() if plot is not None else LATER_COLUMNS)
        carried = Path(trace) / "markers.jsonl"
        if markers is None and carried.is_file():  # recorded with diagnose --markers: the bundle carries them
            markers = carried
        mdf, bad = (None, 0)
        if markers is not None:
            mdf, bad = batches.read_markers(markers)
        result = attribution.analyse(tr, mdf, slow_ms=slow_ms, gap_ms=gap_ms, normal_miss_us=normal_miss_us,
                                     meaningful_share=min_share, markers_bad_lines=bad, top=top)
        from engramprof.analysis import prefetch

        result.summary.update(prefetch.json_keys(trace))  # readahead, prefetch: the page-cache probe's samples
        from engramprof.analysis import codeview

        result.summary.update(codeview.json_keys(tr, result.batches, slow_ms, result.summary))  # code_view: the stacks
        if plot is not None:
            report.plot(plot, tr.calls, result)
            result.summary["plot"] = str(plot)
        if json_out:
            sys.stdout.write(report.to_json(result.summary) + "\n")
        else:
            report.render(result, top=top)
            if plot is not None:
                print(f"plot written to {plot}")
