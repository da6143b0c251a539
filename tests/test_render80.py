"""Every command's output at 80 columns, piped (COLUMNS=80, not a terminal): no line is wider
than 80, and the numbers and names a decision rests on (offsets, durations, arm names,
speedups, tensor names, residency counts, batch counts) appear whole.

Commands that need no root or eBPF run as subprocesses on a small lab table and a synthetic
trace; `syscalls` and `diagnose` (which need a live target) are rendered from their summary
dicts by the same functions the commands call.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from tests.synthetic import engramprof, fs_type, planned_trace

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
WIDTH = 80


def run(*args) -> str:
    return engramprof(*args, columns=WIDTH)


def fits(text: str) -> None:
    wide = [l for l in text.splitlines() if len(l.rstrip()) > WIDTH]
    assert not wide, "lines wider than 80:\n" + "\n".join(wide)


def whole(text: str, *items: str) -> None:
    """Each item appears unbroken on one line, and nothing is cut with an ellipsis mid-number."""
    for it in items:
        assert any(it in line for line in text.splitlines()), f"{it!r} not whole in:\n{text}"
    assert not re.search(r"\d…|…\d", text), f"a number cut with an ellipsis:\n{text}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A small lab table and a synthetic trace of its planned reads (4 batches, 20 ms apart)
    with markers, as in test_docs; one slow call whose offset must be shown whole."""
    d = tmp_path_factory.mktemp("r80")
    if fs_type(d) in ("tmpfs", "ramfs"):
        pytest.skip("residency and replay need a filesystem with a droppable page cache")
    t = d / "a-rather-long-directory-name-for-the-table" / "engram-table.safetensors"
    t.parent.mkdir()
    return planned_trace(d, t, steps=4, slow_call=True)


def test_batch_tail_at_80(lab):
    out = run("batch-tail", lab["trace"], "--markers", lab["markers"])
    fits(out)
    s = json.loads(run("batch-tail", lab["trace"], "--markers", lab["markers"], "--json"))
    whole(out, f"batch-tail: {s['batches']:,} batches", f"@{lab['slow_offset']:,}", s["verdict"])


def test_replay_at_80(lab):
    out = run("replay", lab["trace"], "--markers", lab["markers"], "--rounds", "1", "--threads", "4")
    fits(out)
    for arm in ("pool", "nowait", "serial"):
        assert re.search(rf"│ {arm}\s+│", out), f"arm {arm} not whole:\n{out}"
    assert re.search(r"│\s+\d+\.\d\dx │", out), f"speedup not whole:\n{out}"


def test_replay_and_batch_tail_agree_on_the_batch_count(lab, tmp_path):
    """Inferred batches: replay segments the trace as batch-tail does (cut edge batches out)."""
    from engramprof.trace import TraceWriter, load_bundle

    tr = load_bundle(lab["trace"])
    # a recording window that starts right at the first call: its first batch may be cut
    first, last = int(tr.calls["ts_ns"].iloc[0]), int(tr.calls["ts_ns"].iloc[-1])
    w = TraceWriter(tmp_path / "t", meta={"start_ns": first - 1000, "end_ns": last + 10**9})
    w.append_calls(tr.calls)
    w.close()
    bt = json.loads(run("batch-tail", tmp_path / "t", "--json"))
    assert bt["batches"] == 3  # of 4: the first may have been cut by the recording's start
    rp = json.loads(run("replay", tmp_path / "t", "--rounds", "1", "--threads", "2", "--batches", "100", "--json"))
    assert rp["batches"] == bt["batches"], (rp["batches"], bt["batches"], rp["notes"])


def test_compare_at_80(lab):
    """compare's prose (the matched / unmatched line, warnings, notes) breaks between clauses at
    80 columns like the other commands; the verdict words and the ratio stay whole."""
    args = ("compare", "--before", lab["trace"], "--after", lab["trace"], "--markers", lab["markers"],
            "--markers", lab["markers"])
    out = engramprof(*args, columns=WIDTH, check=False)  # exit 3 when unmatched (4 batches a side)
    fits(out)
    doc = json.loads(engramprof(*args, "--json", columns=WIDTH, check=False))
    whole(out, "matched:" if doc["matched"] else "unmatched:")
    if doc["matched"] and doc["overall"]:
        whole(out, f"{doc['overall']['ratio']:.2f}")


