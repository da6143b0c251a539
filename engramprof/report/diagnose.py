"""`engramprof diagnose`'s terminal report: the verdict, its evidence chain, the fix to try."""
from __future__ import annotations

import sys

from rich.table import Table
from rich.text import Text

from engramprof.report.batch_tail import process_table
from engramprof.report.codeview import render_code_view
from engramprof.units import pct


def render(console, d: dict) -> None:
    v = d["verdict"]
    head = f"[bold]verdict: {v}[/bold] (confidence {d['confidence']:.2f}"
    if d.get("verdict_share") is not None:
        head += f", {pct(d['verdict_share'])} of batch time"
    head += ")"
    if d.get("runner_up"):
        head += f"; runner-up: {d['runner_up']} ({pct(d['runner_up_share'])})"
    console.print(head)
    t = Table(title="evidence", title_justify="left", show_header=False, box=None)
    t.add_column(justify="right", style="dim")
    t.add_column(style="bold")
    t.add_column()
    for i, e in enumerate(d["evidence"], 1):
        t.add_row(str(i), Text(e["step"]), Text(e["finding"]))
    console.print(t)
    process_table(console, d.get("processes"), d.get("slowest_process"))
    render_code_view(console, d.get("code_view"))  # who issues the reads, where the step waits
    console.print("[bold]what this cannot prove[/bold]")
    # hanging indents: a wrapped line continues under its own text, not at column 0
    limits = Table.grid(padding=(0, 1))
    limits.add_column(justify="right")
    limits.add_column()
    for line in d["limits"]:
        limits.add_row("  -", Text(line))
    console.print(limits)
    advice = Table.grid(padding=(0, 1))
    advice.add_column(style="bold", no_wrap=True)
    advice.add_column()
    advice.add_row("fix to try:", Text(d["recommendation"]["fix"]))
    advice.add_row("confirm with:", Text(d["recommendation"]["confirm"]))
    console.print(advice)
    if d.get("output"):
        console.print(f"trace kept in {d['output']}", soft_wrap=True)
    notes = Table.grid(padding=(0, 1))
    notes.add_column(style="yellow", no_wrap=True)
    notes.add_column()
    for n in d["batch_tail"].get("notes", []):
        notes.add_row("note:", Text(n))
    if notes.row_count:
        console.print(notes)
    sys.stdout.flush()
