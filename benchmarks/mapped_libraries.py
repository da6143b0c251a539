"""`diagnose` on mapped libraries nobody here wrote (issue 23): faiss (IVF-Flat, IO_FLAG_MMAP,
OpenMP search) and LMDB (random gets), each evicted every step, warm, and (LMDB) on the lab's
throttled loop device and in a memory cgroup of 16 MiB of page cache (the database dropped from the
cache first); a table of verdict, shares and counts against the kernel's.

    sudo .venv/bin/python benchmarks/mapped_libraries.py [--seconds 5] [--cases faiss:evicted,...]

Counts: major faults the trace holds (fault events with ``major``) against the growth of the
process's own ``majflt`` over the recorded window (samples/process, /proc/PID/stat: the
kernel's count).  The readers are tests/mapped_libs.py; run from the repository root.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(REPO, ".venv", "bin", "python")
CASES = ["faiss:evicted", "faiss:warm", "lmdb:evicted", "lmdb:warm", "lmdb:throttled", "lmdb:memcg"]


def run_case(tmp: str, lib: str, case: str, seconds: float) -> dict:
    from engramprof.lab.impairments import ReclaimImpairment, StorageImpairment

    name = f"{lib}-{case}"
    imp = StorageImpairment(iops=200) if case == "throttled" else None
    mem = ReclaimImpairment(memory_mib=16) if case == "memcg" else None
    data = os.path.join(tmp, lib)
    try:
        if mem is not None:
            data = os.path.join(tmp, f"{lib}-memcg")
            subprocess.run([PY, "-m", "tests.mapped_libs", lib, data, os.devnull, "--build-only"], check=True, cwd=REPO)
            sys.path.insert(0, REPO)
            from tests.mapped_libs import evict
            for f in os.listdir(data):  # out of the cache: the reader's faults charge its group
                evict(os.path.join(data, f))
            mcg = mem._make_cgroup("memory", "no memory cgroup controller")
        if imp is not None:
            imp.loop.create(tmp, 96 << 20)
            data = os.path.join(imp.loop.mountpoint, lib)
            subprocess.run([PY, "-m", "tests.mapped_libs", lib, data, os.devnull, "--build-only"], check=True, cwd=REPO)
            cg = imp._make_cgroup("blkio", "no blkio/io cgroup controller")
            cg.write("blkio.throttle.read_iops_device" if cg.hier.version == 1 else "io.max",
                     f"{imp.loop.devno} 200" if cg.hier.version == 1 else f"{imp.loop.devno} riops=200")
        markers = os.path.join(tmp, f"{name}.markers")
        reader = subprocess.Popen([PY, "-m", "tests.mapped_libs", lib, data, markers, "--seconds", str(seconds + 4)]
                                  + (["--evict"] if case not in ("warm", "memcg") else []), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid = int(reader.stderr.readline().split()[1])
        if imp is not None:
            with open(imp.cgroups["blkio"].procs, "w") as f:
                f.write(str(pid))
        if mem is not None:  # the reader's own memory + 16 MiB of page cache (the lab's reclaim rule)
            with open(mcg.procs, "w") as f:
                f.write(str(pid))
            st = mcg.stat()
            if mcg.hier.version == 1:
                base = max(0, int(mcg.read("memory.usage_in_bytes")) - st.get("total_cache", st.get("cache", 0)))
                mcg.write("memory.limit_in_bytes", str(base + (16 << 20)))
            else:
                base = max(0, int(mcg.read("memory.current")) - st.get("file", 0))
                mcg.write("memory.max", str(base + (16 << 20)))
        out = os.path.join(tmp, name)
        diag = subprocess.Popen([PY, "-m", "engramprof", "diagnose", "--pid", str(pid), "--duration", str(seconds),
                                 "--json", "--markers", markers, "--output", out], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not diag.stderr.readline().startswith("Tracing"):
            if diag.poll() is not None:
                raise SystemExit(diag.stderr.read())
        os.kill(pid, signal.SIGUSR1)
        dout, derr = diag.communicate(timeout=300)
        reader.communicate(timeout=120)
        if diag.returncode:
            return {"case": name, "error": derr.strip().splitlines()[-1]}
        d = json.loads(dout)
        return {"case": name, **counts(out), "verdict": d["verdict"], "share": d["batch_tail"]["share"],
                "batches": d["batch_tail"]["batches"], "baseline": (d["batch_tail"]["device_baseline"] or {}).get("source")}
    finally:
        if imp is not None:
            for c in imp.cgroups.values():
                c.remove()
            imp.loop.remove()
        if mem is not None:
            for c in mem.cgroups.values():
                c.remove()


def counts(out: str) -> dict:
    """Major faults in the trace against the kernel's majflt growth over the recorded window."""
    from engramprof import trace

    b = trace.load_bundle(out)
    c = b.calls
    faults = c[c["kind"].astype(object) == "fault"] if "kind" in c.columns else c.iloc[0:0]
    major = int(faults["major"].fillna(False).astype(bool).sum()) if "major" in faults.columns else 0
    p = b.samples("process")
    start, end = b.meta.get("start_ns"), b.meta.get("end_ns")
    kernel = None
    if p is not None and len(p) and start and end:
        later = p["ts_ns"][p["ts_ns"] > end]
        stop = later.min() if len(later) else end
        kernel = int(p[(p["ts_ns"] > start) & (p["ts_ns"] <= stop)]["majflt"].fillna(0).sum())
    return {"faults": int(len(faults)), "major_faults": major, "kernel_majflt": kernel}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="engramprof-mapped-bench-", dir="/var/tmp")
    rows = []
    try:
        for spec in a.cases.split(","):
            lib, case = spec.split(":")
            t0 = time.monotonic()
            r = run_case(tmp, lib, case, a.seconds)
            r["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'library:case':18} {'verdict':18} {'resid':>6} {'stor':>6} {'pysch':>6} {'copy':>6} {'batches':>7} "
          f"{'faults':>7} {'major':>6} {'kernel':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:18} error: {r['error']}")
            continue
        s = r["share"]
        print(f"{r['case']:18} {r['verdict']:18} {s['residency']:6.0%} {s['storage']:6.0%} {s['python-scheduling']:6.0%} "
              f"{s['cpu-copy']:6.0%} {r['batches']:7d} {r['faults']:7,d} {r['major_faults']:6,d} "
              f"{r['kernel_majflt'] if r['kernel_majflt'] is not None else '-':>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
