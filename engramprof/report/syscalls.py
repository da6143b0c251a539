"""Terminal rendering for `engramprof syscalls`: the once-a-second live view and the summary."""
from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from engramprof.bpf import progstats
from engramprof.report.render import Col, fit_table, shorten_left
from engramprof.units import duration, pct


def _fmt_us(v) -> str:
    """A duration given in µs, in the one duration format (engramprof.units.duration)."""
    return duration(None if v is None else v / 1e3)


class LiveView:
    """rich Live on stderr, refreshed by the tracer once a second."""

    def __init__(self, console: Console):
        self.console = console
        self.live = Live(Text("waiting for calls..."), console=console, refresh_per_second=2, transient=False)
        self.t_last = time.monotonic()
        self.faults_last: dict | None = None  # the fault probe's totals at the last update

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def update(self, tracer) -> None:
        now = time.monotonic()
        dt = max(now - self.t_last, 1e-3)
        self.t_last = now
        s = tracer.state
        h = s.window_hist
        totals = tracer.probe.totals() if tracer.probe is not None else {}
        head = Text.assemble(
            ("calls/s ", "bold"), f"{s.window_calls / dt:,.0f}   ",
            ("p50 ", "bold"), _fmt_us(h.quantile(0.5) / 1e3), "  ",
            ("p99 ", "bold"), _fmt_us(h.quantile(0.99) / 1e3), "  ",
            ("max ", "bold"), _fmt_us(h.max_ns / 1e3 if h.n else None), "   ",
            ("EAGAIN ", "bold"), f"{pct(s.window_eagain / s.window_calls if s.window_calls else 0)}  ",
            ("NOWAIT ", "bold"), f"{pct(s.window_nowait / s.window_calls if s.window_calls else 0)}   ",
            ("lost ", "bold"), (f"{totals.get('lost_records', 0):,}", "red" if totals.get("lost_records") else ""),
        )
        parts = [head]
        fline = self._fault_line(tracer, dt)
        if fline is not None:
            parts.append(fline)
        if tracer.sampler is not None and hasattr(tracer.sampler, "status_line"):
            try:
                parts.append(Text(tracer.sampler.status_line(), style="dim"))
            except Exception:
                pass
        files = Table(title="top files by total time", title_justify="left", box=None)
        for col in ("file", "calls", "total", "max", "misses"):
            files.add_column(col, justify="left" if col == "file" else "right")
        for path, f in sorted(s.files.items(), key=lambda kv: -kv[1].total_ns)[:5]:
            files.add_row(_short(path), f"{f.calls:,}", f"{f.total_ns / 1e6:,.1f} ms", _fmt_us(f.max_ns / 1e3), f"{f.misses:,}")
        parts.append(files)
        if s.tensors:
            tens = Table(title="top safetensors tensors by total time", title_justify="left", box=None)
            for col in ("tensor", "calls", "total", "max", "misses"):
                tens.add_column(col, justify="left" if col == "tensor" else "right")
            for name, f in sorted(s.tensors.items(), key=lambda kv: -kv[1].total_ns)[:5]:
                tens.add_row(name, f"{f.calls:,}", f"{f.total_ns / 1e6:,.1f} ms", _fmt_us(f.max_ns / 1e3), f"{f.misses:,}")
            parts.append(tens)
        if s.slowest is not None and len(s.slowest):
            slow = Table(title="slowest calls", title_justify="left", box=None)
            for col in ("dur", "tid", "file", "offset", "tensor/row", "misses", "bio", "offcpu"):
                slow.add_column(col, justify="right" if col not in ("file", "tensor/row") else "left")
            for r in s.slowest.head(5).itertuples():
                slow.add_row(_fmt_us(r.dur_ns / 1e3), str(r.tid), _short(r.path), f"{r.offset:,}",
                             f"{r.tensor}[{r.row}]" if getattr(r, "tensor", "") else "",
                             str(r.pages_added), _fmt_us(r.bio_ns / 1e3), _fmt_us(r.offcpu_ns / 1e3))
            parts.append(slow)
        self.live.update(Group(*parts))


    def _fault_line(self, tracer, dt: float) -> Text | None:
        """Faults beside calls: the page-fault read path (memory-mapped readers), per second."""
        fr = getattr(tracer, "faults", None)
        if fr is None:
            return None
        try:
            t = fr.totals()
        except Exception:
            return None
        last, self.faults_last = self.faults_last or {}, t
        d = {k: t.get(k, 0) - last.get(k, 0) for k in ("faults", "major", "sum_ns")}
        return Text.assemble(
            ("faults/s ", "bold"), f"{d['faults'] / dt:,.0f}   ",
            ("major/s ", "bold"), f"{d['major'] / dt:,.0f}   ",
            ("in faults ", "bold"), f"{d['sum_ns'] / 1e6 / dt:,.1f} ms/s   ",
            ("lost ", "bold"), (f"{t.get('lost_records', 0):,}", "red" if t.get("lost_records") else ""),
        )


