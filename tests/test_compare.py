"""engramprof compare on hand-made bundles with known answers (no root): step alignment (step id
and clock), straggler attribution, stratification, the bootstrap interval maths, bad input.

Bundles are written with TraceWriter from hand-built calls: a batch is 32 concurrent reads by
32 threads; a cached read lasts 15-30 µs, a cold one 2 ms with one page inserted and its wait
spent off-CPU on one bio (normal service = its own: residency, not storage).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engramprof.analysis.verdicts import CAUSES
from engramprof.compare import align, ranks, stats, strata
from engramprof.errors import UserError

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
T0 = 2_000_000_000_000
THREADS = 32


def _calls(batches: list[tuple[int, np.ndarray, np.ndarray]]) -> pd.DataFrame:
    """batches: (start ns, per-read duration ns, per-read cold flag)."""
    ts, dur, tid, pages = [], [], [], []
    for t, d, cold in batches:
        n = len(d)
        ts.append(t + 20_000 + np.arange(n) * 500)
        dur.append(d)
        tid.append(1000 + np.arange(n) % THREADS)
        pages.append(cold.astype(float))
    ts, dur, tid, pages = map(np.concatenate, (ts, dur, tid, pages))
    n = len(ts)
    cold = pages > 0
    df = pd.DataFrame({"ts_ns": ts.astype(np.int64), "dur_ns": dur.astype(np.int64), "pid": 4242,
                       "tid": tid.astype(np.int64), "path": "/data/engram.safetensors",
                       "offset": (np.arange(n) * 4096).astype(np.int64), "size": 4096, "ret": 4096, "flags": 0,
                       "syscall": "preadv2", "fd": 7, "pages_added": pages.astype(np.int64), "bio_count": cold.astype(np.int64),
                       "bio_ns": np.where(cold, dur * 9 // 10, 0), "reclaim_ns": 0,
                       "offcpu_ns": np.where(cold, dur * 9 // 10, 0), "runq_ns": 0, "path_stale": False,
                       "tensor": "", "row": -1})
    return df


def make_rank(path: Path, cold_steps: np.ndarray, rng, n_steps: int, *, reads: int = 32, step_ms: float = 5.0,
              clock_offset_ns: int = 0, steps_in_markers: bool = True, boot_id: str = "boot-a",
              t0: int = T0, first_step: int = 0) -> Path:
    """A bundle (and its markers.jsonl) of n_steps batches, one every step_ms; cold steps'
    reads take 2 ms and miss.  ``clock_offset_ns``: this host's realtime - monotonic."""
    from engramprof.trace import TraceWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    batches, marks = [], []
    for s in range(n_steps):
        t = t0 + int(s * step_ms * 1e6) + int(rng.integers(0, 50_000))
        cold = np.full(reads, bool(cold_steps[s]))
        d = np.where(cold, rng.integers(1_900_000, 2_100_000, reads), rng.integers(15_000, 30_000, reads))
        batches.append((t, d, cold))
        end = int(t + 20_000 + (reads - 1) * 500 + d.max() + 10_000)
        m = {"start_ns": t, "end_ns": end, "tid": -1, "rows": reads}
        if steps_in_markers:
            m["step"] = first_step + s
        marks.append(m)
    w = TraceWriter(path, meta={"pid": 4242, "start_ns": t0 - 10**6, "end_ns": marks[-1]["end_ns"] + 10**6})
    w.append_calls(_calls(batches))
    w.close()
    meta = json.loads((path / "meta.json").read_text())
    mono0, mono1 = t0 - 10**6, marks[-1]["end_ns"] + 10**6
    meta["clocks"] = {"start": {"monotonic_ns": mono0, "realtime_ns": mono0 + clock_offset_ns,
                                "boottime_ns": mono0, "read_ns": 1000},
                      "end": {"monotonic_ns": mono1, "realtime_ns": mono1 + clock_offset_ns,
                              "boottime_ns": mono1, "read_ns": 1000},
                      "boot_id": boot_id, "ntp": {"synchronized": True, "esterror_us": 200, "maxerror_us": 5000}}
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "markers.jsonl").write_text("".join(json.dumps(m) + "\n" for m in marks))
    return path


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "engramprof", "compare", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


# ------------------------------------------------------------------ straggler attribution --

