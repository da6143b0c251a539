"""Page faults as read events (probes/faults.bpf.c, engramprof/record/faults.py): real eBPF.

The lab's mmap reader waits (--start-delay) for SIGUSR1, so the tracer is attached before the
first step; the target's majflt is read from /proc/PID/stat before the signal and again when it
is a zombie (counters still there, not yet reaped)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import numpy as np
import pytest

from engramprof import trace
from engramprof.tables import safetensors as layout
from engramprof.lab import table, workload
from engramprof.host.files import dev_t
from engramprof.record.sources.faults import MappingPathEnricher, read_maps
from engramprof.record.strings import Interner
from tests.tracing import PY, engramprof

PAGE = os.sysconf("SC_PAGE_SIZE")
STEPS, TOKENS, HEADS, SEED = 6, 8, 6, 3


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _majflt(pid: int) -> int:
    return int(_stat(pid)[9])


def _traced(tmp, argv, fault_address=True, name="t"):
    """Run argv (prints 'lab: ready' / 'ready' on stderr, then waits for SIGUSR1) under the
    tracer; returns (events of the bundle, majflt growth over the window, tracer summary)."""
    from engramprof.record.recorder import Recorder

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "ready" in line:
            break
    out = tmp / name
    t = Recorder(p.pid, output=str(out), sample_hz=0, offcpu=False, fault_address=fault_address)
    t.start()
    assert t.faults is not None, t.notes
    runner = threading.Thread(target=t.run, kwargs={"duration": 60})
    runner.start()
    m0 = _majflt(p.pid)
    os.kill(p.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 60
    while _stat(p.pid)[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    m1 = _majflt(p.pid)
    runner.join(60)
    summary = t.finish()
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 0, stderr
    return trace.load(out), m1 - m0, summary, stdout


def _lab(tbl, reader, cache):
    return engramprof("lab", "run", "--table", tbl, "--reader", reader, cache, "--steps", STEPS, "--tokens", TOKENS,
                      "--heads", HEADS, "--seed", SEED, "--start-delay", 120, "--json")


@pytest.fixture(scope="module")
def tbl(tmp_path_factory):
    p = tmp_path_factory.mktemp("faults") / "engram.safetensors"
    table.make_table(p, 1 << 15, 256, (3, 17), seed=4)  # 2 x 32768 x 264 B: 17 MiB
    return p


def _asked_pages(tbl) -> set[int]:
    pages = set()
    for batch in workload.planned_reads(tbl, STEPS, tokens=TOKENS, heads=HEADS, seed=SEED):
        for off, size in batch:
            pages.update(range(off // PAGE, (off + size - 1) // PAGE + 1))
    return pages


@pytest.mark.bpf
@pytest.mark.parametrize("address", [True, False], ids=["page_fault_user", "generic"])
def test_cold_mmap_faults_are_the_rows_asked_for_and_majflt(tmp_path, tbl, address):
    ev, majflt, summary, _ = _traced(tmp_path, _lab(tbl, "mmap", "--cold"), fault_address=address)
    f = ev[(ev["kind"] == "fault") & (ev["path"] == str(tbl))]
    assert len(f) > 50 and f["major"].sum() > 50
    assert (f["syscall"] == "fault").all() and f["ret"].isna().all() and (f["size"] == PAGE).all()
    assert (f["offset"] % PAGE == 0).all() and (f["fd"] == -1).all() and (f["flags"] == 0).all()
    asked = _asked_pages(tbl)
    major = f[f["major"]]
    assert set((major["offset"] // PAGE).tolist()) <= asked  # every page read is a row's page
    if address:  # with the address every fault's page is known exactly
        assert set((f["offset"] // PAGE).tolist()) <= asked
        assert f["address"].notna().all()
    else:
        assert f["address"].isna().all()
    # the kernel's own count of major faults over the window, within 2%
    all_major = int(ev[ev["kind"] == "fault"]["major"].sum())
    assert abs(all_major - majflt) <= max(1, 0.02 * majflt), (all_major, majflt)
    assert summary["faults"]["major"] == all_major
    # every major fault inserted its page or was retried, and waited for its bio
    assert (major["pages_added"] >= 1).mean() > 0.95
    assert (major["dur_ns"] >= major["bio_ns"]).all()
    assert major["tensor"].isin([table.weight_name(3), table.scale_name(3), table.weight_name(17),
                                 table.scale_name(17), ""]).all()


@pytest.mark.bpf
def test_fault_durations_fit_in_the_single_threaded_step(tmp_path, tbl):
    """The gather's step time (markers) is never shorter than the sum of its faults'
    durations, and a cold row's fault waits about one device service time."""
    markers = tmp_path / "m.jsonl"
    argv = _lab(tbl, "mmap", "--cold") + ["--markers", str(markers)]
    ev, _, _, _ = _traced(tmp_path, argv)
    f = ev[(ev["kind"] == "fault")]
    steps = [json.loads(l) for l in markers.read_text().splitlines()]
    for s in steps:
        inside = f[(f["ts_ns"] >= s["start_ns"]) & (f["ts_ns"] < s["end_ns"]) & (f["tid"] == s["tid"])]
        assert (inside["ts_ns"] + inside["dur_ns"] <= s["end_ns"]).all()
        assert inside["dur_ns"].sum() <= s["end_ns"] - s["start_ns"]
    major = f[f["major"] & (f["bio_count"] > 0)]
    ratio = (major["dur_ns"] / major["bio_ns"].clip(lower=1)).median()
    assert 1.0 <= ratio < 3.0, ratio  # wait ~ one device service (queue -> complete) plus overhead


