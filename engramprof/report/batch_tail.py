"""Rendering: rich tables, JSON, PNG plots (batch-tail's rendering lives here).

Every number printed comes from the summary dict / batches DataFrame returned by
:func:`engramprof.analysis.attribution.analyse`, which in turn come from trace columns.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from engramprof.analysis import advice as present
from engramprof.analysis.paths import path_label, read_path_of
from engramprof.analysis.verdicts import CAUSES, col
from engramprof.errors import UserError
from engramprof.jsonable import to_json as _strict_json
from engramprof.report.render import Col, fit_table
from engramprof.report.render import say as render_say
from engramprof.report.codeview import render_code_view
from engramprof.units import duration, ms, pct

CAUSE_COLOURS = {
    "residency": "#d62728",
    "reclaim": "#9467bd",
    "storage": "#ff7f0e",
    "python-scheduling": "#1f77b4",
    "cpu-copy": "#2ca02c",
    "unexplained": "#7f7f7f",
}
CAUSE_STYLE = {
    "residency": "red",
    "reclaim": "magenta",
    "storage": "yellow",
    "python-scheduling": "blue",
    "cpu-copy": "green",
    "unexplained": "dim",
    "healthy": "green",
}


# ------------------------------------------------------------------------------ JSON --

def to_json(summary: dict) -> str:
    """The summary as strict JSON (no NaN/Infinity)."""
    return _strict_json(summary)


# ---------------------------------------------------------------------------- tables --

def _source_line(s: dict) -> str:
    if s["batch_source"] == "markers":
        return "batches from markers"
    if s.get("gap_ms") is None:
        return "one inferred batch (no gap structure found)"
    how = "--gap-ms" if s.get("gap_source") == "user" else "chosen from the trace's gap distribution"
    idle = " and no thread waited for a CPU" if s.get("gap_excludes_runnable") else ""
    return f"batches inferred: split where no read was in flight{idle} for > {duration(s['gap_ms'])} ({how})"


def _cause_evidence(s: dict) -> dict[str, str]:
    ev = s.get("evidence", {})
    out: dict[str, str] = {c: "" for c in CAUSES}
    miss_bits = []
    if ev.get("misses"):
        miss_bits.append(f"{ev['misses']:,} pages inserted")
    if ev.get("calls_with_misses_frac") is not None:
        miss_bits.append(f"{pct(ev.get('calls_with_misses_frac'))} of reads missed")
        if ev.get("slow_calls"):
            miss_bits.append(f"{pct(ev.get('slow_calls_with_misses_frac'))} of slow reads had misses")
    if s.get("direct"):
        miss_bits.append(f"O_DIRECT {pct(s['direct']['share'])} of reads: every one waits for the device")
    if ev.get("runq_wake_share"):
        miss_bits.append(f"of which waiting for a CPU after the miss {pct(ev['runq_wake_share'])}")
    if ev.get("reap_wait_share"):
        miss_bits.append(f"of which requests done at the device, not yet reaped {pct(ev['reap_wait_share'])}")
    out["residency"] = "; ".join(miss_bits)
    rb = []
    if "reclaim_ms" in ev:
        rb.append(f"reclaim inside calls {duration(ev['reclaim_ms'])} ({ev.get('calls_with_reclaim', 0):,} calls)")
    if ev.get("refault_frac_of_misses_est") is not None:
        rb.append(f"refaults ≈ {pct(ev['refault_frac_of_misses_est'])} of misses")
    if ev.get("psi_some_pct", {}).get("memory") is not None:
        rb.append(f"memory PSI some {ev['psi_some_pct']['memory']:.1f}%")
    out["reclaim"] = "; ".join(rb)
    sb = []
    if "bio_ms_per_bio" in ev:
        sb.append(f"bio queue→complete p50 {duration(ev['bio_ms_per_bio']['p50'])} / p99 {duration(ev['bio_ms_per_bio']['p99'])}")
    if ev.get("miss_io_ms"):
        sb.append(f"wait per miss I/O p50 {duration(ev['miss_io_ms']['p50'])} / p99 {duration(ev['miss_io_ms']['p99'])}")
    if s.get("normal_miss_us") is not None:
        sb.append(f"normal {s['normal_miss_us']:.0f} µs")
    if ev.get("psi_some_pct", {}).get("io") is not None:
        sb.append(f"io PSI some {ev['psi_some_pct']['io']:.1f}%")
    out["storage"] = "; ".join(sb)
    pb = []
    if ev.get("no_read_ms"):
        pb.append(f"no read in flight p50 {duration(ev['no_read_ms']['p50'])}/batch")
    if ev.get("runq_preempt_share") is not None:
        pb.append(f"of which run-queue (preempted in calls) {pct(ev['runq_preempt_share'])}")
    if ev.get("ctx_switches_per_batch"):
        pb.append(f"≈{ev['ctx_switches_per_batch']['p50']:.0f} ctx switches/batch" if ev["ctx_switches_per_batch"]["p50"] is not None else "")
    kinds = (s.get("thread_kinds") or {}).get("counts") or {}
    if kinds.get("native") and not kinds.get("python") and not kinds.get("unknown"):
        pb.append(f"no Python thread ({kinds['native']} native)")
    out["python-scheduling"] = "; ".join(x for x in pb if x)
    cb = [f"{ev.get('threads', 0)} reading thread(s)"]
    if ev.get("concurrency_p50") is not None:
        cb.append(f"concurrency p50 {ev['concurrency_p50']:.1f}")
    if ev.get("nowait_calls"):
        cb.append(f"{ev['nowait_calls']:,} RWF_NOWAIT calls ({ev.get('eagain_calls', 0):,} EAGAIN)")
    if ((s.get("native_pool_wait") or {}).get("share") or 0) >= 0.005:
        cb.append(f"of which native threads off their reads {pct(s['native_pool_wait']['share'])} (the "
                  "process's own pool, not Python)")
    out["cpu-copy"] = "; ".join(cb)
    if s.get("missing_evidence"):
        out["unexplained"] = "missing: " + ", ".join(s["missing_evidence"])
    return out


def _slow_evidence(r: pd.Series | dict) -> str:
    g = r.get if isinstance(r, dict) else r.get
    bits = []
    where = g("slowest_path")
    if where is not None and isinstance(where, str) and where:
        where = os.path.basename(where)
        off = g("slowest_offset")
        if off is not None and not (isinstance(off, float) and math.isnan(off)):
            where += f"@{int(off):,}"
        bits.append(where)
    for key, label, unit in (("slowest_misses", "miss", ""), ("slowest_bio_ms", "bio", " ms"),
                             ("slowest_reclaim_ms", "reclaim", " ms"), ("slowest_offcpu_ms", "offcpu", " ms"),
                             ("slowest_runq_ms", "runq", " ms")):
        v = g(key)
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or v == 0:
            continue
        bits.append(f"{label} {int(v)}" if key == "slowest_misses" else f"{label} {ms(float(v))}{unit}")
    return " ".join(bits)


def process_table(console: Console, processes: list[dict] | None, slowest: int | None) -> None:
    """Several processes in the trace: one row each (its own analysis), the slowest marked.
    Nothing for a one-process trace (the report above is that process)."""
    if not processes or len(processes) < 2:
        return
    cols = [Col("pid"), Col("command", "left", shrink=True, min_width=10), Col("batches", drop=2),
            Col("p50 ms"), Col("p99 ms"), Col("verdict", "left", wrap=True, min_width=12)]
    rows = []
    for p in processes:
        share = p.get("share") or {}
        v = p.get("verdict") or "?"
        mark = " (slowest)" if p.get("pid") == slowest else ""
        share_txt = f" {pct(share[v])}" if v in share else ""
        cmd = p.get("cmdline") or p.get("comm") or ""
        rows.append([str(p.get("pid")), cmd, f"{int(p.get('batches') or 0):,}",
                     ms((p.get("batch_ms") or {}).get("p50")), ms((p.get("batch_ms") or {}).get("p99")),
                     Text(v + share_txt + mark, style=CAUSE_STYLE.get(v, ""))])
    console.print(fit_table(console, cols, rows,
                            title=f"Processes ({len(processes)}), each analysed on its own"))


#: the causes that are never a verdict, as the verdict line explains them when one of them
#: has the largest share (a reader told "python-scheduling; largest share: cpu-copy 64%"
#: should not go looking for cpu-copy's cause)
NOT_A_CAUSE = {"cpu-copy": "copying rows already cached: the read's own work, not a cause",
               "unexplained": "time no evidence accounts for, not a cause"}


def read_paths_line(s: dict) -> str:
    """``read paths: pread64 (O_DIRECT) 2,880 (100%); queue depth p50 14, p99 32 (reads in flight
    at once per batch)`` and, for io_uring requests, their inline / async / punted split; "" for a
    summary without them."""
    paths = s.get("read_paths") or []
    if not paths:
        return ""
    line = "read paths: " + "; ".join(f"{path_label(p)} {p['events']:,} ({pct(p['share'])})" for p in paths)
    qd = (s.get("queue_depth") or {}).get("max") or {}
    if qd.get("p50") is not None:
        line += f"; queue depth p50 {qd['p50']:.0f}, p99 {qd['p99']:.0f} (reads in flight at once per batch)"
    u = s.get("io_uring")
    if u:
        sh, sc = u["path_shares"], u["submit_complete_ms"]
        line += (f"; io_uring inline {pct(sh['inline'])}, async {pct(sh['async'])}, punted {pct(sh['punted'])}, "
                 f"submit -> complete p50 {duration(sc['p50'])}")
        dev = u.get("device_ms")
        line += f" vs device p50 >= {duration(dev['p50'])}" if dev else " (device time not measured)"
    if s.get("direct"):
        line += f"; {s['direct']['evidence']}"
    return line


def verdict_line(s: dict) -> Text:
    """``verdict: V — largest share: C N% of batch time[ (what C is)]; tail (...): T``."""
    v = s["verdict"]
    top_cause = max(CAUSES, key=lambda c: s["share"][c])
    line = Text("verdict: ", style="bold")
    line.append(v, style=f"bold {CAUSE_STYLE.get(v, '')}")
    gloss = f" ({NOT_A_CAUSE[top_cause]})" if top_cause in NOT_A_CAUSE else ""
    line.append(f" — largest share: {top_cause} {pct(s['share'][top_cause])} of batch time{gloss}; "
                f"tail (batches > p90 {duration(s['tail_threshold_ms'])}): {s['tail_verdict']}")
    return line


def render(result, console: Console | None = None, top: int = 10) -> None:
    """Rich terminal report: summary sentences, cause shares (all / tail), slowest batches."""
    batches, s = result
    if console is None:  # the terminal's width; piped: COLUMNS, else 80 (never forced wider)
        console = Console(highlight=False)

    def say(line) -> None:  # a sentence: broken between clauses at the console's width
        render_say(console, line)
    say(Text(f"batch-tail: {s['batches']:,} batches, {s['calls_in_batches']:,} of {s['calls']:,} calls — "
                       + _source_line(s), style="bold"))
    say(
        f"{pct(s['frac_batches_with_slow_call'])} of batches had at least one call slower than {s['slow_ms']:g} ms "
        f"(calls p50 {duration(s['call_ms']['p50'])}, p99 {duration(s['call_ms']['p99'])})"
    )
    if s.get("outside_read_path_frac") is not None:
        say(
            f"median batch {duration(s['batch_ms']['p50'])} while reads were in flight for "
            f"{duration(s['inflight_ms']['p50'])}: {pct(s['outside_read_path_frac'])} of batch time is outside "
            f"the kernel read path (summed call time p50 {duration(s['sum_call_ms']['p50'])}; batch p99 "
            f"{duration(s['batch_ms']['p99'])})"
        )
    v = s["verdict"]
    say(verdict_line(s))
    say(Text(present.advice_for(v, read_path_of(s), s).get("hint", "") if v in present.ADVICE else "",
             style="italic"))
    paths = read_paths_line(s)
    if paths:
        say(paths)
    process_table(console, s.get("processes"), s.get("slowest_process"))

    ev = _cause_evidence(s)
    t = Table(title="Where batch time went", title_justify="left")
    t.add_column("cause")
    t.add_column("all batches", justify="right")
    t.add_column(f"tail ({s['tail_batches']:,})", justify="right")
    t.add_column("evidence", overflow="fold")
    for c in CAUSES:
        t.add_row(Text(c, style=CAUSE_STYLE.get(c, "")), pct(s["share"][c]), pct(s["tail_share"][c]), ev.get(c, ""))
    console.print(t)

    if len(batches):
        # what a decision rests on stays whole (batch, wall, in-flight and slowest-call times,
        # the slowest call's file@offset); start time and call count go first when narrow
        cols = [Col("#"), Col("start s", drop=2), Col("wall ms"), Col("in flight"), Col("calls", drop=3),
                Col("slow", drop_if_zero=True, drop=1), Col("misses", drop_if_zero=True), Col("slowest ms"),
                Col("slowest call evidence", "left", wrap=True, min_width=16),
                Col("verdict", "left", wrap=True, min_width=12)]
        rows = []
        for _, r in batches.nlargest(min(top, len(batches)), "wall_ms").iterrows():
            shares = {c: r[f"share_{col(c)}"] for c in CAUSES}
            tc = max(CAUSES, key=lambda c: shares[c])
            verdict = (f"{r['verdict']} {pct(shares[tc])}" if tc == r["verdict"]
                       else f"{r['verdict']} ({tc} {pct(shares[tc])})")
            rows.append([
                str(int(r["batch"])), f"{r['start_s']:.3f}", ms(r["wall_ms"]), ms(r["inflight_ms"]),
                f"{int(r['calls']):,}", f"{int(r['slow_calls']):,}",
                f"{int(r['misses']):,}" if "misses" in r else "-",
                ms(r["slowest_call_ms"]), _slow_evidence(r),
                Text(verdict, style=CAUSE_STYLE.get(r["verdict"], "")),
            ])
        console.print(fit_table(console, cols, rows, title=f"Slowest batches (of {len(batches):,})"))
    sub = s.get("submitter") or {}
    say(Text("submitting thread: " + (f"tid {sub['tid']} ({sub['source']})" if sub.get("tid") is not None
                                                else "none identified: every reading thread is treated as a pool worker"),
                       style="dim"))
    vc = ", ".join(f"{k} {n:,}" for k, n in s["verdict_counts"].items() if n)
    say(f"per-batch verdicts: {vc}")
    if s.get("missing_evidence"):
        say(Text("missing evidence columns: " + ", ".join(s["missing_evidence"]), style="yellow"))
    if s.get("samples_missing"):
        say(Text("samples not available: " + ", ".join(s["samples_missing"]), style="dim"))
    for note in s.get("notes", []):
        say(Text("note: " + note, style="dim"))
    render_code_view(console, s.get("code_view"))  # the stacks: who issues the reads, where the step waits


# ------------------------------------------------------------------------------ plot --

def check_plot_path(path: str | os.PathLike) -> Path:
    """Fail early (before a long analysis) if the plot cannot be created there."""
    p = Path(path)
    if os.path.lexists(p):
        raise UserError(f"{p} already exists; choose a new --plot path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot create {p}: {parent} is not a directory")
    return p


def _open_new(path: Path):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise UserError(f"{path} already exists; choose a new --plot path") from None
    except OSError as exc:
        raise UserError(f"cannot create {path}: {exc.strerror}") from None
    return os.fdopen(fd, "wb")


def _bin_batches(batches: pd.DataFrame, max_points: int = 3000):
    x = batches["start_s"].to_numpy(np.float64)
    ys = {c: batches[f"ms_{col(c)}"].to_numpy(np.float64) for c in CAUSES}
    n = len(x)
    if n <= max_points:
        return x, ys, 1
    k = int(math.ceil(n / max_points))
    m = (n // k) * k
    xb = x[:m].reshape(-1, k).mean(axis=1)
    return xb, {c: v[:m].reshape(-1, k).mean(axis=1) for c, v in ys.items()}, k


def plot(path: str | os.PathLike, calls: pd.DataFrame, result) -> Path:
    """PNG: batch timeline coloured by cause, and call latency vs file offset (row) heatmap.

    The file is created with O_EXCL|O_NOFOLLOW (an existing file or symlink is refused).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm, Normalize

    batches, s = result
    p = Path(path)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 8.5), constrained_layout=True)
    if len(batches):
        x, ys, k = _bin_batches(batches)
        # one stacked bar per batch (or per group of k batches), 80% of the spacing wide
        spacing = np.diff(x)
        width = 0.8 * (np.r_[spacing, spacing[-1]] if len(spacing) else np.array([1e-3]))
        width = np.where(width > 0, width, 1e-6)
        bottom = np.zeros(len(x))
        for c in CAUSES:
            ax1.bar(x, ys[c], width=width, bottom=bottom, align="edge", color=CAUSE_COLOURS[c], label=c,
                    linewidth=0)
            bottom = bottom + ys[c]
        ax1.set_yscale("linear")
        ax1.set_xlabel("batch start (s since the first call)")
        ax1.set_ylabel("batch wall time (ms)" + (f", mean of {k} batches" if k > 1 else ""))
        ax1.axhline(s["tail_threshold_ms"], color="black", linestyle=":", linewidth=0.8, label="p90")
        ax1.legend(loc="upper right", fontsize=8, ncol=4)
    ax1.set_title(f"batch timeline by cause — verdict {s['verdict']} ({s['batches']:,} batches, {s['batch_source']})")

    dur = pd.to_numeric(calls["dur_ns"], errors="coerce").to_numpy(np.float64) / 1e3
    use_row = "row" in calls.columns and (pd.to_numeric(calls["row"], errors="coerce") >= 0).any()
    if use_row:
        xv = pd.to_numeric(calls["row"], errors="coerce").to_numpy(np.float64)
        xlabel = "row (tensor row; calls outside a tensor left out)"
    elif "offset" in calls.columns:
        xv = pd.to_numeric(calls["offset"], errors="coerce").to_numpy(np.float64) / 2**20
        xlabel = "file offset (MiB, all files)"
    else:
        xv = np.zeros(len(dur))
        xlabel = "(no offset column)"
    ok = np.isfinite(dur) & (dur > 0) & np.isfinite(xv) & (xv >= 0)
    if ok.any():
        ly = np.log10(dur[ok])
        lo, hi = float(ly.min()), float(ly.max())
        if hi - lo < 0.5:
            lo, hi = lo - 0.25, hi + 0.25
        xmin, xmax = float(xv[ok].min()), float(xv[ok].max())
        if xmax <= xmin:
            xmax = xmin + 1
        h, xe, ye = np.histogram2d(xv[ok], ly, bins=(200, 80), range=((xmin, xmax), (lo, hi)))
        h = np.where(h > 0, h, np.nan)
        hmax = float(np.nanmax(h))
        norm = LogNorm(vmin=1, vmax=hmax) if hmax >= 20 else Normalize(vmin=0, vmax=max(hmax, 1.0))
        mesh = ax2.pcolormesh(xe, 10 ** ye, h.T, norm=norm, cmap="viridis")
        ax2.set_yscale("log")
        fig.colorbar(mesh, ax=ax2, label="calls")
        ax2.axhline(s["slow_ms"] * 1e3, color="red", linestyle=":", linewidth=0.8, label=f"slow ({s['slow_ms']:g} ms)")
        ax2.legend(loc="upper right", fontsize=8)
    ax2.set_xlabel(xlabel)
    ax2.set_ylabel("call latency (µs)")
    ax2.set_title("call latency against file position")
    with _open_new(p) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return p