def test_excess_split_sums_to_the_excess_and_names_its_cause():
    # 1 step, 4 ranks: walls 1, 2, 3, 10; median 2.5 = mean of ranks 1 and 2
    W = np.array([[1.0, 2.0, 3.0, 10.0]])
    K = len(CAUSES)
    C = np.zeros((1, 4, K))
    C[0, :, CAUSES.index("cpu-copy")] = [1, 2, 3, 2]
    C[0, 3, CAUSES.index("residency")] = 8
    att = ranks.attribute(W, C)
    assert att["gate"][0] == 3
    assert att["excess"][0] == pytest.approx(7.5)
    assert att["diff"][0].sum() == pytest.approx(7.5)
    assert CAUSES[att["top"][0]] == "residency"
    assert att["diff"][0][CAUSES.index("residency")] == pytest.approx(8.0)
    # odd count: the middle rank is the reference
    med, _ = ranks.reference(np.array([[1.0, 5.0, 2.0]]), np.zeros((1, 3, K)))
    assert med[0] == 2.0


def test_cold_rank_gates_most_steps_with_cause_residency(tmp_path):
    rng = np.random.default_rng(1)
    n = 60
    cold = rng.random(n) < 0.8
    traces = []
    for r in range(4):
        traces.append(make_rank(tmp_path / f"rank={r}", cold if r == 2 else np.zeros(n, bool), rng, n))
    p = run("--ranks", *traces, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["alignment"] == "step-id" and doc["steps"] == n
    assert doc["gating_rank"] == 2
    r2 = next(r for r in doc["ranks"] if r["rank"] == 2)
    assert r2["gated_share"] >= cold.mean() - 0.02
    assert r2["top_cause"] == "residency"
    assert r2["excess_ms"] > 0.8 * cold.sum() * 1.5  # each cold step: ~2 ms over a ~0.05 ms median
    assert doc["lost_to_stragglers_ms"] >= r2["excess_ms"]
    assert sum(r["gated_share"] for r in doc["ranks"]) == pytest.approx(1.0, abs=1e-3)


def test_without_a_fault_no_rank_gates_more_than_its_fair_share(tmp_path):
    """4 identical ranks, 200 steps: each should gate ~25%; the margin allowed is 0.15
    (a binomial(200, 0.25) share exceeds 0.40 with probability < 1e-5)."""
    rng = np.random.default_rng(2)
    n = 200
    traces = [make_rank(tmp_path / f"r{r}", np.zeros(n, bool), rng, n) for r in range(4)]
    doc = json.loads(run("--ranks", *traces, "--json", "--resamples", "0").stdout)
    assert max(r["gated_share"] for r in doc["ranks"]) <= 0.25 + 0.15


def test_clock_alignment_across_hosts(tmp_path):
    """Two hosts, monotonic clocks 7 s apart, realtime offsets making them line up; steps by
    clock (no step ids): every step matched, the stated error the NTP estimates' sum."""
    rng = np.random.default_rng(3)
    n = 40
    a = make_rank(tmp_path / "host=a" / "rank=0", np.zeros(n, bool), rng, n, steps_in_markers=False,
                  clock_offset_ns=10**18, boot_id="a")
    b = make_rank(tmp_path / "host=b" / "rank=1", np.ones(n, bool), rng, n, steps_in_markers=False,
                  t0=T0 + 7 * 10**9, clock_offset_ns=10**18 - 7 * 10**9, boot_id="b")
    doc = json.loads(run("--ranks", a, b, "--json").stdout)
    assert doc["alignment"] == "clock"
    assert doc["steps"] == n
    assert doc["alignment_error_ms"] == pytest.approx(0.4)
    assert "NTP" in doc["alignment_error_source"]
    assert doc["gating_rank"] == 1
    # a clock error of half a step or more cannot align 5 ms steps
    p = run("--ranks", a, b, "--clock-error-ms", "3")
    assert p.returncode == 2 and "half a step" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_clock_alignment_unit_offsets():
    m0 = {"clocks": {"start": {"monotonic_ns": 0, "realtime_ns": 100}, "end": {"monotonic_ns": 1000,
                                                                             "realtime_ns": 1200}}}
    f = align._offset_fn(m0["clocks"])
    assert f(np.array([0.0, 500.0, 1000.0])).tolist() == [100.0, 650.0, 1200.0]  # slewed: interpolated


def test_bad_input_is_one_line_exit_2(tmp_path):
    rng = np.random.default_rng(4)
    a = make_rank(tmp_path / "a", np.zeros(10, bool), rng, 10, steps_in_markers=False)
    b = make_rank(tmp_path / "b", np.zeros(10, bool), rng, 10, steps_in_markers=False, boot_id="other")
    meta = json.loads((b / "meta.json").read_text())
    del meta["clocks"]
    (b / "meta.json").write_text(json.dumps(meta))
    p = run("--ranks", a, b)
    assert p.returncode == 2 and "records no clocks" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    meta["format_version"] = 2
    (b / "meta.json").write_text(json.dumps(meta))
    p = run("--ranks", a, b)
    assert p.returncode == 2 and "different trace format versions" in p.stderr, p.stderr
    for args in (("--ranks", a), ("--before", a), ("--before", a, "--after", b, a), ("--ranks", a, b, "--before", a),
                 ("--ranks", a, b, "--markers", a / "markers.jsonl")):
        p = run(*args)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, args


def test_plot_heat_map(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(5)
    traces = [make_rank(tmp_path / f"r{r}", np.arange(30) % 3 == 0 if r == 1 else np.zeros(30, bool), rng, 30)
              for r in range(3)]
    png = tmp_path / "h.png"
    p = run("--ranks", *traces, "--plot", png)
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gating rank: 1" in p.stdout


def test_identical_ranks_name_no_gating_rank(tmp_path):
    """Two ranks with the same batches: no rank is slower than the median, so none gates (it
    named rank 0, "0 ms over the median rank")."""
    traces = [make_rank(tmp_path / f"r{r}", np.zeros(20, bool), np.random.default_rng(9), 20) for r in range(2)]
    doc = json.loads(run("--ranks", *traces, "--json").stdout)
    assert doc["gating_rank"] is None, doc["gating_rank"]
    assert all(r["gated_steps"] == 0 and r["excess_ms"] == 0 for r in doc["ranks"])
    p = run("--ranks", *traces)
    assert p.returncode == 0, p.stderr
    assert "gating rank:" not in p.stdout and "no rank gates" in p.stdout, p.stdout


def test_a_skipped_part_is_noted_as_batch_tail_notes_it(tmp_path):
    """A foreign Parquet file in a bundle's calls/: batch-tail skips it with a note; compare
    skipped it in silence."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(10)
    traces = [make_rank(tmp_path / f"r{r}", np.zeros(20, bool), rng, 20) for r in range(2)]
    pq.write_table(pa.table({"a": [1, 2, 3]}), traces[1] / "calls" / "part-999999.parquet")
    bt = json.loads(subprocess.run([PY, "-m", "engramprof", "batch-tail", traces[1], "--json"], capture_output=True,
                                   text=True, cwd=REPO, timeout=300).stdout)
    assert any("part-999999.parquet" in n for n in bt["notes"]), bt["notes"]
    doc = json.loads(run("--ranks", *traces, "--json").stdout)
    assert any("part-999999.parquet" in n and str(traces[1]) in n for n in doc["notes"]), doc["notes"]
    doc = json.loads(run("--before", traces[0], "--after", traces[1], "--json", "--resamples", "50").stdout)
    assert any("part-999999.parquet" in n for n in doc["notes"]), doc["notes"]


# ------------------------------------------------------------------ stratification, intervals --

def _side(rng, n_by_stratum: dict, med_by_stratum: dict) -> pd.DataFrame:
    parts = []
    for s, n in n_by_stratum.items():
        w = med_by_stratum[s] * np.exp(rng.normal(0, 0.3, n))
        d = {"wall_ms": w, "stratum": s}
        for c in ranks.MS_COLS:
            d[c] = w / len(ranks.MS_COLS)
        parts.append(pd.DataFrame(d))
    return pd.concat(parts, ignore_index=True)


def test_point_quantiles_are_numpys_inverted_cdf():
    rng = np.random.default_rng(6)
    x = rng.exponential(1.0, 1001)
    s = stats.Sample(x, np.ones((len(x), 6)), np.zeros(len(x), int), np.ones(1))
    e = stats.estimate(s, 0, rng)
    assert e.point["p50"] == np.quantile(x, 0.5, method="inverted_cdf")
    assert e.point["p99"] == np.quantile(x, 0.99, method="inverted_cdf")


def test_ratio_interval_covers_the_true_ratio_and_excludes_1():
    """after is 0.6x before: the 95% interval of the p50 ratio covers 0.6 and lies below 1;
    with 1000 resamples the interval is reproducible from the seed."""
    rng = np.random.default_rng(7)
    b = _side(rng, {"decode": 400}, {"decode": 1.0})
    a = _side(rng, {"decode": 400}, {"decode": 0.6})
    doc = strata.compare(b, a, resamples=1000, seed=0)
    assert doc["matched"]
    o = doc["overall"]
    assert o["ci"][0] < 0.6 < o["ci"][1] and o["ci"][1] < 1
    assert abs(o["ratio"] - 0.6) < 0.08
    assert strata.compare(b, a, resamples=1000, seed=0)["overall"]["ci"] == o["ci"]
    # no difference: the interval holds 1
    same = strata.compare(b, _side(rng, {"decode": 400}, {"decode": 1.0}), resamples=1000, seed=0)
    assert same["overall"]["ci"][0] < 1 < same["overall"]["ci"][1]


def test_interval_coverage_is_about_95_percent():
    """Over 60 repetitions with a true ratio of 1, the interval holds 1 in at least 50."""
    rng = np.random.default_rng(8)
    hits = 0
    for i in range(60):
        b = _side(rng, {"d": 150}, {"d": 1.0})
        a = _side(rng, {"d": 150}, {"d": 1.0})
        ci = strata.compare(b, a, resamples=300, seed=i)["overall"]["ci"]
        hits += ci[0] <= 1 <= ci[1]
    assert hits >= 50


def test_reweighting_to_a_common_mix_removes_a_mix_shift():
    """Same per-stratum times; before 50/50 decode/prefill, after 90/10: the pooled median
    moves ~10x, the reweighted overall does not."""
    rng = np.random.default_rng(9)
    med = {"decode": 1.0, "prefill": 10.0}
    b = _side(rng, {"decode": 300, "prefill": 300}, med)
    a = _side(rng, {"decode": 540, "prefill": 60}, med)
    doc = strata.compare(b, a, resamples=500, seed=0)
    pooled = np.median(a["wall_ms"]) / np.median(b["wall_ms"])
    assert pooled < 0.5
    assert doc["matched"]
    o = doc["overall"]
    assert o["ci"][0] < 1 < o["ci"][1]
    assert o["mix"] == {"decode": pytest.approx(0.7), "prefill": pytest.approx(0.3)}
    assert {s["stratum"] for s in doc["strata"]} == {"decode", "prefill"}


def test_unmatched_when_most_time_is_in_strata_the_other_side_lacks():
    rng = np.random.default_rng(10)
    med = {"decode": 1.0, "prefill": 10.0}
    b = _side(rng, {"decode": 300}, med)
    a = _side(rng, {"decode": 300, "prefill": 100}, med)  # prefill: ~77% of after's time
    doc = strata.compare(b, a, resamples=200, seed=0)
    assert not doc["matched"] and doc["overall"] is None
    assert "after has" in doc["reason"] and "lacks" in doc["reason"]
    assert [s["stratum"] for s in doc["strata"]] == ["decode"]  # the shared stratum still reported
    assert doc["dropped"][0]["stratum"] == "prefill" and doc["dropped"][0]["after_time_share"] > 0.5


def test_strata_names_from_the_batch_table():
    t = pd.DataFrame({"rows": [96, 500, 40_000, 100_000], "read_path": ["syscall", "fault", "syscall", "none"],
                      "resident_frac": [1.0, 0.6, 0.1, np.nan]})
    assert strata.stratum_of(t).tolist() == [
        "decode <128 rows, syscall, cached", "decode 128-1023 rows, fault, part cached",
        "prefill 8k-64k rows, syscall, cold", "prefill 64k+ rows, none, residency unknown"]


def test_before_after_cli_exit_3_when_unmatched(tmp_path):
    rng = np.random.default_rng(11)
    b = make_rank(tmp_path / "before", np.zeros(40, bool), rng, 40)
    a1 = make_rank(tmp_path / "after1", np.zeros(40, bool), rng, 40)
    a2 = make_rank(tmp_path / "after2", np.ones(40, bool), rng, 40)  # cold: its own stratum, most of the time
    p = run("--before", b, "--after", a1, "--json", "--resamples", "200")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["matched"]
    p = run("--before", b, "--after", a1, "--after", a2, "--json", "--resamples", "200")
    assert p.returncode == 3, p.stderr
    doc = json.loads(p.stdout)
    assert doc["matched"] is False and doc["overall"] is None and doc["reason"]
    assert len(doc["strata"]) == 1
    assert any("single" in w for w in doc["warnings"])
    p = run("--before", b, "--after", a1, "--after", a2, "--resamples", "200")
    assert p.returncode == 3 and "unmatched" in p.stdout


def test_rank_labels_from_paths():
    from engramprof.compare.load import rank_label

    assert rank_label("/d/host=a/rank=3/trace", 0) == 3
    assert rank_label("/d/t-rank7", 1) == 7
    assert rank_label("/d/trace", 5) == 5
