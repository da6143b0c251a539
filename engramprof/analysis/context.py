"""Stage 3: the context the samplers recorded beside the read events.

Per-thread context switches (``threads``), PSI (``psi``), and refaults: the target's memory
cgroup when recorded (its own refaults), else system-wide ``vmstat``.  Each sample table is
read through the trace's read contract (the columns below); a table that is absent, empty or
lacks a column is noted and not used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from engramprof.errors import UserError
from engramprof.trace import (
    SAMPLE_READ_COLUMNS as SAMPLE_COLUMNS,  # the trace module owns the contract
)

SampleGetter = Callable[[str], "pd.DataFrame | None"]


@dataclass
class RefaultSeries:
    """Refaults per sample interval: ``refaults[i]`` happened in (at[i-1], at[i]]."""

    at: np.ndarray  # sample times, int64 ns, sorted
    refaults: np.ndarray  # float64, >= 0
    source: str

    def interval_of(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(interval index, valid) of entry times: the interval ending at the next sample."""
        j = np.searchsorted(self.at, ts, side="left")
        return j, (j > 0) & (j < len(self.at))

    def interval_of_sorted(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`interval_of` of sorted entry times, in O(len(ts) + len(at)): event i's
        interval is the number of samples before it, counted from where each sample time
        falls among the entries (no binary search per event)."""
        upto = np.searchsorted(ts, self.at, side="right")  # events at or before each sample time
        j = np.cumsum(np.bincount(upto, minlength=len(ts) + 1)[:len(ts)])
        return j, (j > 0) & (j < len(self.at))


@dataclass
class SampleContext:
    threads: pd.DataFrame | None
    psi: pd.DataFrame | None
    refaults: RefaultSeries | None
    offcpu: pd.DataFrame | None = None  # every off-CPU span of the target's threads
    used: dict = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def _read_sample(getter: SampleGetter, name: str, notes: list[str], ctx: SampleContext) -> pd.DataFrame | None:
    need = SAMPLE_COLUMNS[name]
    try:
        df = getter(name)
    except UserError as exc:
        notes.append(f"samples/{name} unreadable ({exc}); not used")
        ctx.missing.append(name)
        return None
    if df is None or len(df) == 0:
        ctx.missing.append(name)
        return None
    lacking = [c for c in need if c not in df.columns]
    if lacking:
        notes.append(f"samples/{name} lacks {', '.join(lacking)}; not used")
        ctx.missing.append(name)
        return None
    df = df[need].copy()
    for c in need:
        if c != "resource":
            df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.dropna()
    if len(df) == 0:
        ctx.missing.append(name)
        return None
    ctx.used[name] = list(need)
    return df


def load_context(getter: SampleGetter, notes: list[str]) -> SampleContext:
    """Read the sample tables the analysis uses (noting what is missing or unusable)."""
    ctx = SampleContext(threads=None, psi=None, refaults=None)
    ctx.threads = _read_sample(getter, "threads", notes, ctx)
    ctx.psi = _read_sample(getter, "psi", notes, ctx)
    ctx.offcpu = _read_sample(getter, "offcpu", notes, ctx)
    cg = _read_sample(getter, "cgroup", notes, ctx)
    vm = _read_sample(getter, "vmstat", notes, ctx)
    if cg is not None:
        vm, source = cg.rename(columns={"refault_file": "workingset_refault_file"}), "cgroup refault_file"
    else:
        source = "vmstat workingset_refault_file (system-wide)"
    if vm is not None:
        vm = vm.sort_values("ts_ns", kind="stable")
        ctx.refaults = RefaultSeries(at=vm["ts_ns"].to_numpy(np.int64),
                                     refaults=np.clip(vm["workingset_refault_file"].to_numpy(np.float64), 0, None),
                                     source=source)
    return ctx


def context_switches(threads: pd.DataFrame, tids: np.ndarray, bstart: np.ndarray, bend: np.ndarray):
    """Per batch, context switches of the reading threads, linearly interpolated from the
    cumulative per-thread counters (10 Hz samples: an estimate for ms-long batches).
    Returns (total per batch, involuntary per batch, totals); NaN where not covered."""
    nb = len(bstart)
    vol = np.zeros(nb)
    inv = np.zeros(nb)
    covered = np.zeros(nb, dtype=bool)
    t = threads[threads["tid"].isin(tids)].sort_values(["tid", "ts_ns"], kind="stable")
    totals = {"voluntary": 0.0, "involuntary": 0.0, "threads_sampled": 0}
    x0, x1 = bstart.astype(np.float64), bend.astype(np.float64)
    for _, g in t.groupby("tid", sort=False):  # one iteration per thread, not per event
        x = g["ts_ns"].to_numpy(np.float64)
        if len(x) < 2:
            continue
        cv = g["ctx_voluntary"].to_numpy(np.float64)
        ci = g["ctx_involuntary"].to_numpy(np.float64)
        vol += np.interp(x1, x, cv) - np.interp(x0, x, cv)
        inv += np.interp(x1, x, ci) - np.interp(x0, x, ci)
        covered |= (x0 >= x[0]) & (x1 <= x[-1])
        totals["voluntary"] += float(max(0.0, cv[-1] - cv[0]))
        totals["involuntary"] += float(max(0.0, ci[-1] - ci[0]))
        totals["threads_sampled"] += 1
    vol = np.clip(vol, 0, None)
    inv = np.clip(inv, 0, None)
    return np.where(covered, vol + inv, np.nan), np.where(covered, inv, np.nan), totals


def psi_average(psi: pd.DataFrame, t0: int, t1: int) -> dict:
    """Average PSI 'some' (% of time) per resource over the trace window.  ``some_us`` is the
    stall time in the interval ending at ``ts_ns`` (the samplers' contract), so the window's
    stall is the sum over the samples after the first one inside it."""
    out: dict = {}
    for res, g in psi.groupby("resource", sort=True):
        g = g.sort_values("ts_ns", kind="stable")
        x = g["ts_ns"].to_numpy(np.float64)
        y = g["some_us"].to_numpy(np.float64)
        inwin = (x >= t0) & (x <= t1 + 1e8)
        if inwin.sum() < 2:
            continue
        x, y = x[inwin], y[inwin]
        span_us = (x[-1] - x[0]) / 1e3
        if span_us > 0:
            out[str(res)] = round(100.0 * float(np.clip(y[1:], 0, None).sum()) / span_us, 3)
    return out
