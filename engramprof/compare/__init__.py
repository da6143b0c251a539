"""``engramprof compare``: which rank gates each step; a matched, stratified before/after.

Modules: :mod:`.load` (one bundle -> its per-batch table, batch-tail's split, events released),
:mod:`.align` (steps across ranks: step id, else clocks), :mod:`.ranks` (straggler
attribution), :mod:`.strata` and :mod:`.stats` (stratified before/after with bootstrap
intervals), :mod:`.dataset` (many bundles as one DuckDB / pyarrow dataset), :mod:`.render`.
The page: docs/commands/compare.md.
"""
from __future__ import annotations

from pathlib import Path

from engramprof.errors import UserError

#: the exit status of an unmatched before/after comparison
EXIT_UNMATCHED = 3


def _load_all(traces: list[Path], markers: list[Path | None], slow_ms: float) -> list:
    from engramprof.compare import dataset, load

    metas = [(str(t), load.read_meta(t)) for t in traces]
    load.check_same_format(metas)
    dataset.check_calls(traces, markers)  # pyarrow.dataset: row counts from the footers only
    return [load.load(t, m, slow_ms=slow_ms) for t, m in zip(traces, markers)]


def run_ranks(traces: list[Path], markers: list[Path] | None = None, *, clock_error_ms: float | None = None,
              slow_ms: float = 4.0, top: int = 10) -> tuple[dict, dict]:
    """``compare --ranks``: (the JSON document, arrays for the plot)."""
    from engramprof.compare import align, load, ranks

    if len(traces) < 2:
        raise UserError("--ranks needs at least 2 traces (one per rank)")
    pairs = load.pair_markers(traces, markers)
    bundles = _load_all(traces, pairs, slow_ms)
    names = [b.trace for b in bundles]
    labels = [load.rank_label(t, i) for i, t in enumerate(traces)]
    if len(set(labels)) < len(labels):
        labels = list(range(len(traces)))
    for b in bundles:
        if not len(b.batches):
            raise UserError(f"{b.trace}: no batches")
    al = align.align([b.batches for b in bundles], [b.meta for b in bundles], names,
                     [b.has_steps for b in bundles], clock_error_ms)
    W, C = ranks.matrices([b.batches for b in bundles], al.index)
    att = ranks.attribute(W, C)
    doc = ranks.summarise(W, att, labels, names, [b.batches for b in bundles])
    notes = list(al.notes)
    warn = []
    for b in bundles:
        if b.lost_records:
            warn.append(f"{b.trace} lost {b.lost_records:,} records (ring buffer full): batches in the holes are "
                        "left out")
        if b.summary.get("batch_source") != "markers":
            notes.append(f"{b.trace}: batches inferred from gaps in the read stream (no markers)")
    hosts = sorted({str(b.meta.get("host")) for b in bundles if b.meta.get("host")})
    out = {"mode": "ranks", "gating_rank": doc["gating_rank"], "steps": int(len(al.steps)),
           "alignment": al.method, "alignment_error_ms": round(al.error_ms, 6),
           "alignment_error_source": al.error_source,
           "ranks": doc["ranks"], "lost_to_stragglers_ms": doc["lost_to_stragglers_ms"],
           "step_ms": doc["step_ms"], "median_rank_ms": doc["median_rank_ms"],
           "worst_steps": ranks.worst_steps(al.steps, W, att, labels, top),
           "hosts": hosts, "warnings": warn, "notes": notes}
    return out, {"steps": al.steps, "W": W, "att": att, "labels": labels}


def run_before_after(before: list[Path], after: list[Path], markers: list[Path] | None = None, *,
                     slow_ms: float = 4.0, resamples: int = 1000, seed: int = 0) -> dict:
    """``compare --before --after``: the JSON document (``matched`` false: exit 3)."""
    from engramprof.compare import load, strata

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
    return {"mode": "before-after", **doc, "before": strata.side_facts(bb), "after": strata.side_facts(ab),
            "warnings": strata.warnings(bb, ab), "notes": notes}
