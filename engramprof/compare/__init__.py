"""``engramprof compare``: which rank gates each step; a matched, stratified before/after.

Modules: :mod:`.load` (one bundle -> its per-batch table, batch-tail's split, events released),
:mod:`.align` (steps across ranks: step id, else clocks), :mod:`.ranks` (straggler
attribution), :mod:`.strata` and :mod:`.stats` (stratified before/after with bootstrap
intervals), :mod:`.dataset` (many bundles as one DuckDB / pyarrow dataset), :mod:`.render`.
The page: docs/commands/compare.md.
"""
from __future__ import annotations

from pathlib import Path

from engramprof.compare import align, dataset, load, ranks, strata
from engramprof.errors import UserError

#: the exit status of an unmatched before/after comparison
EXIT_UNMATCHED = 3


def _check_all(traces: list[Path], markers: list[Path | None]) -> None:
    metas = [(str(t), load.read_meta(t)) for t in traces]
    load.check_same_format(metas)
    dataset.check_calls(traces, markers)  # pyarrow.dataset: row counts from the footers only


def _load_all(traces: list[Path], markers: list[Path | None], slow_ms: float) -> list:
    _check_all(traces, markers)
    return [load.load(t, m, slow_ms=slow_ms) for t, m in zip(traces, markers)]


def _rank_labels(traces: list[Path], groups: list[list], known: list[int | None] | None = None) -> list[int]:
    """A bundle found below a fleet directory: its ``rank=`` partition key (``known``); else
    ``rank=K`` in a bundle's path (one rank per bundle), a process's own rank (a bundle of
    several processes: its process list or markers), else the position; positions for all when
    two would share a label."""
    known = known or [None] * len(traces)
    labels, i = [], 0
    for t, group, k in zip(traces, groups, known):
        for b in group:
            labels.append(b.rank if len(group) > 1 and b.rank is not None else
                          (k if k is not None else load.rank_label(t, i)) if len(group) == 1 else i)
            i += 1
    return labels if len(set(labels)) == len(labels) else list(range(len(labels)))


def _expand(traces: list[Path], markers: list[Path] | None, *, need_ranks: bool, flag: str) -> list:
    """TRACE arguments as bundles: a fleet directory (``host=H/rank=R/<bundle>``) as every bundle
    below it (engramprof.compare.dataset.expand)."""
    fleet = dataset.expand(traces, need_ranks=need_ranks)
    roots = [b.root for b in fleet if b.root is not None]
    if markers and roots:
        raise UserError(f"--markers pairs with bundle paths, and {roots[0]} is a directory of bundles: the bundles "
                        f"found below a directory use their own markers.jsonl (give {flag} bundle by bundle to pair "
                        "markers)")
    return fleet


