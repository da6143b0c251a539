"""Every `lab scenario` with each read-path reader (issue 22): `engramprof diagnose --markers`
of the running scenario, its verdict against the one its mechanism calls for.

    sudo .venv/bin/python benchmarks/scenario_readers.py [--seconds 6] [--readers uring,direct,read,aio]
                                                         [--scenarios storage,...] [--json]
                                                         [--keep DIR] [--cpu-hogs N]
    .venv/bin/python benchmarks/scenario_readers.py --reanalyse DIR   # the kept traces, this code

``--keep DIR`` keeps each case's trace and markers (DIR/<scenario>-<reader>/); ``--reanalyse``
runs ``batch-tail`` on them again, so two versions of the analysis are compared on the same
recordings.  ``--cpu-hogs N``: N busy-loop processes run during each case (the loaded machine
under which the request readers reap their completions late).

Expected verdicts (docs/model.md, "Read paths under the lab's faults"): the buffered readers
(``uring``, ``read``) take each fault as the syscall readers do (boot-stream: reclaim only where
the streamer evicted table pages, ``table_resident`` below 1.0 at the end; else warm); the O_DIRECT readers
(``direct``, ``aio``) bypass the page cache, so a warm table, a drop and a page-cache limit do
not reach their reads (every read waits for the device at its normal speed: ``residency``),
while the throttled device slows them as it does every reader (``storage``).  The lab readers'
calling-thread readers have no pool: a cached table is ``healthy`` under ``python-scheduling``.
Run from the repository root.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SCENARIOS = ["python-scheduling", "healthy", "residency", "reclaim", "storage", "dropper", "boot-stream"]
READERS = ["uring", "direct", "read", "aio"]
DIRECT = ("direct", "aio")
BUFFERED_VERDICT = {"python-scheduling": "healthy", "healthy": "healthy", "residency": "residency",
                    "reclaim": "reclaim", "storage": "storage", "dropper": "residency", "boot-stream": "reclaim"}
DIRECT_VERDICT = {s: "residency" for s in SCENARIOS} | {"storage": "storage"}
#: the scenario's own reader (``--readers default``): its fault's name, boot-stream and dropper residency
DEFAULT_VERDICT = {s: s for s in SCENARIOS} | {"dropper": "residency", "boot-stream": "reclaim"}
# a working set that was cached and no longer fits the group (tests/test_diagnose_mmap.py's rule)
OPTS = {"reclaim": {"rows": 1 << 16}}


def expected(scenario: str, reader: str, evidence: dict | None = None) -> str:
    """The verdict the reader's path calls for under the scenario.  boot-stream's streamer
    evicts the table only when reclaim in the group takes its pages: where the table stayed
    resident (``table_resident`` 1.0 at the end) the buffered readers read it warm."""
    if scenario == "boot-stream" and reader not in DIRECT and (evidence or {}).get("table_resident", 0) >= 0.999:
        return "python-scheduling" if reader == "default" else "healthy"
    if reader == "default":
        return DEFAULT_VERDICT[scenario]
    return (DIRECT_VERDICT if reader in DIRECT else BUFFERED_VERDICT)[scenario]


def cpu_hogs(n: int) -> list:
    """``n`` busy-loop processes (stopped by the caller)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_case(scenario: str, reader: str, seconds: float, keep: str | None = None, hogs: int = 0) -> dict:
    from engramprof.lab.scenarios import Scenario

    t0 = time.monotonic()
    out_dir = os.path.join(keep, f"{scenario}-{reader}") if keep else None
    with Scenario(scenario, duration=seconds + 120, reader=None if reader == "default" else reader,
                  **OPTS.get(scenario, {})) as sc:
        keep_args = ["--output", os.path.join(out_dir, "trace")] if out_dir else []
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
        busy = cpu_hogs(hogs)
        try:
            r = subprocess.run([sys.executable, "-m", "engramprof", "diagnose", "--pid", str(sc.pid), "--duration",
                                str(seconds), "--json", "--markers", sc.markers_path, *keep_args],
                               capture_output=True, text=True, timeout=seconds + 180)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        if out_dir:
            shutil.copy(sc.markers_path, os.path.join(out_dir, "markers.jsonl"))
        evidence = sc.evidence()
        sc.stop()
    out = {"scenario": scenario, "reader": reader, "expected": expected(scenario, reader, evidence),
           "wall_s": round(time.monotonic() - t0, 1), "rc": r.returncode, "evidence": evidence}
    if r.returncode != 0:
        return out | {"verdict": "error", "error": r.stderr.strip().splitlines()[-1:]}
    d = json.loads(r.stdout)
    bt = d["batch_tail"]
    share = {k: v for k, v in sorted(bt["share"].items(), key=lambda kv: -kv[1]) if v >= 0.05}
    return out | {"verdict": d["verdict"], "share": share, "read_events": bt.get("read_events"),
                  "batches": bt.get("batches"), "read_path": d.get("read_path")}


