"""`engramprof demo` (what `make demo` runs): end to end, real probes, cleans up after itself."""
from __future__ import annotations

import glob
import subprocess
import tempfile
import time

import pytest

from tests.tracing import engramprof


@pytest.mark.bpf
def test_demo_before_after_verdicts_and_cleanup():
    before = set(glob.glob(f"{tempfile.gettempdir()}/engramprof-demo-*"))
    t0 = time.monotonic()
    r = subprocess.run(engramprof("demo"), capture_output=True, text=True, timeout=240)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "verdict python-scheduling" in out and "verdict healthy" in out
    assert "pool reader" in out and "nowait reader" in out
    assert took < 120
    assert set(glob.glob(f"{tempfile.gettempdir()}/engramprof-demo-*")) == before
    assert not glob.glob("/sys/fs/cgroup/*/engramprof-*")
