"""The code view's terminal section (diagnose, batch-tail): who issues the reads, where the step
waits, the GIL waits seen, and the fix at the code's site (engramprof/analysis/codeview.py)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from engramprof.report.render import say
from engramprof.units import duration, pct

TOP_SITES = 3
TOP_WAITS = 4
NATIVE_FRAMES = 3


def _site_line(r: dict) -> str:
    line = f"{r['site']}: {r['reads']:,} reads" + (f" ({pct(r['share'])})" if "share" in r else "") + \
        f", {duration(r['read_ms'])}"
    if r["slow_reads"]:
        line += f"; {r['slow_reads']:,} slow ({duration(r['slow_ms'])})"
    if r["misses"]:
        line += f"; {r['misses']:,} missed ({duration(r['miss_ms'])})"
    if r.get("submitted_from"):
        line += f"; on pool workers submitted from {r['submitted_from']}"
    if r.get("native"):
        line += f"; in native code {_path(r['native']['path'])}"
    return line


def _path(path: str, frames: int = NATIVE_FRAMES) -> str:
    """The innermost native functions of a path (``a < b < c``)."""
    fs = path.split(" < ")
    return " < ".join(fs[:frames]) + (" < ..." if len(fs) > frames else "")


def _native_block(console: Console, sites: list[dict]) -> None:
    if sites:
        _block(console, "native code issuing the reads (a stack copied at the read, by slow-read time):",
               [f"{pct(r['share'])} of {r['stacks']:,} stacks: {_path(r['path'])}" for r in sites[:TOP_SITES]])


def _block(console: Console, head: str, lines: list, indent: int = 2) -> None:
    """``head`` then ``lines``, each wrapping under its own text (a hanging indent)."""
    if head:
        say(console, head)
    if not lines:
        return
    g = Table.grid(padding=(0, 1))
    g.add_column(width=indent, no_wrap=True)
    g.add_column()
    for ln in lines:
        g.add_row("", ln if isinstance(ln, Text) else Text(ln))
    console.print(g)


def render_code_view(console: Console, view: dict | None) -> None:
    """The section, or its one-line note when the trace has no Python stacks."""
    if not view:
        return
    if "step_waits" not in view:
        say(console, Text("code view: " + view.get("note", "no Python stacks"), style="dim"))
        _native_block(console, view.get("native_read_sites") or [])
        return
    st = view["stacks"]
    say(console, Text(f"code view (pid {view['pid']}: {st['rounds']:,} stack rounds, every "
                      f"{duration(st['interval_ms'])}; a sample's window p50 {duration(st['window_ms_p50'])})",
                      style="bold"))
    sites = [r for r in view.get("read_sites") or [] if r["reads"]][:TOP_SITES]
    if sites:
        _block(console, "reads issued at (by slow-read time, miss time, read time):", [_site_line(r) for r in sites])
    if not any(r.get("native") for r in sites):
        _native_block(console, view.get("native_read_sites") or [])
    step = view.get("step_thread")
    if step:
        _block(console, f"the step thread ({step['name'] or step['tid']}, tid {step['tid']}) spent its step time:",
               [f"{pct(w['share'])} {w['state']} at {w['site']}" + (f" (in {w['via']})" if w.get("via") else "")
                for w in view["step_waits"][:TOP_WAITS]])
    ps = view.get("python_scheduling") or {}
    more = []
    if ps.get("step_thread_gil_wait_share") is not None:
        more.append(f"GIL waits seen in batches: step thread {pct(ps['step_thread_gil_wait_share'])} of step time "
                    f"({duration(ps['step_thread_gil_wait_ms'])}); pool workers {duration(ps['workers_gil_wait_ms'])}; "
                    f"executor submit / complete {duration(ps['executor_ms'])}")
    if ps.get("split_ms") is not None:
        more.append(f"of the {duration(ps['split_ms'])} the split calls python-scheduling, the samples saw "
                    f"{duration(ps['seen_gil_and_executor_ms'])} as the step's GIL waits and executor time; "
                    f"the residual {duration(ps['residual_ms'])} is waits on the pool (wake-ups, workers) and "
                    "other threads")
    if view.get("fix"):
        more.append(Text("at the code: " + view["fix"]))
    if view.get("note"):
        more.append(Text("note: " + view["note"], style="dim"))
    _block(console, "", more, indent=0)
