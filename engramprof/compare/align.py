"""Steps across ranks: by the markers' step id when every rank has one, else by the clocks.

By step id: a step is aligned when every rank has a batch with that id (a repeated id on one
rank keeps its first batch).  By clock: each bundle's CLOCK_MONOTONIC batch starts are put on
one timeline -- the monotonic clock itself when every bundle was recorded in the same boot of
one host (same ``clocks.boot_id``), else CLOCK_REALTIME through the offset (realtime -
monotonic) each bundle read at its start and end (interpolated in between, so a clock slewed
during the recording is followed).  The first rank's batches are the reference: each is
matched to the nearest batch start of every other rank, mutually nearest only, within half a
step period.  The error assumed is stated: ``--clock-error-ms``, else on one boot the skew of
the clock readings, else the sum of the two largest NTP estimated errors (adjtimex
``esterror``) of the bundles; the processes of one bundle (split into ranks) share one clock
(error 0).  An error of half a step or more cannot align steps (exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engramprof.errors import UserError


@dataclass
class Alignment:
    method: str                 # "step-id" | "clock"
    steps: np.ndarray           # step ids (step-id) or the reference batch index (clock)
    index: np.ndarray           # (steps, ranks): row of each rank's per-batch table
    error_ms: float
    error_source: str
    notes: list


def by_step_id(tables: list, names: list[str]) -> Alignment:
    """Align on the ``step`` column of every rank's per-batch table."""
    firsts = []
    notes = []
    for t, name in zip(tables, names):
        s = t["step"]
        ok = s.notna().to_numpy()
        steps = s.to_numpy()[ok].astype(np.int64)
        rows = np.flatnonzero(ok)
        uniq, first = np.unique(steps, return_index=True)
        if len(uniq) < len(steps):
            notes.append(f"{name}: {len(steps) - len(uniq)} repeated step id(s): the first batch of each is used")
        firsts.append((uniq, rows[first]))
    common = firsts[0][0]
    for u, _ in firsts[1:]:
        common = np.intersect1d(common, u, assume_unique=True)
    if not len(common):
        raise UserError("no step id is shared by every rank: the markers' step counters do not match")
    idx = np.column_stack([r[np.searchsorted(u, common)] for u, r in firsts])
    dropped = max(len(u) for u, _ in firsts) - len(common)
    if dropped:
        notes.append(f"{dropped} step(s) are missing on some rank and are left out")
    return Alignment("step-id", common, idx, 0.0, "exact: the markers' step id", notes)


def _clocks(meta: dict, name: str) -> dict:
    c = meta.get("clocks")
    start = c.get("start") if isinstance(c, dict) else None
    if not isinstance(start, dict) or not all(isinstance(start.get(k), int)
                                              for k in ("monotonic_ns", "realtime_ns")):
        raise UserError(f"{name}: the bundle records no clocks (meta.json 'clocks': recorded by an older "
                        "engramprof), so steps cannot be aligned by time; give markers with a step id")
    return c


def _offset_fn(c: dict):
    """monotonic ns -> realtime ns for one bundle (linear between its start and end readings)."""
    s = c["start"]
    e = c.get("end") if isinstance(c.get("end"), dict) else None
    o0 = s["realtime_ns"] - s["monotonic_ns"]
    if not e or not isinstance(e.get("monotonic_ns"), int) or e["monotonic_ns"] <= s["monotonic_ns"]:
        return lambda t: t + o0
    o1 = e["realtime_ns"] - e["monotonic_ns"]
    m0, m1 = s["monotonic_ns"], e["monotonic_ns"]
    return lambda t: t + o0 + (o1 - o0) * np.clip((t - m0) / (m1 - m0), 0.0, 1.0)


