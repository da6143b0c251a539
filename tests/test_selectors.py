"""Selecting the target (issue 13): --pid repeated, --children, --cgroup, --file (real eBPF)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from engramprof import trace as tracefmt
from tests.tracing import Proc, engramprof


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sel") / "engram.safetensors"
    subprocess.run(engramprof("lab", "make-table", path, "--rows", "8192"), check=True, capture_output=True)
    return path


def start_reader(table: Path, *args: str) -> Proc:
    lab = Proc(engramprof("lab", "run", "--table", table, "--json", "--start-delay", "120", "--reader", "serial",
                          "--steps", "8", "--tokens", "4", "--warm", *args))
    lab.wait_line("lab: ready")
    return lab


def finish_reader(lab: Proc) -> dict:
    rc, out, err = lab.finish()
    assert rc == 0, err
    return json.loads(out)


def trace_of(tmp: Path, name: str, *selector: str) -> tuple[Proc, Path]:
    out = tmp / name
    tracer = Proc(engramprof("syscalls", *selector, "--output", out, "--json", "--sample-hz", "0", "--no-offcpu"))
    tracer.wait_line("Tracing")
    return tracer, out


def syscall_events(df):
    return df[df["kind"] == "syscall"].reset_index(drop=True)


def counts_by_pid(trace: Path) -> dict[int, int]:
    df = syscall_events(tracefmt.load(trace))
    return {int(k): int(v) for k, v in df["pid"].value_counts().items()}


@pytest.mark.bpf
def test_two_pids_each_seen_whole(tmp_path, table):
    a, b = start_reader(table), start_reader(table)
    tracer, out = trace_of(tmp_path, "two", "--pid", str(a.pid), "--pid", str(b.pid))
    for lab in (a, b):
        os.kill(lab.pid, signal.SIGUSR1)
    la, lb = finish_reader(a), finish_reader(b)
    rc, _, err = tracer.finish()
    assert rc == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["end_reason"] == "target-exit" and meta["pids"] == [a.pid, b.pid] and meta["pid"] == a.pid
    assert counts_by_pid(out) == {a.pid: la["calls"], b.pid: lb["calls"]}
    r = subprocess.run(engramprof("batch-tail", out, "--json"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p["pid"] for p in json.loads(r.stdout)["processes"]) == sorted([a.pid, b.pid])
