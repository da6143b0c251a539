"""`engramprof compare --ranks TRACE...` / `compare --before TRACE --after TRACE` (thin; see
engramprof.compare)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from engramprof.errors import UserError

EPILOG = (
    "Examples:\n\n"
    "engramprof compare --ranks r0 r1 r2 r3          # which rank gates each step\n"
    "engramprof compare --ranks r0 r1 --markers m0.jsonl --markers m1.jsonl\n"
    "engramprof compare --ranks h1/t h2/t --clock-error-ms 2 --plot /tmp/r.png\n"
    "engramprof compare --ranks tp     # one trace of 2+ pids: a rank per pid\n"
    "engramprof compare --ranks fleet  # every host=H/rank=R/<bundle> below it\n"
    "engramprof compare --before t_old --after t_new --json | jq .overall\n"
    "engramprof compare --before a1 --before a2 --after b1 --after b2\n\n"
    "--markers: once per TRACE, in order (before traces first). Exit 3:\n"
    "the before/after windows are unmatched (no overall claim).\n"
    "Page: docs/commands/compare.md"
)


def register(app: typer.Typer) -> None:
    @app.command("compare", epilog=EPILOG)
    def compare(
        traces: Optional[List[Path]] = typer.Argument(None, metavar="TRACE...", help="With --ranks: one bundle per rank, or one bundle of several processes (one rank per pid); a directory of bundles (ROOT/host=H/rank=R/<bundle>) stands for every bundle below it, ranked by rank=."),
        ranks: bool = typer.Option(False, "--ranks", help="Compare ranks of one job: which rank gates each step, and why."),
        before: Optional[List[Path]] = typer.Option(None, "--before", metavar="TRACE", help="A bundle of the control / old side, or a directory of bundles (repeat for several)."),
        after: Optional[List[Path]] = typer.Option(None, "--after", metavar="TRACE", help="A bundle of the canary / new side, or a directory of bundles (repeat for several)."),
        markers: Optional[List[Path]] = typer.Option(None, "--markers", metavar="FILE", help="Batch markers, once per TRACE in order (a bundle's own markers.jsonl is used when none are given)."),
        clock_error_ms: Optional[float] = typer.Option(None, "--clock-error-ms", metavar="MS", help="--ranks by clock: the clocks' error to assume (default: from the bundles' NTP state)."),
        slow_ms: float = typer.Option(4.0, "--slow-ms", metavar="MS", help="A call slower than this is 'slow' (batch-tail's threshold)."),
        resamples: int = typer.Option(1000, "--resamples", metavar="N", help="Bootstrap resamples for the confidence intervals."),
        seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the bootstrap."),
        top: int = typer.Option(10, "--top", metavar="N", help="--ranks: steps with the largest excess listed."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
        plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="--ranks: write a PNG heat map, steps x ranks, coloured by cause."),
    ) -> None:
        """Which rank gates each step; or a matched, stratified before/after comparison."""
        from engramprof import compare as cmp
        from engramprof import validate
        from engramprof.extras import require_plot
        from engramprof.report import batch_tail as report

        validate.non_negative("--clock-error-ms", clock_error_ms)
        validate.positive("--slow-ms", slow_ms)
        validate.at_least("--resamples", resamples, 0)
        validate.seed("--seed", seed)
        validate.at_least("--top", top, 1)
        before, after, traces = list(before or []), list(after or []), list(traces or [])
        if ranks and (before or after):
            raise UserError("give either --ranks TRACE... or --before/--after, not both")
        if not ranks and not (before or after):
            raise UserError("give --ranks TRACE... (one bundle per rank) or --before TRACE --after TRACE")
        if not ranks:
            if traces:
                raise UserError(f"{traces[0]}: with --before/--after give each trace its own --before or --after")
            if not before or not after:
                raise UserError("--before and --after each need at least one trace")
            if plot is not None:
                raise UserError("--plot is for --ranks (the steps x ranks heat map)")
            doc = cmp.run_before_after(before, after, markers, slow_ms=slow_ms, resamples=resamples, seed=seed)
            if json_out:
                sys.stdout.write(report.to_json(doc) + "\n")
            else:
                from engramprof.report import compare as render

                render.before_after(doc)
            if not doc["matched"]:
                raise typer.Exit(cmp.EXIT_UNMATCHED)
            return
        if plot is not None:
            require_plot()
            report.check_plot_path(plot)
        doc, arrays = cmp.run_ranks(traces, markers, clock_error_ms=clock_error_ms, slow_ms=slow_ms, top=top)
        if plot is not None:
            from engramprof.report import compare as render

            render.plot(plot, doc, arrays)
            doc["plot"] = str(plot)
        if json_out:
            sys.stdout.write(report.to_json(doc) + "\n")
        else:
            from engramprof.report import compare as render

            render.ranks(doc)
            if plot is not None:
                print(f"plot written to {plot}")
