"""`engramprof residency`'s report: files, tensors and row ranges by page-cache residency."""
from __future__ import annotations

import json

from rich.console import Console

from engramprof.host import residency as res
from engramprof.report.render import Col, fit_table, say
from engramprof.units import count, pct


def _share(part: int, whole: int) -> str:
    """part of whole in the one percent format (engramprof.units.pct); nothing of nothing: -."""
    return pct(part / whole) if whole else "-"


def to_json(files, rows_summary) -> str:
    out = {"page_size": res.PAGE_SIZE, "files": [f.to_dict() for f in files],
           "notes": [res.RACE_NOTE]}
    if rows_summary is not None:
        out["rows"] = rows_summary.to_dict()
    return json.dumps(out, indent=2)


#: --ranges rows printed per tensor unless --ranges-shown says otherwise (--json has them all)
RANGES_SHOWN = 16


def render(files, rows_summary, ranges_shown: int = RANGES_SHOWN) -> None:
    """The files' (and tensors', ranges') residency, and the trace's rows by residency now;
    at most ``ranges_shown`` row ranges a tensor (0: all), with a line for those left out."""
    con = Console()  # the terminal's width; piped: COLUMNS, else 80
    if files:
        cols = [Col("path", "left", shrink=True), Col("pages"), Col("resident"), Col("dirty", drop_if_zero=True, drop=3),
                Col("writeback", drop_if_zero=True, drop=4), Col("evicted", drop=2),
                Col("recently evicted", drop_if_zero=True, drop=1), Col("method", "left", drop=5)]
        rows = []
        for f in files:
            r = f.residency
            rows.append([f.path, count(r.pages), f"{count(r.resident)} ({_share(r.resident, r.pages)})",
                         count(r.dirty), count(r.writeback), count(r.evicted), count(r.recently_evicted), r.method])
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
                rows.append([tr.name, count(tr.rows), count(r.pages), f"{count(r.resident)} ({_share(r.resident, r.pages)})",
                             count(r.dirty), count(r.evicted), count(r.recently_evicted)])
                shown = tr.ranges if not ranges_shown else tr.ranges[:ranges_shown]
                left_out += len(tr.ranges) - len(shown)
                for rg in shown:
                    rows.append([f"  rows {rg['row_start']:,}-{rg['row_end'] - 1:,}", count(rg["row_end"] - rg["row_start"]),
                                 count(rg["pages"]), f"{count(rg['resident'])} ({_share(rg['resident'], rg['pages'])})",
                                 count(rg["dirty"]), count(rg["evicted"]), count(rg["recently_evicted"])])
            con.print(fit_table(con, cols, rows, title=f"{f.path}: per tensor"))
            if left_out:
                say(con, f"{left_out:,} more row ranges left out (the first {ranges_shown:,} of each tensor are "
                         "shown; --ranges-shown 0 prints all, --json has all)")
    if rows_summary is not None:
        cols = [Col("file / tensor", "left", shrink=True), Col("rows"), Col("resident"), Col("partly"), Col("cold")]
        rows = []
        for f in rows_summary.files:
            rows.append([f["path"], count(f["rows"]), f"{count(f['resident'])} ({_share(f['resident'], f['rows'])})",
                         count(f["partly"]), f"{count(f['cold'])} ({_share(f['cold'], f['rows'])})"])
            for tr in f.get("tensors", []):
                rows.append([f"  {tr['tensor']}", count(tr["rows"]), f"{count(tr['resident'])} ({_share(tr['resident'], tr['rows'])})",
                             count(tr["partly"]), f"{count(tr['cold'])} ({_share(tr['cold'], tr['rows'])})"])
        con.print(fit_table(con, cols, rows, title="rows of the trace, by residency now (page-granular, not read)"))
        for n in rows_summary.notes:
            say(con, f"note: {n}")
    else:
        say(con, f"note: {res.RACE_NOTE}")
