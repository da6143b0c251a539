"""`diagnose` on libraries nobody here wrote that serve tables (issue 23): faiss (IVF-Flat,
IO_FLAG_MMAP, OpenMP search), LMDB (random gets of a mapping) and rocksdict (RocksDB, buffered
pread64, no block cache), each evicted every step, warm (the table read whole first) and in a
300 MiB memory cgroup (the table read whole inside it first), and LMDB on the lab's throttled
loop device; a table of verdict, shares and counts against the kernel's.

    sudo .venv/bin/python benchmarks/mapped_libraries.py [--seconds 5] [--mib 384]
        [--cases faiss:evicted,...]

Tables of --mib MiB (the throttled case: 64 MiB, the loop device's size).  Counts over the steps
recorded whole (tests/mapped_libs.py's report): major faults in the trace against the growth
of the reader's ``majflt`` (/proc/PID/stat), read syscalls in the trace against the growth of
its ``syscr`` (/proc/PID/io).  The readers are tests/mapped_libs.py; run from the repository
root.
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
sys.path.insert(0, REPO)
PY = os.path.join(REPO, ".venv", "bin", "python")
LIBS = ("faiss", "lmdb", "rocksdict")
CASES = [f"{lib}:{case}" for lib in LIBS for case in ("evicted", "warm", "memcg")] + ["lmdb:throttled"]
MEMCG_MIB = 300
THROTTLED_MIB, THROTTLED_IOPS = 64, 200


def _build(lib: str, data: str, mib: int) -> None:
    subprocess.run([PY, "-m", "tests.mapped_libs", lib, data, os.devnull, "--build-only", "--mib", str(mib)],
                   check=True, cwd=REPO)


def run_case(tmp: str, lib: str, case: str, seconds: float, mib: int) -> dict:
    from engramprof.lab.impairments import ReclaimImpairment, StorageImpairment
    from tests.mapped_libs import counts_against_the_kernel, evict

    name = f"{lib}-{case}"
    imp = StorageImpairment(iops=THROTTLED_IOPS) if case == "throttled" else None
    mem = ReclaimImpairment(memory_mib=MEMCG_MIB) if case == "memcg" else None
    data = os.path.join(tmp, lib)
    args = ["--mib", str(mib)]
    try:
        if imp is not None:
            imp.loop.create(tmp, (THROTTLED_MIB + 32) << 20)
            data, args = os.path.join(imp.loop.mountpoint, lib), ["--mib", str(THROTTLED_MIB)]
            cg = imp._make_cgroup("blkio", "no blkio/io cgroup controller")
            cg.write("blkio.throttle.read_iops_device" if cg.hier.version == 1 else "io.max",
                     f"{imp.loop.devno} {THROTTLED_IOPS}" if cg.hier.version == 1
                     else f"{imp.loop.devno} riops={THROTTLED_IOPS}")
        _build(lib, data, int(args[1]))
        if mem is not None:  # joined before the reader touches the table: its pages charge the group
            mcg = mem._make_cgroup("memory", "no memory cgroup controller")
            mcg.write("memory.limit_in_bytes" if mcg.hier.version == 1 else "memory.max", str(MEMCG_MIB << 20))
            args += ["--join", mcg.procs]
        if case in ("memcg", "throttled"):
            for f in os.listdir(data):  # out of the cache: read back through the group
                evict(os.path.join(data, f))
        markers = os.path.join(tmp, f"{name}.markers")
        reader = subprocess.Popen([PY, "-m", "tests.mapped_libs", lib, data, markers, "--seconds", str(seconds + 4)]
                                  + args + (["--evict"] if case in ("evicted", "throttled") else []), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid = int(reader.stderr.readline().split()[1])
        if imp is not None:
            with open(imp.cgroups["blkio"].procs, "w") as f:
                f.write(str(pid))
        out = os.path.join(tmp, name)
        diag = subprocess.Popen([PY, "-m", "engramprof", "diagnose", "--pid", str(pid), "--duration", str(seconds),
                                 "--json", "--markers", markers, "--output", out], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not diag.stderr.readline().startswith("Tracing"):
            if diag.poll() is not None:
                raise SystemExit(diag.stderr.read())
        os.kill(pid, signal.SIGUSR1)
        dout, derr = diag.communicate(timeout=300)
        rout, _ = reader.communicate(timeout=120)
        if diag.returncode:
            return {"case": name, "error": derr.strip().splitlines()[-1]}
        d = json.loads(dout)
        report = json.loads(rout.strip().splitlines()[-1])
        return {"case": name, **counts_against_the_kernel(out, report), "verdict": d["verdict"],
                "share": d["batch_tail"]["share"], "batches": d["batch_tail"]["batches"],
                "baseline": (d["batch_tail"]["device_baseline"] or {}).get("source")}
    finally:
        if imp is not None:
            for c in imp.cgroups.values():
                c.remove()
            imp.loop.remove()
        if mem is not None:
            for c in mem.cgroups.values():
                c.remove()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--mib", type=int, default=384, help="table size (MiB)")
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="engramprof-mapped-bench-", dir="/var/tmp")
    rows = []
    try:
        for spec in a.cases.split(","):
            lib, case = spec.split(":")
            t0 = time.monotonic()
            r = run_case(tmp, lib, case, a.seconds, a.mib)
            r["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'library:case':17} {'verdict':10} {'resid':>5} {'recl':>5} {'stor':>5} {'steps':>5} "
          f"{'major':>6} {'majflt':>6} {'reads':>6} {'syscr':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:17} error: {r['error']}")
            continue
        s = r["share"]
        print(f"{r['case']:17} {r['verdict']:10} {s['residency']:5.0%} {s['reclaim']:5.0%} {s['storage']:5.0%} "
              f"{r['steps']:5d} {r['major_faults']:6,d} {r['kernel_majflt']:6,d} "
              f"{r['read_syscalls']:6,d} {r['kernel_syscr']:6,d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