def reanalyse(keep: str) -> list:
    """batch-tail of every kept case again (this checkout's analysis), as case dicts."""
    cases = []
    for name in sorted(os.listdir(keep)):
        d = os.path.join(keep, name)
        if not os.path.isdir(os.path.join(d, "trace")):
            continue
        scenario, reader = name.rsplit("-", 1)
        r = subprocess.run([sys.executable, "-m", "engramprof", "batch-tail", os.path.join(d, "trace"), "--markers",
                            os.path.join(d, "markers.jsonl"), "--json"], capture_output=True, text=True)
        c = {"scenario": scenario, "reader": reader, "expected": expected(scenario, reader)}
        if r.returncode != 0:
            cases.append(c | {"verdict": "error", "error": r.stderr.strip().splitlines()[-1:]})
            continue
        bt = json.loads(r.stdout)
        share = {k: v for k, v in sorted(bt["share"].items(), key=lambda kv: -kv[1]) if v >= 0.05}
        cases.append(c | {"verdict": bt["verdict"], "share": share, "read_events": bt.get("read_events")})
    return cases


def line(c: dict) -> str:
    ok = "ok" if c["verdict"] == c["expected"] else "WRONG"
    share = " ".join(f"{k} {v:.0%}" for k, v in list(c.get("share", {}).items())[:3])
    ev = ",".join(f"{k}:{v}" for k, v in (c.get("read_events") or {}).items())
    return f"{c['scenario']:<18}{c['reader']:<8}{c['verdict']:<18}{c['expected']:<18}{ok:<6}{share}  [{ev}]"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--readers", default=",".join(READERS), help="and 'default': the scenario's own reader")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--json", action="store_true", help="each case as a JSON line on stderr")
    ap.add_argument("--judge", metavar="FILE", help="print the table of a --json run's lines again (no run)")
    ap.add_argument("--keep", metavar="DIR", help="keep each case's trace and markers under DIR")
    ap.add_argument("--cpu-hogs", type=int, default=0, metavar="N", help="N busy loops during each case")
    ap.add_argument("--reanalyse", metavar="DIR", help="batch-tail the traces a --keep run kept (no run)")
    a = ap.parse_args()
    if a.reanalyse:
        cases = reanalyse(a.reanalyse)
        for c in cases:
            print(line(c))
        print(f"{sum(c['verdict'] == c['expected'] for c in cases)} of {len(cases)} as expected")
        return 0
    if a.judge:
        with open(a.judge) as f:
            cases = [json.loads(line) for line in f if line.startswith("{")]
        for c in cases:
            c["expected"] = expected(c["scenario"], c["reader"], c.get("evidence"))
            print(line(c))
        print(f"{sum(c['verdict'] == c['expected'] for c in cases)} of {len(cases)} as expected")
        return 0
    print(f"{'scenario':<18}{'reader':<8}{'verdict':<18}{'expected':<18}{'':<6}shares >= 5%  [read events]")
    cases = []
    for s in a.scenarios.split(","):
        for rd in a.readers.split(","):
            c = run_case(s, rd, a.seconds, a.keep, a.cpu_hogs)
            cases.append(c)
            print(line(c), flush=True)
            if a.json:
                print(json.dumps(c), file=sys.stderr, flush=True)
    wrong = [c for c in cases if c["verdict"] != c["expected"]]
    print(f"{len(cases) - len(wrong)} of {len(cases)} as expected; load average {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%H:%M', time.gmtime())} UTC")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