@pytest.mark.bpf
def test_warm_mapped_table_makes_no_fault(tmp_path, tbl):
    ev, _, summary, out = _traced(tmp_path, _lab(tbl, "mmap", "--warm"))
    assert json.loads(out)["steps"] == STEPS
    f = ev[(ev["kind"] == "fault") & (ev["path"] == str(tbl))]
    assert len(f) == 0


@pytest.mark.bpf
def test_generic_path_gives_the_same_major_faults_less_the_address(tmp_path, tbl):
    a, _, _, _ = _traced(tmp_path, _lab(tbl, "mmap", "--cold"), fault_address=True, name="a")
    b, _, _, _ = _traced(tmp_path, _lab(tbl, "mmap", "--cold"), fault_address=False, name="b")
    fa = a[(a["kind"] == "fault") & (a["path"] == str(tbl)) & a["major"]]
    fb = b[(b["kind"] == "fault") & (b["path"] == str(tbl)) & b["major"]]
    assert sorted(fa["offset"].tolist()) == sorted(fb["offset"].tolist())
    assert fa["address"].notna().all() and fb["address"].isna().all()
    assert fa["tensor"].tolist() == fb["tensor"].tolist() and fa["row"].tolist() == fb["row"].tolist()


SAFETENSORS_READER = textwrap.dedent("""
    import os, signal, sys
    from safetensors import safe_open
    path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    signal.signal(signal.SIGUSR1, lambda *a: None)
    with safe_open(path, framework="numpy") as f:
        sys.stderr.write("ready\\n"); sys.stderr.flush()
        signal.pause()
        x = f.get_slice("b")[lo:hi]
    print(int(x.sum()))
""")


