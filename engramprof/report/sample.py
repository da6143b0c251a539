"""`engramprof sample`'s report: PSI, reclaim and refaults, the cgroup, the target's threads."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from engramprof.units import count, mib, ms, pct


def _ms_of_us(us) -> str:
    """A duration the samplers give in µs, as ms (the one ms format, engramprof.units.ms)."""
    return ms(None if us is None else us / 1e3)


def _pct_of_100(p) -> str:
    """A percentage the samplers give as 0-100 (engramprof.units.percent_of), in the one format."""
    return pct(None if p is None else p / 100)


def render(s: dict, console: Console) -> None:
    w = s["window"]
    console.print(f"[bold]engramprof sample[/]  window {w['duration_s']:.2f} s, {w['samples']} samples at {w.get('hz') or '?'} Hz")

    if s.get("psi"):
        t = Table(title="Pressure stall (PSI, /proc/pressure)", title_justify="left")
        for c in ("resource", "some ms", "some", "full ms", "full", "peak some", "avg10 end"):
            t.add_column(c, justify="right" if c != "resource" else "left")
        for r, v in s["psi"].items():
            t.add_row(r, _ms_of_us(v["some_us"]), _pct_of_100(v["some_pct"]), _ms_of_us(v["full_us"]), _pct_of_100(v["full_pct"]), _pct_of_100(v["some_peak_pct"]), count(v["some_avg10_end"]) if v["some_avg10_end"] is None else f"{v['some_avg10_end']:.2f}")
        console.print(t)

    vm = s.get("vmstat") or {}
    if vm:
        rate = s.get("vmstat_per_s") or {}
        t = Table(title="Reclaim and refaults (/proc/vmstat, pages)", title_justify="left")
        t.add_column("counter")
        t.add_column("delta", justify="right")
        t.add_column("per s", justify="right")
        for c in ("workingset_refault_file", "workingset_activate_file", "workingset_restore_file", "pgscan_kswapd", "pgsteal_kswapd", "pgscan_direct", "pgsteal_direct", "allocstall", "pgscan_memcg", "pgsteal_memcg", "pgmajfault", "pgpgin"):
            if c in vm:
                label = c + (" (KiB)" if c == "pgpgin" else "")
                t.add_row(label, count(vm[c]), count(rate.get(c)) if c in rate else "")
        ks = s.get("kswapd")
        if ks:
            for th in ks["threads"]:
                t.add_row(f"{th['name']} cpu", f"{th['cpu_s']:.3f} s", pct(th["cpu_s"] / w["duration_s"]) if w["duration_s"] else "-")
        console.print(t)

    cg = s.get("cgroup")
    if cg:
        t = Table(title=f"Target memory cgroup ({cg.get('version')})", title_justify="left")
        t.add_column("what")
        t.add_column("value", justify="right")
        if cg.get("v1_memory"):
            t.add_row("v1 memory group", cg["v1_memory"])
        if cg.get("v2"):
            t.add_row("v2 group", cg["v2"])
        t.add_row("usage (end / max)", f"{mib(cg.get('usage_bytes'))} / {mib(cg.get('usage_max_bytes'))}")
        t.add_row("limit", mib(cg.get("limit_bytes")) if cg.get("limited") else "none")
        for c in ("refault_file", "pgscan", "pgsteal", "failcnt", "events_max", "pgpgin", "pgpgout", "pgmajfault"):
            if cg.get(c) is not None:
                t.add_row(c, count(cg[c]))
        for r, v in (cg.get("pressure") or {}).items():
            if v.get("some_us") is not None:
                t.add_row(f"{r} pressure some / full", f"{_ms_of_us(v['some_us'])} ms ({_pct_of_100(v['some_pct'])}) / {_ms_of_us(v['full_us'])} ms ({_pct_of_100(v['full_pct'])})")
        console.print(t)

    pr = s.get("process")
    if pr:
        t = Table(title=f"Target pid {pr.get('pid')} ({pr.get('name')})" + (" - exited" if pr.get("exited") else ""), title_justify="left")
        t.add_column("what")
        t.add_column("value", justify="right")
        if pr.get("samples"):
            t.add_row("cpu user / system", f"{pr['cpu_user_s']:.2f} s / {pr['cpu_system_s']:.2f} s ({_pct_of_100(pr.get('cpu_pct'))} of a core)")
            t.add_row("context switches vol / invol", f"{count(pr.get('ctx_voluntary'))} / {count(pr.get('ctx_involuntary'))} ({count(pr.get('ctx_per_s'))}/s)")
            t.add_row("threads", count(pr.get("threads_seen")))
            if pr.get("run_s") is not None:
                t.add_row("threads on CPU / waiting to run", f"{pr['run_s']:.2f} s / {pr['runq_s']:.2f} s")
            t.add_row("major / minor faults", f"{count(pr.get('majflt'))} / {count(pr.get('minflt'))}")
            if pr.get("rchar") is not None:
                t.add_row("read via syscalls / from storage", f"{mib(pr['rchar'])} / {mib(pr['read_bytes'])}")
        console.print(t)
        ths = pr.get("threads") or []
        if ths:
            tt = Table(title="Busiest threads (by context switches)", title_justify="left")
            for c in ("tid", "name", "vol cs", "invol cs", "cpu s"):
                tt.add_column(c, justify="left" if c == "name" else "right")
            for th in ths[:10]:
                tt.add_row(str(th["tid"]), th["name"], count(th["ctx_voluntary"]), count(th["ctx_involuntary"]), f"{th['cpu_s']:.2f}")
            if len(ths) > 10:
                tt.caption = f"{len(ths) - 10} more threads in --json"
            console.print(tt)

    procs = s.get("processes") or []
    if procs:
        t = Table(title=f"Traced processes ({len(procs)})", title_justify="left")
        for c in ("pid", "name", "cpu", "vol / invol cs", "threads", "major faults", "from storage"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for p in procs:
            t.add_row(str(p["pid"]), p.get("name") or "-", _pct_of_100(p.get("cpu_pct")),
                      f"{count(p.get('ctx_voluntary'))} / {count(p.get('ctx_involuntary'))}", count(p.get("threads_seen")),
                      count(p.get("majflt")), mib(p.get("read_bytes")))
        console.print(t)

    console.print("[bold]Reading[/]")
    for line in s.get("interpretation") or []:
        console.print(f"  - {line}")
    if s.get("notes"):
        console.print("[bold]Notes[/]")
        for n in s["notes"]:
            console.print(f"  - {n}")
    if s.get("output"):
        console.print(f"samples written to {s['output']}")