def test_residency_at_80(lab):
    out = run("residency", lab["table"], "--tensors", "--ranges", "2")
    fits(out)
    whole(out, "layers.3.engram.embed.weight", "layers.17.engram.embed.scale", "rows 2,048-4,095")
    out = run("residency", "--rows", lab["trace"])
    fits(out)
    whole(out, "engram-table.safetensors")


def test_lab_run_at_80(lab):
    out = run("lab", "run", "--table", lab["table"], "--steps", "20", "--threads", "4")
    fits(out)
    s = json.loads(run("lab", "run", "--table", lab["table"], "--steps", "20", "--threads", "4", "--json"))
    assert s["distinct_rows"] <= 2 * 4096 and s["distinct_rows"] <= s["unique_rows"]
    whole(out, "distinct", f"{s['distinct_rows']:,}")


def test_help_at_80_breaks_no_sentence():
    out = run("syscalls", "--help")
    fits(out)
    assert "Ends on Ctrl-C" in out, out  # not "Ends on" / "Ctrl-C" on two lines at a source line end


def _syscalls_summary(path: str) -> dict:
    slow = []
    for i, (dur, off, bio, miss) in enumerate([(1160.5, 2_271_234_567_890, 0.0, 0), (237.0, 18_110_960, 237.0, 12),
                                               (198.7, 34_405_056, 0.0, 0)]):
        slow.append({"dur_us": dur, "tid": 24060 + i, "path": path, "offset": off, "size": 256, "pages_added": miss,
                     "bio_us": bio, "reclaim_us": 0.0, "offcpu_us": 150.0 + i, "runq_us": 100.0 + i})
    return {
        "pid": 4242, "duration_s": 3.0, "end_reason": "duration", "calls": 83322, "calls_per_s": 27526.0,
        "recorded": 83034, "partial_at_start": 288, "lost_records": 0,
        "latency_us": {"p50": 1.3, "p99": 4.2, "max": 1160.5}, "latency_source": "records",
        "eagain_rate": 0.0, "nowait_share": 0.0,
        "evidence": {"calls_with_misses": 1, "pages_added": 12, "bio_ms": 0.2, "reclaim_ms": 0.0, "offcpu_ms": 1.4,
                     "runq_ms": 1.4},
        "output": "/var/tmp/t1",
        "files": [{"path": path, "calls": 83034, "total_ms": 120.3, "max_us": 1160.5, "calls_with_misses": 1,
                   "eagain": 0}],
        "tensors": [{"tensor": "layers.17.engram.embed.weight", "calls": 20760, "total_ms": 31.4, "max_us": 122.1,
                     "calls_with_misses": 0}],
        "slowest": slow, "notes": [],
    }


@pytest.mark.parametrize("path", ["/var/tmp/t.st",
                                  "/data/models/engram/a/very/long/path/to/the/table-of-embeddings.safetensors",
                                  "/tmp/audit11/pt/a-rather-long-directory-name-for-the-table-xx/engram-table.safetensors"])
def test_syscalls_summary_at_80(path):
    from engramprof.report import syscalls as report_syscalls

    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=WIDTH), _syscalls_summary(path))
    out = buf.getvalue()
    fits(out)
    whole(out, "2,271,234,567,890", "18,110,960", "237.0 µs", "1.16 ms", "layers.17.engram.embed.weight")
    # the one file of the slowest calls: on one line, whole when it fits, else its end (its name)
    line = next(l for l in out.splitlines() if "slowest calls" in l)
    assert line.rstrip().endswith(path if len(path) <= WIDTH - len("slowest calls, all in ") else
                                  path.rsplit("/", 1)[-1]), line


def test_diagnose_limits_wrap_under_their_text():
    from engramprof.report import diagnose

    d = {"verdict": "residency", "confidence": 0.9, "verdict_share": 0.6, "runner_up": None,
         "evidence": [{"step": "residency of their pages", "finding": "the 20,000 most-read of 68,390 distinct rows"}],
         "limits": ["residency of the hot rows is observed after the window and can change right after it is "
                    "observed, by other processes or by reclaim"],
         "recommendation": {"fix": "keep the hot rows resident: " + "more words to wrap " * 6, "confirm": "rerun"},
         "batch_tail": {"notes": ["a long note " * 10]}}
    buf = io.StringIO()
    diagnose.render(Console(file=buf, width=WIDTH), d)
    out = buf.getvalue()
    fits(out)
    whole(out, "the 20,000 most-read of 68,390 distinct rows")
    lines = out.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("  - residency of the hot rows"))
    assert lines[i + 1].startswith("    "), lines[i:i + 2]  # continues under its text, not at column 0
    j = next(k for k, l in enumerate(lines) if l.startswith("fix to try:"))
    assert lines[j + 1].startswith("      "), lines[j:j + 2]