@pytest.mark.bpf
def test_safetensors_library_reader_is_attributed(tmp_path):
    """A reader nobody here wrote: safetensors' numpy slices through its own mapping."""
    from safetensors.numpy import save_file

    p = tmp_path / "st.safetensors"
    rng = np.random.default_rng(0)
    save_file({"a": rng.integers(0, 255, (4096, 512), dtype=np.uint8),
               "b": rng.integers(0, 255, (8192, 1024), dtype=np.uint8)}, str(p))
    script = tmp_path / "reader.py"
    script.write_text(SAFETENSORS_READER)
    lo, hi = 3000, 3040
    ev, _, _, _ = _traced(tmp_path, [PY, str(script), str(p), str(lo), str(hi)])
    f = ev[(ev["kind"] == "fault") & (ev["path"] == str(p))]
    assert len(f) > 0
    assert set(f["tensor"]) == {"b"}
    lay = layout.load(p)
    rows_per_page = max(1, PAGE // lay.tensor("b").row_bytes)
    assert f["row"].between(lo - rows_per_page, hi - 1).all(), f["row"].tolist()


def test_maps_enricher_flags_deleted_and_replaced_files(tmp_path):
    """device + inode -> path from /proc/PID/maps; a deleted or replaced file is flagged."""
    import mmap

    keep, gone = tmp_path / "keep.bin", tmp_path / "gone.bin"
    for q in (keep, gone):
        q.write_bytes(b"x" * PAGE * 2)
    maps = []
    for q in (keep, gone):
        with open(q, "rb") as fh:
            maps.append(mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ))
    st_keep, st_gone = os.stat(keep), os.stat(gone)
    os.unlink(gone)
    en = MappingPathEnricher(os.getpid(), Interner(""))
    k = (dev_t(os.major(st_keep.st_dev), os.minor(st_keep.st_dev)), st_keep.st_ino)
    g = (dev_t(os.major(st_gone.st_dev), os.minor(st_gone.st_dev)), st_gone.st_ino)
    assert en.files[k] == (str(keep), False)
    assert en.files[g] == (str(gone), True)
    assert any(m[4] == st_keep.st_ino for m in read_maps(os.getpid()))
    for m in maps:
        m.close()


@pytest.mark.bpf
def test_short_recording_of_a_running_mmap_reader_keeps_its_first_batches(tmp_path, tbl):
    """The probes are compiled one after the other (seconds each on a busy machine) but armed
    together, and the window (meta start_ns) begins when every one is armed: no read event or
    off-CPU span precedes it, and every batch that began inside the window is analysed, the
    first ones included (they used to straddle a window that began after the fault probe)."""
    markers = tmp_path / "m.jsonl"
    lab = subprocess.Popen(engramprof("lab", "run", "--table", tbl, "--reader", "mmap", "--cold", "--duration", 600,
                                      "--gap-ms", 20, "--markers", markers),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (not markers.exists() or markers.stat().st_size == 0) and time.monotonic() < deadline:
            assert lab.poll() is None, lab.stderr.read()
            time.sleep(0.05)
        out = tmp_path / "t"
        r = subprocess.run(engramprof("syscalls", "--pid", lab.pid, "--duration", 2, "--output", out,
                                      "--sample-hz", 0), capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
    finally:
        lab.terminate()
        lab.wait(30)
    meta = json.loads((out / "meta.json").read_text())
    t0, t1 = meta["start_ns"], meta["end_ns"]
    assert meta["end_reason"] == "duration"
    bundle = trace.load_bundle(out)
    ev = bundle.calls
    assert (ev["ts_ns"] >= t0).all()  # (a cold table may be all mapped by now: no fault at all)
    spans = bundle.samples("offcpu")
    assert spans is not None and len(spans) and (spans["start_ns"] >= t0).all()
    steps = [json.loads(line) for line in markers.read_text().splitlines() if line.strip()]
    inside = [s for s in steps if s["start_ns"] >= t0 and s["end_ns"] <= t1]
    assert len(inside) >= 20, (len(inside), (t1 - t0) / 1e9)
    bt = subprocess.run(engramprof("batch-tail", out, "--markers", markers, "--json"), capture_output=True, text=True,
                        timeout=120)
    assert bt.returncode == 0, bt.stderr
    d = json.loads(bt.stdout)
    assert d["batches"] == len(inside), (d["batches"], len(inside), d.get("notes"))
    # the first batch of the window is analysed: it begins within one step (+ the 20 ms gap) of t0
    first = min(s["start_ns"] for s in inside)
    assert first - t0 < 0.5e9