def clock_error(metas: list[dict], names: list[str], given_ms: float | None) -> tuple[float, str, bool]:
    """(error ms, how it was found, same boot?)."""
    if len(metas) > 1 and all(m is metas[0] for m in metas):  # the processes of one bundle
        if given_ms is not None:
            return float(given_ms), "given (--clock-error-ms)", True
        return 0.0, "one bundle: its processes' events share one CLOCK_MONOTONIC", True
    cl = [_clocks(m, n) for m, n in zip(metas, names)]
    boots = {c.get("boot_id") for c in cl}
    same_boot = len(boots) == 1 and None not in boots
    if given_ms is not None:
        return float(given_ms), "given (--clock-error-ms)", same_boot
    if same_boot:
        skew = max(int(c["start"].get("read_ns") or 0) for c in cl) / 1e6
        return skew, "one boot of one host: the same CLOCK_MONOTONIC (error: the clock readings' skew)", True
    errs = []
    for c, n in zip(cl, names):
        ntp = c.get("ntp") or {}
        if not ntp or not ntp.get("synchronized") or not isinstance(ntp.get("esterror_us"), int):
            raise UserError(f"{n}: its host's clock was not NTP-synchronised when recorded (adjtimex), so the error "
                            "of aligning by time is unknown; give --clock-error-ms or markers with a step id")
        errs.append(ntp["esterror_us"] / 1e3)
    errs.sort(reverse=True)
    return float(sum(errs[:2])), "NTP estimated error (adjtimex esterror) of the two least certain hosts", False


def by_clock(tables: list, metas: list[dict], names: list[str], given_error_ms: float | None) -> Alignment:
    err_ms, source, same_boot = clock_error(metas, names, given_error_ms)
    starts = []
    for t, m in zip(tables, metas):
        s = t["start_ns"].to_numpy(np.int64)
        starts.append(s.astype(np.float64) if same_boot else _offset_fn(m["clocks"])(s.astype(np.float64)))
    ref = starts[0]
    if len(ref) < 2:
        raise UserError(f"{names[0]}: fewer than 2 batches: nothing to align")
    period = float(np.median(np.diff(ref)))
    if err_ms * 1e6 >= period / 2:
        raise UserError(f"the clocks' error ({err_ms:.3g} ms, {source}) is at least half a step "
                        f"({period / 2e6:.3g} ms): steps cannot be aligned by time; give markers with a step id")
    tol = period / 2
    cols = [np.arange(len(ref))]
    ok = np.ones(len(ref), dtype=bool)
    for other in starts[1:]:
        if not len(other):
            raise UserError("a rank has no batch: nothing to align")
        j = np.clip(np.searchsorted(other, ref), 1, len(other) - 1) if len(other) > 1 else np.zeros(len(ref), int)
        if len(other) > 1:
            left = np.abs(ref - other[j - 1]) <= np.abs(ref - other[j])
            j = np.where(left, j - 1, j)
        d = np.abs(other[j] - ref)
        # mutual nearest: the reference batch nearest to other[j] must be this one
        k = np.clip(np.searchsorted(ref, other[j]), 1, len(ref) - 1)
        back = np.where(np.abs(other[j] - ref[k - 1]) <= np.abs(other[j] - ref[k]), k - 1, k)
        ok &= (d <= tol) & (back == np.arange(len(ref)))
        cols.append(j)
    idx = np.column_stack(cols)[ok]
    if not len(idx):
        raise UserError("no batch of the first rank has a batch of every other rank within half a step: "
                        "the recordings do not overlap in time")
    notes = []
    if (~ok).sum():
        notes.append(f"{int((~ok).sum())} batch(es) of the first rank had no match on some rank and are left out")
    return Alignment("clock", idx[:, 0].astype(np.int64), idx, err_ms, source, notes)


def align(tables: list, metas: list[dict], names: list[str], has_steps: list[bool],
          clock_error_ms: float | None) -> Alignment:
    if all(has_steps):
        return by_step_id(tables, names)
    return by_clock(tables, metas, names, clock_error_ms)