def run_ranks(traces: list[Path], markers: list[Path] | None = None, *, clock_error_ms: float | None = None,
              slow_ms: float = 4.0, top: int = 10) -> tuple[dict, dict]:
    """``compare --ranks``: (the JSON document, arrays for the plot).  A bundle of several
    processes is split by pid, one rank per process."""
    if not traces:
        raise UserError("--ranks needs at least 2 traces (one per rank), or one trace of several processes")
    fleet = _expand(traces, markers, need_ranks=True, flag="--ranks")
    traces = [b.path for b in fleet]
    pairs = load.pair_markers(traces, markers)
    _check_all(traces, pairs)
    groups = [load.load_ranks(t, m, slow_ms=slow_ms) for t, m in zip(traces, pairs)]
    bundles = [b for g in groups for b in g]
    if len(bundles) < 2:
        raise UserError(f"{traces[0]}: one process, one rank: --ranks needs at least 2 traces (one per rank), or "
                        "one trace of several processes (recorded with --pid A --pid B, or --children)")
    names = [b.trace if b.pid is None or len(g) == 1 else f"{b.trace} (pid {b.pid})" for g in groups for b in g]
    labels = _rank_labels(traces, groups, [b.rank for b in fleet])
    fleet_host = [fb.host for fb, g in zip(fleet, groups) for _ in g]
    for b, name in zip(bundles, names):
        if not len(b.batches):
            raise UserError(f"{name}: no batches")
    al = align.align([b.batches for b in bundles], [b.meta for b in bundles], names,
                     [b.has_steps for b in bundles], clock_error_ms)
    W, C = ranks.matrices([b.batches for b in bundles], al.index)
    att = ranks.attribute(W, C)
    doc = ranks.summarise(W, att, labels, [b.trace for b in bundles], [b.batches for b in bundles])
    for r, b, h in zip(doc["ranks"], bundles, fleet_host):
        r["pid"] = b.pid
        r["host"] = h if h is not None else (str(b.meta["host"]) if b.meta.get("host") else None)
    notes = list(al.notes)
    warn = []
    for g in groups:
        b = g[0]
        if b.lost_records:
            warn.append(f"{b.trace} lost {b.lost_records:,} records (ring buffer full): batches in the holes are "
                        "left out")
        if b.summary.get("batch_source") != "markers":
            notes.append(f"{b.trace}: batches inferred from gaps in the read stream (no markers)")
        if len(g) > 1:
            notes.append(f"{b.trace}: {len(g)} processes, one rank each (pids {', '.join(str(x.pid) for x in g)}), "
                         "each analysed on its own as batch-tail does")
        notes.extend(f"{b.trace}: {n}" for n in b.notes if n.startswith(("left out: pid ", load.MARKERS_BY_TID)
                                                                        + PART_NOTES))
    hosts = sorted({r["host"] for r in doc["ranks"] if r["host"]})
    out = {"mode": "ranks", "gating_rank": doc["gating_rank"], "steps": int(len(al.steps)),
           "alignment": al.method, "alignment_error_ms": round(al.error_ms, 6),
           "alignment_error_source": al.error_source,
           "ranks": doc["ranks"], "lost_to_stragglers_ms": doc["lost_to_stragglers_ms"],
           "step_ms": doc["step_ms"], "median_rank_ms": doc["median_rank_ms"],
           "worst_steps": ranks.worst_steps(al.steps, W, att, labels, top),
           "hosts": hosts, "warnings": warn, "notes": notes}
    return out, {"steps": al.steps, "W": W, "att": att, "labels": labels}


#: the trace reader's notes about parts it skipped or could not trust: compare passes them on,
#: as batch-tail does (engramprof.trace.reader)
PART_NOTES = ("skipped ", "trace was not closed cleanly", "recording stopped early")


def run_before_after(before: list[Path], after: list[Path], markers: list[Path] | None = None, *,
                     slow_ms: float = 4.0, resamples: int = 1000, seed: int = 0) -> dict:
    """``compare --before --after``: the JSON document (``matched`` false: exit 3)."""
    before = [b.path for b in _expand(before, markers, need_ranks=False, flag="--before/--after")]
    after = [b.path for b in _expand(after, markers, need_ranks=False, flag="--before/--after")]
    pairs = load.pair_markers(list(before) + list(after), markers)
    bundles = _load_all(list(before) + list(after), pairs, slow_ms)
    bb, ab = bundles[:len(before)], bundles[len(before):]
    for b in bundles:
        if not len(b.batches):
            raise UserError(f"{b.trace}: no batches")
    doc = strata.compare(strata.side_frame(bb), strata.side_frame(ab), resamples=resamples, seed=seed)
    notes = []
    for b in bundles:
        if b.summary.get("batch_source") != "markers":
            notes.append(f"{b.trace}: batches inferred from gaps in the read stream (no markers): time before the "
                         "first read of a batch is not seen")
        notes.extend(f"{b.trace}: {n}" for n in b.notes if n.startswith(PART_NOTES))
    return {"mode": "before-after", **doc, "before": strata.side_facts(bb), "after": strata.side_facts(ab),
            "warnings": strata.warnings(bb, ab), "notes": notes}
