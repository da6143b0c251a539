"""From one round's cumulative readings to the rows of each sample series.

Counters become *deltas over the interval that ends at ts_ns* (since the previous successful
read of the same counter); the first row of each series is the baseline and holds zero deltas,
so summing a delta column over a window gives the window total.  Thread and process CPU times
and context switches are kept both cumulative and as deltas.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from engramprof.sampling.sources import Notes, Rel
from engramprof.trace.schema import (
    CGROUP_COUNTERS,
    CGROUP_GAUGES,
    SAMPLE_NAMES,
    SAMPLE_SCHEMAS,
    VMSTAT_COUNTERS,
    VMSTAT_DERIVED,
)

# global (not cgroup-limit) reclaimers: pgscan_<who> counts only their reclaim, while
# pgscan_anon/_file count every reclaimer, so the difference is the cgroup-limit reclaim
# (mm/vmscan.c, shrink_inactive_list / evict_folios)
RECLAIMERS = ("kswapd", "direct", "khugepaged", "proactive")


@dataclass
class Series:
    """Rows of one sample series, buffered as tuples, compacted into Arrow tables on take()."""

    name: str
    cols: list[tuple[str, pa.DataType]]
    rows: list[tuple] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)

    def take(self) -> pa.Table | None:
        if not self.rows:
            return None
        rows, self.rows = self.rows, []
        t = self._table(rows)
        self.tables.append(t)
        return t

    def frame(self) -> pd.DataFrame:
        tables = self.tables + ([self._table(self.rows)] if self.rows else [])
        if not tables:
            return pa.schema(self.cols).empty_table().to_pandas()
        return pa.concat_tables(tables).to_pandas()

    def _table(self, rows: list[tuple]) -> pa.Table:
        columns = list(zip(*rows))
        return pa.table({c: pa.array(columns[i], type=ty) for i, (c, ty) in enumerate(self.cols)})


def delta(cur: int | float | None, prev: int | float | None):
    if cur is None or prev is None:
        return None
    d = cur - prev
    return d if d >= 0 else None  # a counter went back: reset (group recreated): unknown


def vmstat_deltas(vm: dict, prev: dict) -> dict:
    """Per-interval vmstat counters plus the derived allocstall / pgscan_memcg / pgsteal_memcg."""
    deltas = {c: delta(vm.get(c), prev.get(c)) for c in VMSTAT_COUNTERS}
    stalls = [deltas[c] for c in VMSTAT_COUNTERS if c.startswith("allocstall_") and deltas[c] is not None]
    deltas["allocstall"] = sum(stalls) if stalls else None
    for kind in ("pgscan", "pgsteal"):
        tot = [deltas.get(f"{kind}_anon"), deltas.get(f"{kind}_file")]
        if None in tot:
            deltas[f"{kind}_memcg"] = None
        else:
            glob = sum(deltas.get(f"{kind}_{r}") or 0 for r in RECLAIMERS)
            deltas[f"{kind}_memcg"] = max(0, sum(tot) - glob)
    return deltas


class RowRecorder:
    """Appends one round's rows to every series; remembers the previous readings."""

    def __init__(self, pid: int | None, notes: Notes, rel: Rel, target_exited: threading.Event, recent: int):
        self.pid = pid
        self.notes = notes
        self.rel = rel
        self.target_exited = target_exited
        self.target_exit_ns: int | None = None
        self.series = {n: Series(n, SAMPLE_SCHEMAS[n]) for n in SAMPLE_NAMES}
        self.prev: dict[str, Any] = {}
        self.rounds = 0
        self.start_ns: int | None = None
        # (ts, psi totals, vmstat, kswapd cpu, cgroup refaults, target context switches) per round
        self.recent: collections.deque = collections.deque(maxlen=recent)

    def record(self, s: dict) -> None:
        ts = s["ts_ns"]
        if self.start_ns is None:
            self.start_ns = ts
        first = self.rounds == 0
        self.rounds += 1
        self._psi(ts, s["psi"])
        self._vmstat(ts, s["vmstat"])
        self._kswapd(ts, s["kswapd"])
        self._disks(ts, s.get("disks"))
        self._cgroup(ts, s["cgroup"], first)
        if self.pid is not None and not self.target_exited.is_set():
            self._target(ts, s["process"], s["threads"], first)
        for pid, (proc, threads) in (s.get("others") or {}).items():
            self._followed(ts, pid, proc, threads)
        self.recent.append((
            ts,
            {r: (v.get("some", (0, 0))[0], v.get("full", (0, 0))[0]) for r, v in s["psi"].items() if v},
            s["vmstat"] or {},
            sum(x[3] for x in s["kswapd"]),
            (s["cgroup"] or {}).get("refault_file"),
            sum((t[2] or 0) + (t[3] or 0) for t in (s.get("threads") or [])),
        ))

    def _psi(self, ts: int, psi: dict) -> None:
        for r, v in psi.items():
            key = f"psi:{r}"
            if v is None:
                self.notes.add(f"psi-lost-{r}", f"/proc/pressure/{r} became unreadable{self.rel(ts)}")
                continue
            some, full = v.get("some"), v.get("full")
            cur = (some[0] if some else None, full[0] if full else None)
            p = self.prev.get(key, cur)
            self.series["psi"].rows.append(
                (ts, r, delta(cur[0], p[0]), delta(cur[1], p[1]), cur[0], cur[1], some[1] if some else None, full[1] if full else None)
            )
            self.prev[key] = cur

    def _vmstat(self, ts: int, vm: dict | None) -> None:
        if vm is None:
            return
        deltas = vmstat_deltas(vm, self.prev.get("vmstat", vm))
        self.series["vmstat"].rows.append((ts,) + tuple(deltas[c] for c in VMSTAT_COUNTERS + VMSTAT_DERIVED))
        self.prev["vmstat"] = vm

    def _kswapd(self, ts: int, kswapd: list) -> None:
        for pid, name, state, cpu in kswapd:
            key = f"kswapd:{pid}"
            self.series["kswapd"].rows.append((ts, pid, name, state, max(0.0, cpu - self.prev.get(key, cpu)), cpu))
            self.prev[key] = cpu

    def _disks(self, ts: int, disks: dict | None) -> None:
        """A device's first round is its baseline (zeros); afterwards a row only when it
        completed reads, writes or flushes in the interval (most devices are idle: no rows for
        them)."""
        if disks is None:
            return
        prev: dict = self.prev.setdefault("disks", {})
        rows = self.series["disks"].rows
        for dev, (name, reads, merged, sectors, ticks, inflight, writes, wsectors, flushes) in disks.items():
            p = prev.get(dev)
            if p is None:
                rows.append((ts, dev, name, 0, 0, 0, 0, inflight, 0, 0, 0))
            elif reads != p[1] or writes != p[6] or flushes != p[8]:
                rows.append((ts, dev, name, delta(reads, p[1]), delta(merged, p[2]), delta(sectors, p[3]),
                             delta(ticks, p[4]), inflight, delta(writes, p[6]), delta(wsectors, p[7]),
                             delta(flushes, p[8])))
            prev[dev] = (name, reads, merged, sectors, ticks, inflight, writes, wsectors, flushes)

    def _cgroup(self, ts: int, cg: dict | None, first: bool) -> None:
        if cg is None:
            return
        p = self.prev.setdefault("cgroup", {})
        row = [ts] + [cg.get(c) for c in CGROUP_GAUGES]
        for c in CGROUP_COUNTERS:
            cur = cg.get(c)
            if cur is None:
                row.append(None)
                continue
            if c not in p:
                row.append(0 if first or "cg_seen" not in self.prev else None)
            else:
                d = delta(cur, p[c])
                if d is None:
                    self.notes.add(f"cg-reset-{c}", f"cgroup counter {c} went backwards{self.rel(ts)} (group recreated?)")
                row.append(d)
            p[c] = cur
        self.prev["cg_seen"] = True
        self.series["cgroup"].rows.append(tuple(row))

    def _target(self, ts: int, proc: dict | None, threads: list | None, first: bool) -> None:
        if proc is None:
            self.target_exited.set()
            self.target_exit_ns = ts
            if first:
                self.notes.add("exit", f"pid {self.pid} exited before the first sample")
            else:
                self.notes.add("exit", f"pid {self.pid} exited{self.rel(ts)}; its samples up to then are kept")
            return
        self._process_rows(ts, self.pid, proc, threads, first, "")

    def _followed(self, ts: int, pid: int, proc: dict | None, threads: list | None) -> None:
        """Another traced process (--pid repeated, --children, --cgroup, --file readers): its
        first round (when it joined) is its baseline."""
        key = f":{pid}"
        if proc is None:
            if f"process{key}" in self.prev:
                self.notes.add(f"exit-{pid}", f"pid {pid} exited{self.rel(ts)}; its samples up to then are kept")
            return
        self._process_rows(ts, pid, proc, threads, f"process{key}" not in self.prev, key)

    def _process_rows(self, ts: int, pid: int, proc: dict, threads: list | None, first: bool, key: str) -> None:
        pp = self.prev.get(f"process{key}", proc)
        cpu = proc["utime_s"] + proc["stime_s"]
        self.series["process"].rows.append((
            ts, pid, proc["state"], proc["utime_s"], proc["stime_s"],
            max(0.0, cpu - pp["utime_s"] - pp["stime_s"]),
            proc["num_threads"], proc["rss_bytes"],
            delta(proc["minflt"], pp["minflt"]),
            delta(proc["majflt"], pp["majflt"]),
            delta(proc["rchar"], pp["rchar"]),
            delta(proc["read_bytes"], pp["read_bytes"]),
            delta(proc["syscr"], pp["syscr"]),
        ))
        self.prev[f"process{key}"] = proc
        self._threads(ts, pid, threads or [], first, key)

    def _threads(self, ts: int, pid: int, threads: list, first: bool, key: str = "") -> None:
        known: dict = self.prev.setdefault(f"threads{key}", {})
        seen = {}
        rows = self.series["threads"].rows
        for tid, name, vcs, ivcs, ut, stt, run, runq, slices in threads:
            # a thread absent from the previous round was born after it: its whole
            # count falls in this interval; threads of the very first round: baseline
            cur = (vcs, ivcs, ut, stt, run, runq, slices)
            base = known.get(tid) or (cur if first else (0, 0, 0.0, 0.0, 0, 0, 0))
            rows.append((
                ts, pid, tid, name, vcs, ivcs,
                delta(vcs, base[0]),
                delta(ivcs, base[1]),
                ut, stt,
                (run - base[4]) / 1e9 if run is not None and base[4] is not None else max(0.0, ut + stt - base[2] - base[3]),
                delta(run, base[4]),
                delta(runq, base[5]),
                delta(slices, base[6]),
            ))
            seen[tid] = cur
        self.prev[f"threads{key}"] = seen