def fault_summary_line(f: dict) -> str:
    """The page-fault read path in one line (the summary's "page faults" row)."""
    line = (f"{f.get('faults', 0):,} file-backed ({f.get('major', 0):,} major, {f.get('minor', 0):,} minor"
            + (f", {f['retried']:,} retried" if f.get("retried") else "") + f"), {f.get('sum_ms', 0):,.1f} ms in faults")
    if f.get("async_ra") or f.get("fault_around"):
        line += (f"; minor: {f.get('fault_around', 0):,} served by fault-around, "
                 f"{f.get('async_ra', 0):,} started async readahead")
    if f.get("code_faults"):
        line += f"; {f['code_faults']:,} on the process's own code and libraries (not table reads)"
    if f.get("other_faults") is not None:
        line += f"; {f['other_faults']:,} anonymous/other"
    line += _what_was_missed(f)
    if not f.get("address", True):
        line += "; no fault address (generic path)"
    return line


def uring_summary_line(u: dict) -> str:
    """The io_uring read path in one line (the summary's "io_uring reads" row)."""
    line = (f"{u.get('completed', 0):,} read requests completed of {u.get('submitted', 0):,} submitted "
            f"({u.get('inline', 0):,} inline, {u.get('async', 0):,} async, {u.get('punted', 0):,} punted to io-wq"
            + (f", {u['sqpoll']:,} by SQPOLL" if u.get("sqpoll") else "") + f"), {u.get('sum_ms', 0):,.1f} ms in flight")
    if u.get("nonregular"):
        n = u["nonregular"]
        line += f"; {n:,} read{'s' if n != 1 else ''} of pipes, sockets or procfs left out (not table reads)"
    return line + _what_was_missed(u)


def libaio_summary_line(a: dict) -> str:
    """The libaio read path in one line (the summary's "libaio reads" row)."""
    line = (f"{a.get('reaped', 0):,} read iocbs reaped of {a.get('submitted', 0):,} submitted, "
            f"{a.get('sum_ms', 0):,.1f} ms in flight; {a.get('bios', 0):,} bios")
    return line + _what_was_missed(a)


def _what_was_missed(part: dict) -> str:
    """A read path's records lost, reads not tracked, bios not timed: "" when none."""
    out = ""
    if part.get("lost_records"):
        out += f"; {part['lost_records']:,} records lost"
    if part.get("untracked"):
        out += f"; {part['untracked']:,} not tracked (in-flight map full)"
    if part.get("bios_untracked"):
        out += f"; {part['bios_untracked']:,} bios untracked (no bio time)"
    return out


def _short(path: str, width: int = 48) -> str:
    if not path:
        return "?"
    return path if len(path) <= width else "…" + path[-(width - 1):]


