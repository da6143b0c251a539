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
    (("--label", "rank"), "NAME=VALUE"),
])
def test_bad_input_one_line_exit_2(args, needle):
    _one_line_exit_2(_run_export("--pid", str(os.getpid()), *args), needle)


def test_pid_that_does_not_exist_one_line_exit_2():
    _one_line_exit_2(_run_export("--pid", "999999999"), "no process with pid 999999999")


@pytest.mark.parametrize("text,allow,needle", [
    ("0.0.0.0:9435", False, "--allow-remote"),
    ("10.1.2.3:9435", False, "not a loopback address"),
    ("[::]:9435", False, "not a loopback address"),
    ("127.0.0.1", False, "HOST:PORT"),
    ("127.0.0.1:70000", False, "1-65535"),
    ("127.0.0.1:http", False, "1-65535"),
    ("example.org:9435", True, "IP address or localhost"),
])
def test_listen_checks(text, allow, needle):
    from engramprof.errors import UserError
    from engramprof.export.options import parse_listen

    with pytest.raises(UserError) as e:
        parse_listen(text, allow)
    assert e.value.code == 2 and needle in str(e.value) and "\n" not in str(e.value)


def test_listen_accepts_loopback_and_remote_when_allowed():
    from engramprof.export.options import parse_listen

    assert parse_listen("127.0.0.1:9435", False).url == "http://127.0.0.1:9435/metrics"
    assert parse_listen("localhost:1", False).host == "127.0.0.1"
    assert parse_listen("[::1]:9435", False).url == "http://[::1]:9435/metrics"
    assert parse_listen("0.0.0.0:9435", True).port == 9435


@pytest.mark.parametrize("items,needle", [
    (["rank"], "NAME=VALUE"),
    (["2rank=1"], "NAME=VALUE"),
    (["__name__=x"], "NAME=VALUE"),
    (["rank="], "NAME=VALUE"),
    (["file=x"], "exporter's own labels"),
    (["rank=1", "rank=2"], "given twice"),
])
def test_label_checks(items, needle):
    from engramprof.errors import UserError
    from engramprof.export.options import parse_labels

    with pytest.raises(UserError) as e:
        parse_labels(items)
    assert e.value.code == 2 and needle in str(e.value)


def test_labels_parsed_in_order():
    from engramprof.export.options import parse_labels

    assert parse_labels(["rank=2", "host=a=b"]) == {"rank": "2", "host": "a=b"}


@pytest.mark.parametrize("w", [0, 0.5, float("nan"), float("inf"), -3])
def test_window_checks(w):
    from engramprof.errors import UserError
    from engramprof.export.options import check_window

    with pytest.raises(UserError):
        check_window(w)


def test_port_in_use_one_line_exit_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = _run_export("--pid", str(os.getpid()), "--listen", f"127.0.0.1:{port}")
    _one_line_exit_2(r, "port in use")
