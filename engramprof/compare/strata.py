"""Before / after, stratified so that only comparable batches are compared (``compare --before
--after``).

A batch's stratum is what makes batches comparable without being the change under test:

* rows per batch, in buckets (:data:`ROW_BUCKETS`): decode-sized (< 1024 rows) or
  prefill-sized, the batch shape the traffic sets;
* the read path: the kind of its read events (``syscall``: preadv2 / preadv / pread64;
  ``fault``: a memory-mapped reader's page faults; ``mixed``; ``none``);
* the share of its reads that were resident when the batch began (inserted no page), in
  :data:`RESIDENT_BUCKETS`, where the trace has ``pages_added``.

A stratum is shared when both sides hold at least :data:`MIN_BATCHES` batches of it.  Per
shared stratum: p50 / p99 batch time and cause shares per side, each with a bootstrap interval,
and after / before with its interval.  The overall figure is over the shared strata only, with
both sides reweighted to one common mix (each stratum's weight: the mean of its share of the
before and of the after batches), so a change of traffic mix does not pass for a speed-up.
When more than :data:`MAX_UNSHARED_TIME` of either side's batch time is in strata the other
side lacks, the windows are unmatched: no overall figure (exit 3), the reason in the JSON.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engramprof.analysis.verdicts import CAUSES
from engramprof.compare import stats
from engramprof.compare.ranks import MS_COLS
from engramprof.units import pct

#: (upper bound exclusive, label); rows below 1024 are decode-sized
ROW_BUCKETS = ((128, "decode <128 rows"), (1024, "decode 128-1023 rows"), (8192, "prefill 1k-8k rows"),
               (65536, "prefill 8k-64k rows"), (float("inf"), "prefill 64k+ rows"))
#: (lower bound inclusive, label) of the resident share at batch start
RESIDENT_BUCKETS = ((0.9, "cached"), (0.5, "part cached"), (0.0, "cold"))
MIN_BATCHES = 5
MAX_UNSHARED_TIME = 0.5
SHORT_WINDOW_S = 60.0


def rows_bucket(rows: np.ndarray) -> np.ndarray:
    edges = np.array([b for b, _ in ROW_BUCKETS[:-1]], dtype=np.float64)
    labels = np.array([label for _, label in ROW_BUCKETS], dtype=object)
    return labels[np.searchsorted(edges, np.asarray(rows, dtype=np.float64), side="right")]


def resident_bucket(frac: np.ndarray) -> np.ndarray:
    frac = np.asarray(frac, dtype=np.float64)
    out = np.full(len(frac), "residency unknown", dtype=object)
    known = np.isfinite(frac)
    for lo, label in reversed(RESIDENT_BUCKETS):
        out[known & (frac >= lo)] = label
    return out


def stratum_of(table: pd.DataFrame) -> np.ndarray:
    """Each batch's stratum name: ``rows bucket, read path, resident bucket``."""
    rb = rows_bucket(table["rows"].to_numpy(np.float64))
    rp = table["read_path"].astype(str).to_numpy(dtype=object)
    res = resident_bucket(table["resident_frac"].to_numpy(np.float64))
    return np.array([f"{a}, {b}, {c}" for a, b, c in zip(rb, rp, res)], dtype=object)


