"""`engramprof doctor`'s report: one row per check with its fix, then the verdict line."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from engramprof.host import doctor as doc

_STYLE = {doc.PASS: "green", doc.INFO: "blue", doc.WARN: "yellow", doc.FAIL: "bold red"}


def render(report: doc.Report) -> None:
    console = Console()
    table = Table(title="engramprof doctor")
    table.add_column("status", no_wrap=True, min_width=6)
    longest_word = max((len(w) for c in report.checks for w in c.name.split()), default=10)
    table.add_column("check", style="bold", overflow="fold", width=max(12, min(longest_word, 30)))
    table.add_column("detail / fix", overflow="fold")
    for c in report.checks:
        cell = Text(c.detail)
        if c.fix:
            cell.append("\nfix: ", style="bold")
            cell.append(c.fix)
        table.add_row(Text(c.status, style=_STYLE[c.status]), c.name, cell)
    console.print(table)
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in doc.STATUSES}
    tally = ", ".join(f"{counts[s]} {s}" for s in doc.STATUSES if counts[s])
    if report.ok:
        names = {"syscalls": "syscalls", "faults": "page faults (memory-mapped readers)",
                 "io_uring": "io_uring", "libaio": "libaio"}
        paths = ", ".join(names[p] for p in report.read_paths)
        console.print(f"[green]OK[/]: engramprof syscalls can run here ({tally}); read paths: {paths}.")
    else:
        names = ", ".join(c.name for c in report.failed)
        console.print(f"[bold red]NOT OK[/]: engramprof syscalls cannot run here ({tally}); fix: {names}.")