def print_summary(console: Console, s: dict) -> None:
    lat = s["latency_us"]
    what = "read calls and page faults" if s.get("faults") else "read calls"
    t = Table(title=f"{what} of pid {s['pid']} over {s['duration_s']:.1f} s ({s['end_reason']})",
              title_justify="left", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("calls", f"{s['calls']:,} ({s['calls_per_s']:,.0f}/s), recorded {s['recorded']:,}"
              + (f" ({s['partial_at_start']:,} entered while the probes were attaching: not recorded)"
                 if s.get("partial_at_start") else ""))
    if s.get("faults"):  # the second read path, beside the calls
        t.add_row("page faults", fault_summary_line(s["faults"]))
    if s.get("uring"):
        t.add_row("io_uring reads", uring_summary_line(s["uring"]))
    if s.get("libaio"):
        t.add_row("libaio reads", libaio_summary_line(s["libaio"]))
    t.add_row("lost records", Text(f"{s['lost_records']:,}", style="red" if s["lost_records"] else ""))
    skipped = progstats.sentence(s.get("kernel_skipped"))
    if skipped:
        t.add_row("skipped runs", Text(skipped[0].upper() + skipped[1:], style="yellow"))
    if s.get("bios_untracked"):
        t.add_row("untracked bios", Text(f"{s['bios_untracked']:,} queued by calls, counted in bio_count, not timed "
                                         "(the probe's in-flight bio table had their slot taken)", style="yellow"))
    if s.get("unnamed_file_reads"):
        t.add_row("unnamed files", Text(f"{s['unnamed_file_reads']:,} reads of files no scan of the process's open "
                                        "files and mappings named (path empty; dev/ino are the kernel's)", style="yellow"))
    if s.get("nonregular_skipped"):
        t.add_row("not table reads", f"{s['nonregular_skipped']:,} read()/readv() of pipes, sockets, ttys or "
                  "procfs/sysfs files: counted, not traced")
    t.add_row("latency", f"p50 {_fmt_us(lat['p50'])}  p99 {_fmt_us(lat['p99'])}  max {_fmt_us(lat['max'])}"
              + (f"  ({s['latency_source']})" if s["latency_source"] != "records" else ""))
    t.add_row("EAGAIN / NOWAIT", f"{pct(s['eagain_rate'])} of calls returned EAGAIN; {pct(s['nowait_share'])} used RWF_NOWAIT")
    e = s["evidence"]
    t.add_row("misses", f"{e['calls_with_misses']:,} calls inserted {e['pages_added']:,} pages into the page cache")
    t.add_row("in-call time", f"bio {e['bio_ms']:.1f} ms, reclaim {e['reclaim_ms']:.1f} ms, "
              f"off-CPU {e['offcpu_ms']:.1f} ms (run queue {e['runq_ms']:.1f} ms)")
    if s.get("missing_evidence"):
        t.add_row("not measured", ", ".join(s["missing_evidence"]))
    if s.get("output"):
        t.add_row("trace", s["output"])
    console.print(t)
    if s["files"]:
        cols = [Col("file", "left", shrink=True), Col("calls"), Col("total ms"), Col("max"),
                Col("calls w/ misses", drop_if_zero=True), Col("EAGAIN", drop_if_zero=True, drop=1)]
        rows = [[f["path"], f"{f['calls']:,}", f"{f['total_ms']:,.1f}", _fmt_us(f["max_us"]),
                 f"{f['calls_with_misses']:,}", f"{f['eagain']:,}"] for f in s["files"]]
        console.print(fit_table(console, cols, rows, title="files by total time"))
    if s.get("tensors"):
        cols = [Col("tensor", "left"), Col("calls"), Col("total ms"), Col("max"),
                Col("calls w/ misses", drop_if_zero=True, drop=1)]
        rows = [[f["tensor"], f"{f['calls']:,}", f"{f['total_ms']:,.1f}", _fmt_us(f["max_us"]),
                 f"{f['calls_with_misses']:,}"] for f in s["tensors"][:5]]
        console.print(fit_table(console, cols, rows, title="safetensors tensors by total time"))
    if s["slowest"]:
        # the offset, the duration and the in-call evidence stay whole; all-zero evidence
        # columns go first, then the run queue (part of off-CPU), the tid, the reclaim time
        cols = [Col("dur"), Col("tid", drop=3), Col("file", "left", shrink=True, drop=1), Col("offset"),
                Col("size"), Col("misses"), Col("bio", drop_if_zero=True), Col("reclaim", drop_if_zero=True, drop=2),
                Col("off-CPU", drop_if_zero=True), Col("runq", drop_if_zero=True, drop=4)]
        rows = [[_fmt_us(r["dur_us"]), str(r["tid"]), r["path"] or "?", f"{r['offset']:,}", f"{r['size']:,}",
                 str(r["pages_added"]), _fmt_us(r["bio_us"]), _fmt_us(r["reclaim_us"]), _fmt_us(r["offcpu_us"]),
                 _fmt_us(r["runq_us"])] for r in s["slowest"][:5]]
        title = "slowest calls"
        paths = {r[2] for r in rows}
        if len(paths) == 1:  # one file: named once, above the table, and not in every row
            # a line of its own (a table's title wraps at the table's width, cutting the path
            # mid-name); a path longer than the line keeps its end, the file's name
            head = "slowest calls, all in "
            console.print(Text(head + shorten_left(paths.pop(), max(16, console.width - len(head)))), soft_wrap=True)
            title = None
            cols.pop(2)
            rows = [r[:2] + r[3:] for r in rows]
        console.print(fit_table(console, cols, rows, title=title))
    f = s.get("faults")
    u = s.get("uring")
    other_reads = sum((s.get(k) or {}).get("recorded", 0) for k in ("uring", "libaio"))  # io_uring, libaio events
    if f is not None and not s.get("calls") and not f.get("major") and not other_reads:  # nothing read from storage
        parts = [f"{f.get('faults', 0):,} minor file-backed faults (pages already cached: its code and "
                 "libraries, or resident rows)"]
        if f.get("other_faults"):
            parts.append(f"{f['other_faults']:,} anonymous or other faults (counted, not recorded)")
        if u is not None:
            parts.append(f"no io_uring read request completed ({u.get('nonregular', 0):,} of pipes, sockets or "
                         "procfs left out)" if u.get("nonregular") else "no io_uring read request")
        console.print(f"[yellow]note:[/yellow] pid {s['pid']} made no preadv2/preadv/pread64/read/readv call of a file and no major "
                      f"page fault in this window: {'; '.join(parts)}")
    for n in s.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {n}")