def test_diagnose_hot_rows_say_when_capped(tmp_path):
    from engramprof.analysis import diagnose
    from engramprof.lab import table

    t = tmp_path / "t.safetensors"
    table.make_table(t, rows=512, seed=1)
    n = 300
    calls = pd.DataFrame({"path": [str(t)] * n, "offset": 4096 + np.arange(n) * 256, "size": [256] * n})
    hot = diagnose.hot_row_residency(calls, limit=100)
    assert hot["rows"] == 100 and hot["distinct_rows"] == 300


def test_syscalls_summary_shows_faults_beside_calls_at_80():
    """A memory-mapped reader's recording: the page-fault read path is a row of the summary,
    beside the calls (the title names both read paths); the live view has a faults line."""
    from engramprof.report import syscalls as report_syscalls

    s = _syscalls_summary("/data/models/engram/a/very/long/path/to/the/table-of-embeddings.safetensors")
    s["faults"] = {"faults": 4_222_017, "major": 4_118_230, "minor": 103_787, "retried": 12_345, "lost_records": 17,
                   "recorded": 4_222_000, "sum_ms": 512_345.6, "other_faults": 98_765, "address": False,
                   "missing_tracepoints": []}
    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=WIDTH), s)
    out = buf.getvalue()
    fits(out)
    whole(out, "4,222,017", "4,118,230 major", "103,787", "12,345", "512,345.6 ms", "98,765", "and page faults")
    flat = " ".join(out.split())
    assert "103,787 minor" in flat and "12,345 retried" in flat and "17 records lost" in flat

    class _Faults:
        def __init__(self):
            self.n = 0

        def totals(self):
            self.n += 1
            return {"faults": 1000 * self.n, "major": 900 * self.n, "sum_ns": 50_000_000 * self.n, "lost_records": 0}

    class _Tracer:
        faults = _Faults()

    lv = report_syscalls.LiveView(Console(file=io.StringIO(), width=WIDTH))
    lv._fault_line(_Tracer, 1.0)
    line = lv._fault_line(_Tracer, 1.0).plain
    assert "faults/s 1,000" in line and "major/s 900" in line and "50.0 ms/s" in line and len(line) <= WIDTH


def test_doctor_at_80():
    # as root here every check runs; elsewhere the failing ones print their fix, which must fit too
    out = subprocess.run([PY, "-m", "engramprof", "doctor"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env=dict(os.environ, COLUMNS=str(WIDTH)), stdin=subprocess.DEVNULL).stdout
    fits(out)
    assert "privileges" in out and "tracepoints" in out


def test_sample_at_80():
    out = run("sample", "--duration", "1")
    fits(out)
    assert "PSI" in out or "psi" in out


def test_verdict_line_explains_a_largest_share_that_is_not_a_cause():
    """"verdict: python-scheduling — largest share: cpu-copy 64%" left the reader to guess
    what cpu-copy is; the line says it is copying cached rows, not a cause, and fits 80."""
    from engramprof.analysis.verdicts import CAUSES
    from engramprof.report.render import say

    from engramprof.report import batch_tail as report

    share = dict.fromkeys(CAUSES, 0.0) | {"cpu-copy": 0.64, "python-scheduling": 0.30}
    s = {"verdict": "python-scheduling", "share": share, "tail_threshold_ms": 3.2, "tail_verdict": "python-scheduling"}
    con = Console(width=80, record=True, force_terminal=False)
    say(con, report.verdict_line(s))
    text = con.export_text()
    fits(text)
    flat = " ".join(text.split())
    assert "largest share: cpu-copy 64" in flat and "copying rows already cached" in flat and "not a cause" in flat
    share = dict.fromkeys(CAUSES, 0.0) | {"residency": 0.7}  # a verdict cause needs no gloss
    flat = " ".join(report.verdict_line({**s, "verdict": "residency", "share": share}).plain.split())
    assert "not a cause" not in flat and "largest share: residency 70" in flat
