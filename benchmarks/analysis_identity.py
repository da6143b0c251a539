#!/usr/bin/env python3
"""Same answers, bit for bit: batch-tail's per-batch table and summary JSON, and compare
--ranks' JSON, saved from one tree and checked against another.

    .venv/bin/python benchmarks/analysis_identity.py save  OUT CASE...   # before a change
    .venv/bin/python benchmarks/analysis_identity.py check OUT CASE...   # after it

A CASE is ``TRACE`` (batches inferred), ``TRACE:MARKERS`` (batches from markers) or
``ranks:FLEET_DIR`` (``compare --ranks FLEET_DIR``'s JSON document).  Each case is loaded the
way the command line loads it (``load_bundle(columns=EVENT_READ_COLUMNS, compact=True, later=LATER_COLUMNS)``)
and analysed by ``engramprof.analysis.analyse``; saved are the table (pickle) and the summary
(strict JSON text).  ``check`` compares every column's dtype and bytes (numeric columns) or
values (others), and the JSON text, and prints one line per case: ``same`` or what differs.
Exit 1 when any case differs.
"""
from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _key(case: str) -> str:
    return hashlib.sha1(case.encode()).hexdigest()[:12]


def _run(case: str):
    """(table or None, JSON text) of one case."""
    import json

    from engramprof.analysis import analyse, batches
    from engramprof.report import batch_tail as report
    from engramprof.trace import EVENT_READ_COLUMNS, LATER_COLUMNS, load_bundle

    if case.startswith("ranks:"):
        from engramprof import compare

        doc, _ = compare.run_ranks([Path(case[len("ranks:"):])])
        return None, json.dumps(doc, sort_keys=True, default=str)
    trace, _, markers = case.partition(":")
    tr = load_bundle(trace, columns=EVENT_READ_COLUMNS, compact=True, later=LATER_COLUMNS)
    mdf, bad = batches.read_markers(Path(markers)) if markers else (None, 0)
    res = analyse(tr, mdf, markers_bad_lines=bad)
    return res.batches, report.to_json(res.summary)


def _diff(a, b) -> list[str]:
    import numpy as np
    import pandas as pd

    if list(a.columns) != list(b.columns):
        return [f"columns {list(a.columns)} != {list(b.columns)}"]
    if len(a) != len(b):
        return [f"rows {len(a)} != {len(b)}"]
    out = []
    for c in a.columns:
        x, y = a[c], b[c]
        if str(x.dtype) != str(y.dtype):
            out.append(f"{c}: dtype {x.dtype} != {y.dtype}")
        elif isinstance(x.dtype, np.dtype) and x.dtype.kind in "iufb":
            if x.to_numpy().tobytes() != y.to_numpy().tobytes():
                out.append(f"{c}: values differ ({int((x.to_numpy() != y.to_numpy()).sum())} rows)")
        elif not pd.Series(x.to_numpy(object)).equals(pd.Series(y.to_numpy(object))):
            out.append(f"{c}: values differ")
    return out


def _json_diff(a: str, b: str) -> str:
    """The top-level keys whose values differ (added, removed or changed), in words."""
    import json

    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return "not JSON"
    if not isinstance(x, dict) or not isinstance(y, dict):
        return "values differ"
    added = sorted(set(y) - set(x))
    removed = sorted(set(x) - set(y))
    changed = sorted(k for k in set(x) & set(y) if x[k] != y[k])
    parts = [f"{what} {', '.join(keys)}" for what, keys in (("added", added), ("removed", removed),
                                                             ("changed", changed)) if keys]
    return "; ".join(parts) or "key order"


def main() -> int:
    sys.path.insert(0, str(REPO))
    if len(sys.argv) < 4 or sys.argv[1] not in ("save", "check"):
        print(__doc__)
        return 2
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    bad = 0
    for case in sys.argv[3:]:
        table, text = _run(case)
        f = out / f"{_key(case)}.pkl"
        if mode == "save":
            f.write_bytes(pickle.dumps({"case": case, "table": table, "json": text}))
            print(f"saved {case}: {0 if table is None else len(table)} batches")
            continue
        ref = pickle.loads(f.read_bytes())
        why = [] if table is None else _diff(ref["table"], table)
        if ref["json"] != text:
            why.append("summary JSON differs: " + _json_diff(ref["json"], text))
        bad += bool(why)
        print(f"{'same' if not why else 'DIFFERENT'}  {case}" + ("".join(f"\n    {w}" for w in why)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
