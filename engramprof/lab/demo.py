"""`engramprof demo`: the field report's investigation, end to end, on the built-in workload.

1. doctor: can this machine trace?
2. a small Engram table; the production-shaped 32-thread pool reader on it, fully cached
   (the python-scheduling scenario); `diagnose` it live, with the lab's batch markers;
3. the same workload with the RWF_NOWAIT-first reader (the field report's fix); diagnose again;
4. before/after side by side: batch times, verdicts, the time split, context switches.

Everything it makes (table, markers, traces, cgroups) lives in a private temporary directory
or in the scenarios' own clean-up, and is removed at the end, on Ctrl-C or on failure.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from rich.console import Console

from engramprof.analysis import diagnose
from engramprof.errors import UserError
from engramprof.host import doctor
from engramprof.lab.scenarios import Scenario
from engramprof.lab.table import make_table

DEMO_ROWS = 1 << 17  # 2 layers x 131072 rows x 264 bytes = 66 MiB
DIAGNOSE_S = 10.0


def _arm(console: Console, name: str, reader_label: str, table: str, workdir: str) -> dict:
    console.print(f"\n[bold]{reader_label}[/bold]: starting the lab reader ({name} scenario)...")
    with Scenario(name, table=table, duration=DIAGNOSE_S + 20, markers=os.path.join(workdir, f"{name}.jsonl"),
                  log=lambda m: None) as sc:
        console.print(f"  reader pid {sc.pid}; diagnosing for {DIAGNOSE_S:g} s with its batch markers...")
        d = diagnose.run(sc.pid, duration=DIAGNOSE_S, markers=sc.markers_path,
                         output=os.path.join(workdir, f"trace-{name}"))
        sc.stop()
        lab = sc.wait(timeout=60)
    d["lab"] = lab
    console.print(f"  verdict [bold]{d['verdict']}[/bold] (confidence {d['confidence']:.2f})")
    return d


def run(console: Console | None = None) -> dict:
    console = console or Console()
    console.print("[bold]engramprof demo[/bold]: is a slow Engram reader held back by the SSD, or by Python?")
    report = doctor.run_checks(".")
    if not report.ok:
        for c in report.failed:
            console.print(f"  [red]fail[/red] {c.name}: {c.detail} (fix: {c.fix})")
        raise UserError("this machine cannot trace: fix the failed doctor checks above (`make setup`)", code=1)
    console.print(f"doctor: {sum(c.status == 'pass' for c in report.checks)} checks pass; tracing works here.")
    workdir = tempfile.mkdtemp(prefix="engramprof-demo-")
    try:
        table = os.path.join(workdir, "engram.safetensors")
        make_table(table, rows=DEMO_ROWS)
        console.print(f"made a {os.path.getsize(table) / 2**20:.0f} MiB Engram table (safetensors, 2 layers)")
        before = _arm(console, "python-scheduling", "before: 32-thread pool reader, cached table", table, workdir)
        after = _arm(console, "healthy", "after: RWF_NOWAIT-first reader, same table", table, workdir)
        return {"before": before, "after": after}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
