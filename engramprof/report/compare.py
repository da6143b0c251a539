"""compare's rich tables (readable at 80 columns) and its heat map."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.text import Text

from engramprof.analysis.verdicts import CAUSES
from engramprof.report.batch_tail import CAUSE_COLOURS, _open_new
from engramprof.report.render import Col, fit_table, say
from engramprof.units import ms, pct


def _say(con: Console, text: str, style: str | None = None) -> None:
    """A sentence at the console's width, broken between clauses (engramprof.report.render.say)."""
    say(con, Text(text, style=style or ""))


def _short(path: str, keep: int = 28) -> str:
    p = Path(path)
    s = str(p) if len(str(p)) <= keep else "…/" + "/".join(p.parts[-2:])
    return s if len(s) <= keep else "…" + s[-(keep - 1):]


def ranks(doc: dict, con: Console | None = None) -> None:
    con = con or Console()
    err = "" if doc["alignment"] == "step-id" else f"±{ms(doc['alignment_error_ms'])} ms: "
    _say(con, f"{len(doc['ranks'])} ranks, {doc['steps']:,} steps aligned by {doc['alignment']} ({err}"
              f"{doc['alignment_error_source']})")
    g = next((r for r in doc["ranks"] if r["rank"] == doc["gating_rank"]), None)
    if g is not None:
        where = _short(g["trace"], 40) + (f", pid {g['pid']}" if g.get("pid") is not None and
                                           sum(r["trace"] == g["trace"] for r in doc["ranks"]) > 1 else "")
        if g.get("host") and len({r.get("host") for r in doc["ranks"]}) > 1:
            where = f"host {g['host']}, {where}"
        _say(con, f"gating rank: {g['rank']} ({where}) was the slowest in {pct(g['gated_share'])} of "
                  f"steps, {ms(g['excess_ms'])} ms over the median rank, mostly {g['top_cause'] or '-'}",
             style="bold")
    else:
        _say(con, "no rank gates: the ranks are even (no rank was slower than the median rank in any step)",
             style="bold")
    _say(con, f"step time lost to stragglers (sum of slowest minus median rank): "
              f"{ms(doc['lost_to_stragglers_ms'])} ms; step p50 {ms(doc['step_ms']['p50'])} ms vs median "
              f"rank p50 {ms(doc['median_rank_ms']['p50'])} ms")
    cols = [Col("rank"), Col("trace", justify="left", shrink=True), Col("gated"), Col("excess ms"),
            Col("top cause", justify="left"), Col("p50 ms", drop=2), Col("p99 ms", drop=1)]
    shared = {t for t in (r["trace"] for r in doc["ranks"]) if sum(x["trace"] == t for x in doc["ranks"]) > 1}
    rows = [[str(r["rank"]), r["trace"] + (f" pid {r['pid']}" if r["trace"] in shared and r.get("pid") is not None else ""),
             pct(r['gated_share']), ms(r["excess_ms"]), r["top_cause"] or "-",
             ms(r["batch_ms"]["p50"]), ms(r["batch_ms"]["p99"])] for r in doc["ranks"]]
    if len({r.get("host") for r in doc["ranks"]}) > 1:  # ranks on several hosts: say which
        cols.insert(1, Col("host", justify="left", min_width=4))
        for row, r in zip(rows, doc["ranks"]):
            row.insert(1, r.get("host") or "-")
    con.print(fit_table(con, cols, rows, title="per rank: share of steps gated, time over the median rank"))
    if doc["worst_steps"]:
        cols = [Col("step"), Col("slowest rank"), Col("step ms"), Col("median ms"), Col("excess ms"),
                Col("cause of excess", justify="left")]
        rows = [[str(s["step"]), str(s["gating_rank"]), ms(s["step_ms"]), ms(s["median_ms"]),
                 ms(s["excess_ms"]), s["cause"] or "-"] for s in doc["worst_steps"]]
        con.print(fit_table(con, cols, rows, title="steps with the largest excess"))
    for w in doc["warnings"]:
        _say(con, f"warning: {w}", style="yellow")
    for n in doc["notes"]:
        _say(con, f"note: {n}")


def _ci(ci) -> str:
    return "-" if not ci or ci[0] is None else f"{ci[0]:.3g}-{ci[1]:.3g}"


