"""`engramprof replay`'s report: the replayed batches, one row per arm, the byte-for-byte check."""
from __future__ import annotations

from rich.console import Console

from engramprof.report.render import Col, fit_table, say
from engramprof.lab.replay_stats import times
from engramprof.units import ms, pct


def _span(lo, hi, fmt) -> str:
    return "-" if lo is None or hi is None else f"{fmt(lo)}-{fmt(hi)}"


def render(res: dict) -> None:
    """The arms side by side: batch time, speedup over the pool, CPU and context switches."""
    con = Console()  # the terminal's width; piped: COLUMNS, else 80
    rpb = res["rows_per_batch"]
    rows_desc = f"{rpb['median']:,}" if rpb["min"] == rpb["max"] else f"{rpb['min']:,}-{rpb['max']:,} (median {rpb['median']:,})"
    jpb = res["jobs_per_batch"]
    jobs_desc = str(jpb["min"]) if jpb["min"] == jpb["max"] else f"{jpb['min']}-{jpb['max']}"
    say(con, f"replay of {res['trace']}: {res['batches']} batch(es) of {rows_desc} rows in {jobs_desc} jobs, "
              f"{res['rounds']} round(s) (arms interleaved, order rotated), cold fraction {res['cold_frac']:g}, "
              f"pool of {res['threads']} threads")
    # the arm, its median and its speedup stay whole; the CPU and context-switch detail goes
    # first when narrow (named under the table; --json has it all)
    conf = f"{round(100 * res['confidence'])}%"
    cols = [Col("arm", "left"), Col("median ms"), Col(f"{conf} CI ms", drop=5), Col("speedup vs pool"),
            Col(f"speedup {conf} CI"), Col("p90 ms", drop=11),
            Col("vol ctx/batch", drop=7), Col("invol ctx/batch", drop=8), Col("user ms/batch", drop=9),
            Col("sys ms/batch", drop=10), Col("fallback rows", drop_if_zero=True, drop=6),
            Col("cold at start", drop_if_zero=True, drop=3), Col("major faults/batch", drop_if_zero=True, drop=2)]
    rows = []
    for name, a in res["arms"].items():
        sp = res["speedup"].get(name)
        ci = res["speedup_ci"].get(name)
        rm = a["rounds_ms"]
        pb = a["per_batch"]
        cold = a["cold_frac_observed"]
        rows.append([name, ms(rm["estimate"]), _span(rm["lo"], rm["hi"], ms),
                     f"{sp:.2f}x" if sp else "-", _span(ci and ci["lo"], ci and ci["hi"], times),
                     ms(a["batch_ms"]["p90"]), f"{pb['ctx_voluntary']:,.1f}", f"{pb['ctx_involuntary']:,.1f}",
                     f"{pb['cpu_user_ms']:.1f}", f"{pb['cpu_sys_ms']:.1f}", f"{a['fallback_rows']:,}",
                     pct(cold),
                     f"{a['faults_major'] / max(a['batches'], 1):,.1f}" if a["faults_major"] else "0"])
    con.print(fit_table(con, cols, rows, title=f"arms (medians over rounds, {conf} intervals)"))
    say(con, f"median ms: the median over rounds of each round's median batch time; CI: the order-statistic "
             f"{conf} interval of the median (distribution-free); speedup: the median of the rounds' paired "
             "pool / arm ratios, with the same interval")
    for name, ci in res["speedup_ci"].items():
        say(con, f"speedup, {ci['claim']}: {ci['statement']}")
    ok = "all identical" if not res["mismatches"] else f"{res['mismatches']:,} MISMATCHED"
    say(con, f"byte-for-byte vs a reference read after each arm: {res['rows_verified']:,} rows, {ok}")
    for n in res["notes"]:
        say(con, f"note: {n}")
