"""`engramprof diagnose`: each lab fault diagnosed with the real probes, plus the pure parts."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from engramprof.diagnose import verdict_and_confidence
from tests.tracing import engramprof


# ---- pure -----------------------------------------------------------------------------------

def _share(**kw):
    base = {"residency": 0.0, "reclaim": 0.0, "storage": 0.0, "python-scheduling": 0.0, "cpu-copy": 0.0, "unexplained": 0.0}
    base.update({k.replace("_", "-"): v for k, v in kw.items()})
    return base


def test_verdict_largest_cause_with_runner_up_when_close():
    v, conf, runner, rs = verdict_and_confidence(_share(residency=0.45, python_scheduling=0.35, cpu_copy=0.2), 0.25)
    assert (v, runner) == ("residency", "python-scheduling")
    assert conf == pytest.approx(0.45 / 0.80, abs=0.01)
    assert rs == pytest.approx(0.35)


def test_verdict_no_runner_up_when_far_behind():
    v, conf, runner, _ = verdict_and_confidence(_share(storage=0.85, residency=0.10, cpu_copy=0.05), 0.25)
    assert (v, runner) == ("storage", None) and conf == pytest.approx(0.85 / 0.95, abs=0.01)


def test_healthy_below_meaningful_share():
    v, conf, runner, _ = verdict_and_confidence(_share(python_scheduling=0.05, cpu_copy=0.95), 0.25)
    assert v == "healthy" and runner is None and conf == pytest.approx(0.8)
    v, conf, runner, _ = verdict_and_confidence(_share(python_scheduling=0.2, cpu_copy=0.8), 0.25)  # below 0.25
    assert v == "healthy" and runner == "python-scheduling" and conf == pytest.approx(0.2)


def test_diagnose_bad_pid_one_line():
    r = subprocess.run(engramprof("diagnose", "--pid", "999999999", "--duration", "1"), capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == "engramprof: no process with pid 999999999"


# ---- real faults, real probes ---------------------------------------------------------------

def _diagnose(sc, duration: float = 8, markers: bool = True) -> dict:
    args = ["diagnose", "--pid", sc.pid, "--duration", duration, "--json"]
    if markers:
        args += ["--markers", sc.markers_path]
    r = subprocess.run(engramprof(*args), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.bpf
@pytest.mark.parametrize("name", ["python-scheduling", "healthy", "residency", "reclaim", "storage"])
def test_each_scenario_diagnosed(name):
    from engramprof.lab.scenarios import Scenario

    t0 = time.monotonic()
    # reclaim: a working set (33 MiB table) that was cached and no longer fits the group's
    # 16 MiB of page cache, so misses are refaults; on the default 132 MiB table most misses
    # in a short window are first reads (residency) and the two causes share the time
    opts = {"rows": 1 << 16} if name == "reclaim" else {}
    with Scenario(name, duration=30, **opts) as sc:
        d = _diagnose(sc)
        sc.stop()
    assert time.monotonic() - t0 < 60
    assert d["verdict"] == name, (d["verdict"], d["batch_tail"]["share"], d["evidence"])
    assert set(d) >= {"verdict", "confidence", "evidence", "limits", "recommendation", "batch_tail"}
    assert [e["step"] for e in d["evidence"]][:5] == [
        "slow calls", "residency of their pages", "reclaim signals", "device service", "batch time outside the read path"]
    assert d["recommendation"]["fix"] and d["recommendation"]["confirm"]
    assert d["batch_tail"]["batch_source"] == "markers"
    shares = d["batch_tail"]["share"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    if name != "healthy":
        assert d["confidence"] > 0.5
    if name == "reclaim":
        ev = {e["step"]: e for e in d["evidence"]}
        assert (ev["reclaim signals"]["value"]["cgroup_refaults"] or 0) > 0


@pytest.mark.bpf
def test_python_scheduling_found_without_markers():
    from engramprof.lab.scenarios import Scenario

    with Scenario("python-scheduling", duration=30) as sc:
        d = _diagnose(sc, markers=False)
        sc.stop()
    assert d["verdict"] == "python-scheduling"
    assert d["batch_tail"]["batch_source"] == "inferred"
    assert any("inferred" in line for line in d["limits"])


@pytest.mark.bpf
def test_mixed_residency_and_scheduling_names_both():
    """A pool reader whose table is evicted only now and then: some batches wait on the disk,
    all pay the pool.  The larger share is the verdict, the other the runner-up."""
    from engramprof.lab.scenarios import Scenario

    with Scenario("residency", duration=30, evict_ms=400) as sc:
        d = _diagnose(sc)
        sc.stop()
    share = d["batch_tail"]["share"]
    pair = {d["verdict"], d["runner_up"]}
    # both faults are present; when the host's disk is slow at that moment (seen: misses of
    # 5-20 ms), part of the miss time is rightly storage and can push python-scheduling to third
    assert "residency" in pair and d["runner_up"] is not None, (d["verdict"], d["runner_up"], share)
    assert share["python-scheduling"] > 0.05
    ranked = sorted(("residency", "reclaim", "storage", "python-scheduling"), key=lambda c: -share[c])
    assert [d["verdict"], d["runner_up"]] == ranked[:2]