def before_after(doc: dict, con: Console | None = None) -> None:
    con = con or Console()
    b, a = doc["before"], doc["after"]
    _say(con, f"before: {b['batches']:,} batches in {len(b['traces'])} trace(s), {b['window_s']:.3g} s; "
              f"after: {a['batches']:,} batches in {len(a['traces'])} trace(s), {a['window_s']:.3g} s")
    cols = [Col("stratum", justify="left", wrap=True, min_width=14), Col("n before"), Col("n after"),
            Col("p50 ms before"), Col("p50 ms after"), Col("ratio"), Col("95% CI"),
            Col("p99 ratio", drop=1)]
    rows = []
    for s in doc["strata"] + ([doc["overall"]] if doc["overall"] else []):
        rows.append(["overall (common mix)" if s is doc["overall"] else s["stratum"], f"{s['before_batches']:,}", f"{s['after_batches']:,}",
                     ms(s["p50_ms_before"]), ms(s["p50_ms_after"]),
                     "-" if s["ratio"] is None else f"{s['ratio']:.2f}", _ci(s["ci"]),
                     "-" if s["p99_ratio"] is None else f"{s['p99_ratio']:.2f}"])
    if rows:
        con.print(fit_table(con, cols, rows, title="batch time p50 per stratum on both sides; ratio: after / before"))
    else:
        _say(con, "no stratum is on both sides")
    for d in doc["dropped"]:
        _say(con, f"dropped: {d['stratum']}: {d['before_batches']:,} before ({pct(d['before_time_share'])} of its time),"
                  f" {d['after_batches']:,} after ({pct(d['after_time_share'])})")
    if doc["matched"]:
        o = doc["overall"]
        lo, hi = (o["ci"] or [None, None])
        verdict = ("faster after" if hi is not None and hi < 1 else
                   "slower after" if lo is not None and lo > 1 else "no difference shown")
        _say(con, f"matched: overall p50 {ms(o['p50_ms_before'])} -> {ms(o['p50_ms_after'])} ms, "
                  f"ratio {o['ratio']:.2f} (95% CI {_ci(o['ci'])}): {verdict}, over the shared strata at one "
                  "common mix", style="bold")
    else:
        _say(con, f"unmatched: {doc['reason']}", style="bold red")
    for w in doc["warnings"]:
        _say(con, f"warning: {w}", style="yellow")
    for n in doc["notes"]:
        _say(con, f"note: {n}")


def plot(path: str | os.PathLike, doc: dict, arrays: dict, max_steps: int = 2000) -> Path:
    """PNG heat map: steps (x) by ranks (y); each cell coloured by the cause of that rank's time
    over the step's median rank, its strength by how much (white: at or below the median)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    att = arrays["att"]
    ex, top = att["rank_excess"], att["rank_top"]          # (S, N)
    S, N = ex.shape
    k = max(1, int(np.ceil(S / max_steps)))
    if k > 1:  # per bin of k steps: the cell of the step with the largest excess
        m = (S // k) * k
        exb = ex[:m].reshape(-1, k, N)
        pick = exb.argmax(axis=1)
        ex = np.take_along_axis(exb, pick[:, None, :], axis=1)[:, 0]
        top = np.take_along_axis(top[:m].reshape(-1, k, N), pick[:, None, :], axis=1)[:, 0]
    scale = float(np.percentile(ex[ex > 0], 99)) if (ex > 0).any() else 1.0
    strength = np.clip(ex / max(scale, 1e-9), 0, 1)
    colours = np.array([to_rgb(CAUSE_COLOURS[c]) for c in CAUSES])
    rgb = 1 - strength[..., None] * (1 - colours[top])       # (S', N, 3)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * N), constrained_layout=True)
    ax.imshow(np.transpose(rgb, (1, 0, 2)), aspect="auto", interpolation="nearest",
              extent=(0, ex.shape[0] * k, N - 0.5, -0.5))
    ax.set_yticks(range(N), [f"rank {r}" for r in arrays["labels"]])
    ax.set_xlabel("aligned step" + (f" (max of each {k} steps)" if k > 1 else ""))
    gate = "none (ranks even)" if doc["gating_rank"] is None else doc["gating_rank"]
    ax.set_title(f"time over the median rank, by cause — gating rank {gate} "
                 f"({doc['steps']:,} steps, aligned by {doc['alignment']}); white: at the median")
    fig.legend(handles=[Patch(color=CAUSE_COLOURS[c], label=c) for c in CAUSES], loc="outside lower center",
               ncol=6, fontsize=8)
    p = Path(path)
    with _open_new(p) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return p
