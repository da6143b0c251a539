"""`engramprof export` bad input: one line, exit 2, before any probe is loaded (no BPF needed)."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.tracing import engramprof

REPO = Path(__file__).resolve().parent.parent


def _run_export(*args) -> subprocess.CompletedProcess:
    return subprocess.run(engramprof("export", *args), capture_output=True, text=True, cwd=REPO, timeout=60)


def _one_line_exit_2(r: subprocess.CompletedProcess, needle: str):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args,needle", [
    (("--listen", "0.0.0.0:9435"), "--allow-remote"),
    (("--listen", "10.1.2.3:9435"), "not a loopback address"),
    (("--listen", "127.0.0.1"), "HOST:PORT"),
    (("--listen", "127.0.0.1:70000"), "1-65535"),
    (("--label", "rank"), "NAME=VALUE"),
    (("--label", "2rank=1"), "NAME=VALUE"),
    (("--label", "__name__=x"), "NAME=VALUE"),
    (("--label", "file=x"), "exporter's own labels"),
    (("--label", "rank=1", "--label", "rank=2"), "given twice"),
    (("--window", "0"), "--window"),
])
def test_bad_input_one_line_exit_2(args, needle):
    _one_line_exit_2(_run_export("--pid", str(os.getpid()), *args), needle)


def test_port_in_use_one_line_exit_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = _run_export("--pid", str(os.getpid()), "--listen", f"127.0.0.1:{port}")
    _one_line_exit_2(r, "port in use")