def side_frame(bundles: list) -> pd.DataFrame:
    """The batches of one side's bundles, with their stratum."""
    parts = []
    for b in bundles:
        t = b.batches
        parts.append(pd.DataFrame({"wall_ms": t["wall_ms"].to_numpy(np.float64), "stratum": stratum_of(t),
                                   **{c: t[c].to_numpy(np.float64) for c in MS_COLS}}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["wall_ms", "stratum", *MS_COLS])


def _r(v, nd=4):
    return None if v is None or not np.isfinite(v) else round(float(v), nd)


def _ri(ci, nd=4):
    return None if ci is None else [_r(ci[0], nd), _r(ci[1], nd)]


def _shares(est: stats.Estimate) -> tuple[dict, dict]:
    point = {c: _r(est.point["share"][i]) for i, c in enumerate(CAUSES)}
    ci = stats.interval(est.reps["share"]) if len(est.reps["share"]) else None
    cis = {c: (None if ci is None else [_r(ci[0][i]), _r(ci[1][i])]) for i, c in enumerate(CAUSES)}
    return point, cis


def _figures(name: str, nb: int, na: int, eb: stats.Estimate, ea: stats.Estimate) -> dict:
    r50, ci50 = stats.ratio(eb, ea, "p50")
    r99, ci99 = stats.ratio(eb, ea, "p99")
    d50, dci = stats.difference(eb, ea, "p50")
    sb, sbci = _shares(eb)
    sa, saci = _shares(ea)
    return {
        "stratum": name, "before_batches": int(nb), "after_batches": int(na),
        "p50_ms_before": _r(eb.point["p50"]), "p50_ms_after": _r(ea.point["p50"]),
        "p50_ci_before": _ri(stats.interval(eb.reps["p50"])), "p50_ci_after": _ri(stats.interval(ea.reps["p50"])),
        "ratio": _r(r50), "ci": _ri(ci50),
        "diff_ms": _r(d50), "diff_ci": _ri(dci),
        "p99_ms_before": _r(eb.point["p99"]), "p99_ms_after": _r(ea.point["p99"]),
        "p99_ratio": _r(r99), "p99_ci": _ri(ci99),
        "share_before": sb, "share_after": sa, "share_ci_before": sbci, "share_ci_after": saci,
    }


def _sample(df: pd.DataFrame, strata: list[str], weights: np.ndarray) -> stats.Sample:
    sub = df[df["stratum"].isin(strata)]
    g = pd.Categorical(sub["stratum"], categories=strata).codes.astype(np.int64)
    return stats.Sample(sub["wall_ms"].to_numpy(np.float64), sub[MS_COLS].to_numpy(np.float64), g,
                        np.asarray(weights, dtype=np.float64))


def compare(before: pd.DataFrame, after: pd.DataFrame, *, resamples: int = 1000, seed: int = 0,
            min_batches: int = MIN_BATCHES, max_unshared: float = MAX_UNSHARED_TIME) -> dict:
    """The before/after document (without warnings): matched, reason, strata, overall, dropped."""
    rng = np.random.default_rng(seed)
    nb = before.groupby("stratum")["wall_ms"].agg(["size", "sum"])
    na = after.groupby("stratum")["wall_ms"].agg(["size", "sum"])
    names = sorted(set(nb.index) | set(na.index))
    shared = [s for s in names if nb["size"].get(s, 0) >= min_batches and na["size"].get(s, 0) >= min_batches]
    tb, ta = float(before["wall_ms"].sum()), float(after["wall_ms"].sum())
    unshared_b = 1 - float(nb["sum"].reindex(shared).fillna(0).sum()) / tb if tb > 0 else 1.0
    unshared_a = 1 - float(na["sum"].reindex(shared).fillna(0).sum()) / ta if ta > 0 else 1.0
    dropped = []
    for s in names:
        if s in shared:
            continue
        dropped.append({"stratum": s, "before_batches": int(nb["size"].get(s, 0)),
                        "after_batches": int(na["size"].get(s, 0)),
                        "before_time_share": _r(float(nb["sum"].get(s, 0.0)) / tb if tb > 0 else 0.0),
                        "after_time_share": _r(float(na["sum"].get(s, 0.0)) / ta if ta > 0 else 0.0)})
    strata = []
    for s in shared:
        eb = stats.estimate(_sample(before, [s], np.ones(1)), resamples, rng)
        ea = stats.estimate(_sample(after, [s], np.ones(1)), resamples, rng)
        strata.append(_figures(s, nb["size"][s], na["size"][s], eb, ea))
    reason = None
    if not shared:
        reason = "no stratum has at least %d batches on both sides: the windows share no comparable batches" % min_batches
    elif unshared_b > max_unshared or unshared_a > max_unshared:
        which = [f"{side} has {pct(share)} of its batch time in strata the other side lacks"
                 for side, share in (("before", unshared_b), ("after", unshared_a)) if share > max_unshared]
        reason = "; ".join(which) + f" (more than {pct(max_unshared)}): the windows are unmatched, no overall claim"
    overall = None
    mix = {}
    if reason is None:
        fb = np.array([nb["size"][s] for s in shared], dtype=np.float64)
        fa = np.array([na["size"][s] for s in shared], dtype=np.float64)
        w = (fb / fb.sum() + fa / fa.sum()) / 2
        mix = {s: _r(x) for s, x in zip(shared, w)}
        eb = stats.estimate(_sample(before, shared, w), resamples, rng)
        ea = stats.estimate(_sample(after, shared, w), resamples, rng)
        overall = _figures("overall (shared strata, common mix)", fb.sum(), fa.sum(), eb, ea)
        overall["strata"] = list(shared)
        overall["mix"] = mix
    return {
        "matched": reason is None, "reason": reason, "strata": strata, "overall": overall,
        "dropped": dropped,
        "unshared_time_share": {"before": _r(unshared_b), "after": _r(unshared_a)},
        "min_batches": min_batches, "max_unshared_time_share": max_unshared,
        "resamples": resamples, "confidence": stats.CONFIDENCE,
    }


def side_facts(bundles: list) -> dict:
    hosts = sorted({str(b.meta.get("host")) for b in bundles if b.meta.get("host")})
    kernels = sorted({str(b.meta.get("kernel")) for b in bundles if b.meta.get("kernel")})
    return {"traces": [b.trace for b in bundles], "batches": int(sum(len(b.batches) for b in bundles)),
            "window_s": round(sum(b.window_s for b in bundles), 3), "hosts": hosts, "kernels": kernels,
            "lost_records": int(sum(b.lost_records for b in bundles))}


def warnings(before: list, after: list) -> list[str]:
    out = []
    fb, fa = side_facts(before), side_facts(after)
    for side, bundles, facts in (("before", before, fb), ("after", after, fa)):
        if len(bundles) == 1 and facts["window_s"] < SHORT_WINDOW_S:
            out.append(f"{side} is a single {facts['window_s']:.3g} s window: one short window samples one moment of "
                       f"traffic; record several windows or at least {SHORT_WINDOW_S:.0f} s")
        if facts["lost_records"]:
            out.append(f"{side} lost {facts['lost_records']:,} records (ring buffer full): batches in the holes are "
                       "left out, and the rest may be biased")
    if fb["hosts"] and fa["hosts"] and fb["hosts"] != fa["hosts"]:
        out.append(f"the sides ran on different hosts (before: {', '.join(fb['hosts'])}; after: "
                   f"{', '.join(fa['hosts'])}): host differences are in the comparison")
    if fb["kernels"] and fa["kernels"] and fb["kernels"] != fa["kernels"]:
        out.append(f"the sides ran on different kernels (before: {', '.join(fb['kernels'])}; after: "
                   f"{', '.join(fa['kernels'])}): kernel differences are in the comparison")
    return out
