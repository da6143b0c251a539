"""`engramprof demo`'s before / after table (the run itself: engramprof.lab.demo)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from engramprof.units import duration, pct


def side_by_side(console: Console, before: dict, after: dict) -> None:
    t = Table(title="before / after (same table, same rows, same machine, one window each)", title_justify="left")
    t.add_column("")
    t.add_column("pool reader", justify="right")
    t.add_column("nowait reader", justify="right")

    def bt(d, *keys):
        v = d["batch_tail"]
        for k in keys:
            v = (v or {}).get(k)
        return v

    rows = [
        ("verdict", before["verdict"], after["verdict"]),
        ("confidence", f"{before['confidence']:.2f}", f"{after['confidence']:.2f}"),
        ("batches traced", str(bt(before, "batches")), str(bt(after, "batches"))),
        ("batch p50 (markers)", duration(bt(before, "batch_ms", "p50")), duration(bt(after, "batch_ms", "p50"))),
        ("batch p99", duration(bt(before, "batch_ms", "p99")), duration(bt(after, "batch_ms", "p99"))),
        ("reads in flight p50", duration(bt(before, "inflight_ms", "p50")), duration(bt(after, "inflight_ms", "p50"))),
        ("outside the read path", pct(bt(before, 'outside_read_path_frac') or 0), pct(bt(after, 'outside_read_path_frac') or 0)),
    ]
    for cause in ("python-scheduling", "cpu-copy", "residency", "reclaim", "storage", "unexplained"):
        rows.append((f"share: {cause}", pct(bt(before, 'share', cause) or 0), pct(bt(after, 'share', cause) or 0)))
    rows.append(("lab's own batch p50", duration(before["lab"].get("batch_ms", {}).get("p50")) if before.get("lab") else "-",
                 duration(after["lab"].get("batch_ms", {}).get("p50")) if after.get("lab") else "-"))
    for r in rows:
        t.add_row(*r)
    console.print()
    console.print(t)
    b50, a50 = bt(before, "batch_ms", "p50"), bt(after, "batch_ms", "p50")
    if b50 and a50:
        console.print(f"The nowait reader's median batch was {b50 / a50:.1f}x shorter in these two windows. That is a "
                      "component result on a cached lab table, not a model-throughput result: prove a model "
                      "speed-up with matched before/after windows (playbooks/after-deploy.md).")
