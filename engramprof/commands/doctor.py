"""`engramprof doctor [--json] [--path DIR]`: can this machine trace?"""
from __future__ import annotations

import os
from pathlib import Path

import typer

from engramprof.errors import UserError
from engramprof.host import doctor as doc

def register(app: typer.Typer) -> None:
    @app.command("doctor", epilog=(
        "Examples:\n\n"
        "engramprof doctor                          # one row per check, with fixes\n"
        "engramprof doctor --path /data/tables      # RWF_NOWAIT on the tables' fs\n"
        "engramprof doctor --json | jq .ok\n\n"
        "Exit 0: syscalls can run here; 1: a check failed; 2: bad arguments.\n"
        "Page: docs/commands/doctor.md"
    ))
    def doctor(
        json_out: bool = typer.Option(False, "--json", help='Print {"ok": bool, "read_paths": [..], "checks": [{name, status, detail, fix}]}.'),
        path: Path = typer.Option(
            Path("."), "--path", metavar="DIR", show_default="current directory",
            help="Directory on the tables' filesystem: RWF_NOWAIT and cachestat are tried on a temporary "
                 "file of the doctor's own there."),
    ) -> None:
        """Can this machine trace? One row per check with a fix; exit 0 only when `syscalls` can run."""
        if not path.exists():
            raise UserError(f"--path {path}: no such file or directory", code=2)
        if not path.is_dir():  # the checks make a file of their own in it: a file is a mistake
            raise UserError(f"--path {path}: not a directory (give a directory on the tables' filesystem)", code=2)
        directory = path
        if not os.access(directory, os.X_OK):
            raise UserError(f"--path {directory}: not accessible", code=2)
        report = doc.run_checks(directory)
        if json_out:
            typer.echo(report.to_json())
        else:
            from engramprof.report import doctor as reporter

            reporter.render(report)
        raise typer.Exit(0 if report.ok else 1)
