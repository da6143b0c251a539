"""compare --ranks on one bundle of several processes (recorded with --pid A --pid B or
--children): split by pid into ranks, each process analysed on its own as batch-tail does.
Hand-made bundles with known answers (no root); the real two-process recording is in
tests/test_compare_real.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.test_compare import make_rank, run

N_STEPS = 60
PIDS = (5100, 5101, 5102, 5103)


def merged_bundle(tmp_path, cold_rank: int = 2, *, marker_key: str | None = "pid", steps: bool = True,
                  processes_meta: bool = False, keep_markers: bool = True):
    """Four single-process bundles (rank ``cold_rank``'s steps mostly cold), and one bundle of
    the same events with one pid per rank; its markers say whose batch each line is by
    ``marker_key`` (pid, rank, tid: only the submitting thread, or None: no markers).  Returns (merged, singles, cold steps)."""
    from engramprof.trace import TraceWriter

    rng = np.random.default_rng(11)
    cold = rng.random(N_STEPS) < 0.8
    singles = [make_rank(tmp_path / f"single/rank={r}", cold if r == cold_rank else np.zeros(N_STEPS, bool), rng,
                         N_STEPS, steps_in_markers=steps) for r in range(len(PIDS))]
    calls, marks = [], []
    for r, (s, pid) in enumerate(zip(singles, PIDS)):
        c = pd.read_parquet(s / "calls")
        c["pid"] = pid
        if marker_key == "tid":  # threads of their own (tids are unique across processes)
            c["tid"] += 100 * r
        calls.append(c)
        for line in (s / "markers.jsonl").read_text().splitlines():
            m = json.loads(line)
            if marker_key == "pid":
                m["pid"] = pid
            elif marker_key == "rank":
                m["rank"] = r
            elif marker_key == "tid":
                m["tid"] = 1000 + 100 * r  # the submitting thread: one of its process's readers
            marks.append(m)
    metas = [json.loads((s / "meta.json").read_text()) for s in singles]
    calls = pd.concat(calls, ignore_index=True).sort_values("ts_ns", kind="stable").reset_index(drop=True)
    calls = calls.drop(columns=[c for c in ("kind",) if c in calls.columns])
    for c in ("path", "syscall", "tensor"):
        calls[c] = calls[c].astype(str)
    meta = {"pid": PIDS[0], "start_ns": min(m["start_ns"] for m in metas), "end_ns": max(m["end_ns"] for m in metas)}
    if processes_meta:
        meta["processes"] = [{"pid": p, "cmdline": f"server --rank {r}", "rank": r} for r, p in enumerate(PIDS)]
    out = tmp_path / "merged"
    w = TraceWriter(out, meta=meta)
    w.append_calls(calls)
    w.close()
    m = json.loads((out / "meta.json").read_text())
    m["clocks"] = metas[0]["clocks"]
    (out / "meta.json").write_text(json.dumps(m))
    if keep_markers and marker_key is not None:
        marks.sort(key=lambda x: x["start_ns"])
        (out / "markers.jsonl").write_text("".join(json.dumps(x) + "\n" for x in marks))
    return out, singles, cold


def _doc(*args):
    p = run(*args, "--json", "--resamples", "0")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_one_bundle_of_four_processes_is_four_ranks(tmp_path):
    merged, singles, cold = merged_bundle(tmp_path)
    doc = _doc("--ranks", merged)
    assert doc["alignment"] == "step-id" and doc["steps"] == N_STEPS
    assert [r["pid"] for r in doc["ranks"]] == list(PIDS)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]  # no rank recorded: the order of the pids
    assert doc["gating_rank"] == 2
    r2 = doc["ranks"][2]
    assert r2["gated_share"] >= cold.mean() - 0.02 and r2["top_cause"] == "residency"
    assert any("4 processes, one rank each" in n for n in doc["notes"])
    # the same events as four bundles give the same answer: the split is batch-tail's per process
    sep = _doc("--ranks", *singles)
    for a, b in zip(doc["ranks"], sep["ranks"]):
        assert a["gated_steps"] == b["gated_steps"] and a["top_cause"] == b["top_cause"], (a, b)
        assert a["excess_ms"] == pytest.approx(b["excess_ms"], rel=1e-6, abs=1e-6)
        assert a["batch_ms"] == pytest.approx(b["batch_ms"], rel=1e-6)
    assert doc["lost_to_stragglers_ms"] == pytest.approx(sep["lost_to_stragglers_ms"], rel=1e-6)


def test_markers_carrying_rank_and_the_bundles_process_list(tmp_path):
    """Markers say whose batch by ``rank``; the bundle's process list maps pid -> rank."""
    merged, _, _ = merged_bundle(tmp_path, cold_rank=1, marker_key="rank", processes_meta=True)
    doc = _doc("--ranks", merged)
    assert [(r["rank"], r["pid"]) for r in doc["ranks"]] == list(enumerate(PIDS))
    assert doc["steps"] == N_STEPS and doc["gating_rank"] == 1
    assert doc["ranks"][1]["top_cause"] == "residency"


def test_without_markers_the_processes_align_on_their_one_clock(tmp_path):
    """No markers: each process's batches are inferred from its own read stream, and the ranks
    align by time on the bundle's one CLOCK_MONOTONIC (error 0)."""
    merged, _, cold = merged_bundle(tmp_path, cold_rank=3, marker_key=None)
    doc = _doc("--ranks", merged)
    assert doc["alignment"] == "clock" and doc["alignment_error_ms"] == 0
    assert "one bundle" in doc["alignment_error_source"]
    assert doc["steps"] >= N_STEPS - 2
    assert doc["gating_rank"] == 3 and doc["ranks"][3]["gated_share"] >= cold.mean() - 0.05


def test_a_bundle_of_one_process_alone_is_not_ranks(tmp_path):
    one = make_rank(tmp_path / "one", np.zeros(10, bool), np.random.default_rng(0), 10)
    p = run("--ranks", one)
    assert p.returncode == 2 and "one process" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_multi_process_bundle_beside_single_process_bundles(tmp_path):
    """Ranks 0-3 in one bundle and a fifth rank in its own: five ranks, the fifth's label its
    position."""
    merged, singles, _ = merged_bundle(tmp_path)
    doc = _doc("--ranks", merged, singles[0])
    assert len(doc["ranks"]) == 5 and doc["ranks"][4]["trace"] == str(singles[0])
    assert doc["gating_rank"] == 2


def test_markers_naming_only_their_thread(tmp_path):
    """Markers with neither pid nor rank: each line's tid (the submitting thread) gives its pid;
    a line whose thread never appears is left out, with a note."""
    merged, _, cold = merged_bundle(tmp_path, cold_rank=1, marker_key="tid")
    mk = merged / "markers.jsonl"
    lines = mk.read_text().splitlines()
    stray = json.loads(lines[0])
    stray.update(tid=999_999, step=10_000)
    mk.write_text("\n".join(lines + [json.dumps(stray)]) + "\n")
    doc = _doc("--ranks", merged)
    assert doc["alignment"] == "step-id" and doc["steps"] == N_STEPS
    assert doc["gating_rank"] == 1 and doc["ranks"][1]["gated_share"] >= cold.mean() - 0.02
    assert all(r["batches"] == N_STEPS for r in doc["ranks"]), doc["ranks"]  # not every marker on every pid
    assert any("each line's pid is its thread's" in n and "1 line(s)" in n for n in doc["notes"]), doc["notes"]
