"""The lab's helper processes (engramprof/lab/dropper.py, streamer.py on lab/helper_loop.py):
they end on SIGTERM / SIGINT or when their parent exits, print their count, keep it in a new
count file, and refuse a missing file or an existing count file in one line.  No root needed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PY = sys.executable


def _wait_count(path, at_least: int, timeout: float = 20.0) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path) as f:
                n = int(f.read().strip() or 0)
            if n >= at_least:
                return n
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {at_least}")


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(os.urandom(3 << 20))
    return p


def _stopped_by(argv, count, at_least: int, sig, times: int = 1) -> int:
    """Run a helper until its count file reaches ``at_least``, send ``sig`` ``times`` times;
    it must end with status 0 and print the count its file holds."""
    p = subprocess.Popen([PY, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_count(count, at_least)
        for _ in range(times):
            p.send_signal(sig)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    (n,) = json.loads(out.strip().splitlines()[-1]).values()
    assert n >= at_least and int(count.read_text()) == n
    return n


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_dropper_ends_on_a_stop_signal_with_its_count(tmp_path, data, sig):
    count = tmp_path / "drops.count"
    # a burst of signals while it sleeps between drops: it ends once, cleanly
    _stopped_by(["engramprof.lab.dropper", "--every-ms", "20", "--count-file", str(count), str(data)], count, 3, sig,
                times=5)


def test_streamer_ends_on_sigterm_mid_pass_with_its_count(tmp_path, data):
    count = tmp_path / "passes.count"
    _stopped_by(["engramprof.lab.streamer", str(data), str(count)], count, 2, signal.SIGTERM)


def test_a_helper_ends_when_its_parent_exits(tmp_path, data):
    count = tmp_path / "drops.count"
    # the parent: a python that starts the dropper, prints its pid and exits once the dropper
    # has dropped once (the helper reads its parent's pid at start: a parent gone before that is
    # not seen, so the parent stays until the count file holds a count)
    code = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', 'engramprof.lab.dropper', "
            f"'--every-ms', '20', '--count-file', {str(count)!r}, {str(data)!r}], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); print(p.pid, flush=True); end = time.monotonic() + 20\n"
            f"c = {str(count)!r}\n"
            "while time.monotonic() < end and not (os.path.exists(c) and open(c).read().strip()):\n"
            "    time.sleep(0.02)\n")
    pid = int(subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=30).stdout)
    try:
        _wait_count(count, 1)
        end = time.monotonic() + 10
        while time.monotonic() < end and os.path.exists(f"/proc/{pid}") and not _zombie(pid):
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), "the dropper outlived its parent"
    finally:
        if os.path.exists(f"/proc/{pid}") and not _zombie(pid):
            os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_missing_file_or_existing_count_file_is_one_line_and_status_1(tmp_path, data):
    r = subprocess.run([PY, "-m", "engramprof.lab.dropper", "--every-ms", "20", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.strip() == f"dropper: {tmp_path / 'nope'}: No such file or directory"
    existing = tmp_path / "taken.count"
    existing.write_text("x")
    r = subprocess.run([PY, "-m", "engramprof.lab.streamer", str(data), str(existing)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.strip() == f"streamer: {existing}: File exists"
    assert existing.read_text() == "x"
    r = subprocess.run([PY, "-m", "engramprof.lab.streamer"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("usage:")
