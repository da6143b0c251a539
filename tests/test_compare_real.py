"""engramprof compare on real lab recordings (root, real eBPF): ranks and before/after.

Each group of lab readers runs at the same time, each traced by its own `engramprof syscalls`
(tracers attached one after the other; then every reader is started by one SIGUSR1 each), the
way tensor-parallel ranks or a canary and its control run: the same host load reaches all of
them, so only the fault under test tells them apart.  Every reader writes markers with the
lab's shared step counter (step 0, 1, ... of the same row plan), which `compare --ranks`
aligns on.

Marked slow and bpf: three groups of 3-4 concurrent traced readers, one trace of two readers
(`--pid A --pid B`, split by pid into ranks) and one of `lab run --workers 4`, about 3 min in all on the
2-vCPU VM (each tracer compiles its probe first).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.tracing import PY, Proc, engramprof

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
STEPS = "200"
#: no fault: a rank may gate at most its fair share (1/4) plus this; each step's slowest
#: rank is decided by noise under a shared load
FAIR_MARGIN = 0.25


def traced_group(tmp: Path, tables, runs: dict[str, list[str]]) -> dict[str, tuple[Path, Path]]:
    """Run the lab readers of ``runs`` (name -> extra `lab run` args) at the same time, each
    under its own tracer, reader i on ``tables[i]`` (one page cache per rank: its own file);
    returns name -> (trace, markers)."""
    labs, tracers, out = {}, {}, {}
    try:
        for i, (name, args) in enumerate(runs.items()):
            m = tmp / f"{name}.jsonl"
            labs[name] = Proc(engramprof("lab", "run", "--table", tables[i], "--json", "--start-delay", "300",
                                         "--gap-ms", "1", "--markers", m, *args))
            out[name] = (tmp / name, m)
        for name, lab in labs.items():
            lab.wait_line("lab: ready")
            tracers[name] = Proc(engramprof("syscalls", "--pid", lab.pid, "--output", out[name][0], "--json"))
            tracers[name].wait_line("Tracing")
        for lab in labs.values():
            os.kill(lab.pid, signal.SIGUSR1)
        for name, lab in labs.items():
            rc, _, err = lab.finish(timeout=300)
            assert rc == 0, err
        for name, tr in tracers.items():
            rc, _, err = tr.finish(timeout=120)
            assert rc == 0, err
    finally:
        for p in list(labs.values()) + list(tracers.values()):
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    return out


def compare(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "engramprof", "compare", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def ranks_args(group: dict, names: list[str]) -> list:
    args = ["--ranks", *[group[n][0] for n in names]]
    for n in names:
        args += ["--markers", group[n][1]]
    return args


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """Four copies of one table (the same rows: each rank has its own file, so one rank's
    eviction is not another's)."""
    from engramprof.lab import table as labtable
    from engramprof.lab.scenarios import fs_type

    d = tmp_path_factory.mktemp("compare-real")
    if fs_type(d) in ("tmpfs", "ramfs"):
        pytest.skip("tmp is on tmpfs: a cold table needs a filesystem with a droppable page cache")
    out = []
    for i in range(4):
        t = d / f"engram{i}.safetensors"
        labtable.make_table(t, rows=1 << 18, seed=0)
        out.append(t)
    return out


def test_the_cold_rank_gates_most_steps_with_cause_residency(tables, tmp_path):
    """Serial readers: with four 32-thread pools under four tracers on two shared cores, a warm
    pool batch took ~10 ms at p50 and the cold rank gated only 47.5% of steps (seen 2026-12-01,
    the same answer from the code before and after that day's compare changes)."""
    names = ["r0", "r1", "r2", "r3"]
    runs = {n: ["--warm", "--reader", "serial", "--steps", STEPS] for n in names}
    runs["r2"] = ["--cold", "--reader", "serial", "--steps", STEPS]  # its table is evicted before its first step
    g = traced_group(tmp_path, tables, runs)
    p = compare(*ranks_args(g, names), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["alignment"] == "step-id" and doc["steps"] >= 190
    assert doc["gating_rank"] == 2, doc["ranks"]
    r2 = next(r for r in doc["ranks"] if r["rank"] == 2)
    assert r2["gated_share"] > 0.5 and r2["top_cause"] == "residency", r2
    # the same recordings moved into a fleet directory (host=H/rank=R/<bundle>, each bundle
    # carrying its markers): `compare --ranks ROOT` finds them and gives the same answer
    root = tmp_path / "fleet"
    for i, n in enumerate(names):
        dest = root / f"host=h{i // 2}" / f"rank={i}" / "trace"
        dest.parent.mkdir(parents=True)
        g[n][0].rename(dest)
        g[n][1].rename(dest / "markers.jsonl")
    p = compare("--ranks", root, "--json")
    assert p.returncode == 0, p.stderr
    fleet = json.loads(p.stdout)
    assert [r["rank"] for r in fleet["ranks"]] == [0, 1, 2, 3] and [r["host"] for r in fleet["ranks"]] == \
        ["h0", "h0", "h1", "h1"]
    key = ("gated_steps", "excess_ms", "top_cause")
    assert fleet["steps"] == doc["steps"] and fleet["gating_rank"] == 2
    assert [[r[k] for k in key] for r in fleet["ranks"]] == [[r[k] for k in key] for r in doc["ranks"]]


def test_without_a_fault_no_rank_gates_more_than_its_fair_share(tables, tmp_path):
    names = ["r0", "r1", "r2", "r3"]
    g = traced_group(tmp_path, tables, {n: ["--warm", "--steps", STEPS] for n in names})
    doc = json.loads(compare(*ranks_args(g, names), "--json", "--resamples", "0").stdout)
    shares = [r["gated_share"] for r in doc["ranks"]]
    print("gated shares without a fault:", shares)
    assert max(shares) <= 0.25 + FAIR_MARGIN, doc["ranks"]


def test_before_after_pool_vs_nowait(tables, tmp_path):
    """Control (pool) and canary (nowait) at the same time on the same cached table and batch
    mix: matched, nowait faster, the ratio's interval below 1.  With the canary's prefill
    batches added (prefill-sized batches only on the after side): exit 3, the shared decode
    stratum still reported."""
    same = [tables[0]] * 3  # one table file, cached, for control and canary
    g = traced_group(tmp_path, same, {
        "pool": ["--warm", "--steps", STEPS, "--reader", "pool"],
        "nowait": ["--warm", "--steps", STEPS, "--reader", "nowait"],
        "prefill": ["--warm", "--steps", "15", "--reader", "nowait", "--tokens", "2000"],
    })
    p = compare("--before", g["pool"][0], "--after", g["nowait"][0], "--markers", g["pool"][1],
                "--markers", g["nowait"][1], "--json")
    assert p.returncode == 0, p.stderr + p.stdout
    doc = json.loads(p.stdout)
    assert doc["matched"] is True
    o = doc["overall"]
    assert o["ratio"] < 1 and o["ci"][1] < 1, o
    p = compare("--before", g["pool"][0], "--after", g["nowait"][0], "--after", g["prefill"][0],
                "--markers", g["pool"][1], "--markers", g["nowait"][1], "--markers", g["prefill"][1], "--json")
    assert p.returncode == 3, p.stderr
    doc = json.loads(p.stdout)
    assert doc["matched"] is False and doc["overall"] is None and "after has" in doc["reason"]
    assert any(s["stratum"].startswith("decode") for s in doc["strata"])
    assert any(d["stratum"].startswith("prefill") and d["after_time_share"] > 0.5 for d in doc["dropped"])


def test_one_trace_of_two_processes_is_two_ranks(tables, tmp_path):
    """Two lab readers traced by one `syscalls --pid A --pid B`, the second on an evicted table;
    each writes its own markers (the lab's step counter), joined into one file with each line's
    pid, as a server whose ranks share a markers file would write it: `compare --ranks TRACE`
    splits the bundle by pid into two ranks and names the cold one, cause residency.  Serial
    readers: two 32-thread pools on two busy cores make pool scheduling noise as large as the
    cold reads (seen: python-scheduling 2.8 s vs residency 2.75 s of the cold rank's excess at a
    load average of 17)."""
    labs, marks = {}, {}
    tracer = None
    out = tmp_path / "both"
    try:
        for name, table, mode in (("warm", tables[0], "--warm"), ("cold", tables[1], "--cold")):
            marks[name] = tmp_path / f"{name}.jsonl"
            labs[name] = Proc(engramprof("lab", "run", "--table", table, "--json", "--start-delay", "300",
                                         "--gap-ms", "1", "--markers", marks[name], mode, "--reader", "serial",
                                         "--steps", STEPS))
        for lab in labs.values():
            lab.wait_line("lab: ready")
        tracer = Proc(engramprof("syscalls", "--pid", labs["warm"].pid, "--pid", labs["cold"].pid, "--output", out,
                                 "--json"))
        tracer.wait_line("Tracing", timeout=300)  # the probes compile first: slow on a busy host
        for lab in labs.values():
            os.kill(lab.pid, signal.SIGUSR1)
        for lab in labs.values():
            rc, _, err = lab.finish(timeout=300)
            assert rc == 0, err
        rc, _, err = tracer.finish(timeout=120)  # ends by itself once both readers have exited
        assert rc == 0, err
    finally:
        for p in list(labs.values()) + ([tracer] if tracer else []):
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    joined = tmp_path / "markers.jsonl"
    lines = []
    for name, lab in labs.items():
        for line in marks[name].read_text().splitlines():
            m = json.loads(line)
            m["pid"] = lab.pid
            lines.append(m)
    lines.sort(key=lambda m: m["start_ns"])
    joined.write_text("".join(json.dumps(m) + "\n" for m in lines))
    p = compare("--ranks", out, "--markers", joined, "--json", "--resamples", "0")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["pid"] for r in doc["ranks"]] == sorted([labs["warm"].pid, labs["cold"].pid])
    assert doc["alignment"] == "step-id" and doc["steps"] >= 190, doc
    cold = next(r for r in doc["ranks"] if r["pid"] == labs["cold"].pid)
    assert doc["gating_rank"] == cold["rank"], doc["ranks"]
    assert cold["gated_share"] > 0.5 and cold["top_cause"] == "residency", cold


def test_lab_workers_one_rank_evicting(tables, tmp_path):
    """`lab run --workers 4`: four rank processes forked by one lab, one markers file whose lines
    carry each rank's pid and rank; rank 2 reads its own table, evicted before its first step.
    One `syscalls --pid` per rank pid records them in one trace; `compare --ranks TRACE` names
    rank 2 the gating rank for most steps, cause residency.  Serial readers: with four 32-thread
    pools on two busy cores, pool scheduling noise (tens of ms) hides a cold batch's few ms."""
    import re

    help_text = subprocess.run(engramprof("lab", "run", "--help"), capture_output=True, text=True).stdout
    if "--workers" not in help_text:
        pytest.skip("lab run has no --workers (the rank processes of issue 13) in this tree")
    m, out = tmp_path / "ranks.jsonl", tmp_path / "trace"
    lab = Proc(engramprof("lab", "run", "--table", tables[0], "--workers", "4", "--rank-table", f"2:{tables[1]}",
                          "--rank-cache", "2:cold", "--warm", "--reader", "serial", "--steps", "100", "--gap-ms", "1",
                          "--markers", m, "--start-delay", "300", "--json"))
    tracer = None
    try:
        lab.wait_line("lab: ready", timeout=300)
        pids = [int(x.group(1)) for line in lab.lines for x in [re.match(r"lab: rank \d+ pid (\d+)", line)] if x]
        assert len(pids) == 4, lab.lines
        tracer = Proc(engramprof("syscalls", *[a for p in pids for a in ("--pid", p)], "--output", out, "--json"))
        tracer.wait_line("Tracing", timeout=300)
        os.kill(lab.pid, signal.SIGUSR1)
        rc, _, err = lab.finish(timeout=300)
        assert rc == 0, err
        rc, _, err = tracer.finish(timeout=120)
        assert rc == 0, err
    finally:
        for p in (lab, tracer):
            if p is not None and p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    p = compare("--ranks", out, "--markers", m, "--json", "--resamples", "0")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3] and [r["pid"] for r in doc["ranks"]] == pids
    assert doc["alignment"] == "step-id" and doc["steps"] >= 95, doc
    assert doc["gating_rank"] == 2, doc["ranks"]
    r2 = doc["ranks"][2]
    assert r2["gated_share"] > 0.5 and r2["top_cause"] == "residency", r2
