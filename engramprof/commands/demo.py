"""`engramprof demo`: the guided demo on the built-in workload (what `make demo` runs)."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("demo", epilog=(
        "Examples:\n\n"
        "make demo                          # sets the machine up first, then this\n"
        "sudo engramprof demo\n\n"
        "Needs root; takes about a minute; removes what it made.\n"
        "Page: docs/commands/demo.md"
    ))
    def demo_cmd():
        """Build a small Engram table, diagnose the 32-thread pool reader on it live, then the
        RWF_NOWAIT-first reader, and show the two side by side. Needs root; about a minute;
        removes everything it made."""
        from rich.console import Console

        from engramprof.lab import demo
        from engramprof.report import demo as report

        console = Console()
        result = demo.run(console)
        report.side_by_side(console, result["before"], result["after"])
