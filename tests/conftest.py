"""Shared test fixtures.

BPF tests: mark them ``@pytest.mark.bpf`` (or request the ``bpf_ok`` fixture).  When this
environment cannot trace (not root / no CAP_BPF+CAP_PERFMON, BCC does not import, tracefs
missing, required tracepoints or kernel headers missing) they are skipped with the reason --
unless ENGRAMPROF_REQUIRE_BPF=1, in which case they fail with it (CI on a traceable machine
sets it so that a broken environment cannot pass silently as "all skipped").

The decision is engramprof.host.doctor.can_trace() -- the same cheap check `engramprof syscalls`
uses -- computed once per session.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"

# A job started in the background by a shell without job control (`./.ci/run &`, nohup) starts
# with SIGINT ignored, and every process the tests spawn would inherit that: a test's Ctrl-C
# (SIGINT) to syscount-bpfcc or to `lab scenario` during its set-up was then ignored (local CI
# runs 7 and 8).  A handler, unlike SIG_IGN, is reset to the default at exec: children start as
# from an interactive shell.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_REASON: list[str | None] = []  # session cache: [None] when BPF works, [reason] otherwise


def bpf_unavailable_reason() -> str | None:
    """None when BPF tracing works here, else a one-line reason (cached per session)."""
    if not _REASON:
        try:
            from engramprof.host.doctor import can_trace

            ok, reason = can_trace()
        except Exception as exc:  # the check itself must not crash collection
            ok, reason = False, f"engramprof.host.doctor.can_trace() raised {type(exc).__name__}: {exc}"
        _REASON.append(None if ok else reason)
    return _REASON[0]


def bpf_required() -> bool:
    return os.environ.get("ENGRAMPROF_REQUIRE_BPF") == "1"


def require_bpf() -> None:
    """Skip (or, with ENGRAMPROF_REQUIRE_BPF=1, fail) the calling test unless BPF works here."""
    reason = bpf_unavailable_reason()
    if reason is None:
        return
    if bpf_required():
        pytest.fail(f"ENGRAMPROF_REQUIRE_BPF=1 but BPF is unavailable: {reason}", pytrace=False)
    pytest.skip(f"needs BPF: {reason}")


_SCENARIO_DIR: list[str] = []  # the session's own scenario parent, removed at its end


def pytest_configure(config):
    config.addinivalue_line("markers", "bpf: loads real eBPF probes (needs root and a traceable kernel)")
    # Scenarios (and `lab scenario`'s kept markers directories, engramprof-markers-*, which
    # the CLI leaves for the user) go to a private directory of this session on the same disk,
    # removed at its end: the suite left four markers directories in /var/tmp a run.
    if "ENGRAMPROF_SCENARIO_DIR" not in os.environ:
        import tempfile

        from engramprof.lab.host import default_tmp_parent
        d = tempfile.mkdtemp(prefix="engramprof-tests-", dir=default_tmp_parent())
        os.environ["ENGRAMPROF_SCENARIO_DIR"] = d
        _SCENARIO_DIR.append(d)


def pytest_unconfigure(config):
    import shutil
    for d in _SCENARIO_DIR:
        shutil.rmtree(d, ignore_errors=True)


def pytest_runtest_setup(item):
    if item.get_closest_marker("bpf") is not None:
        require_bpf()
        # the tests before it wrote files (venvs, wheels, tables, traces): written back now,
        # not 30 s later in the middle of this test's measured reads (tests/tracing.py,
        # settle_writeback: a cold reader's reads queued behind it are storage, rightly)
        os.sync()


@pytest.fixture
def bpf_ok() -> bool:
    """Request it to need BPF (same effect as @pytest.mark.bpf); returns True."""
    require_bpf()
    return True


@pytest.fixture(scope="session")
def python_exe() -> str:
    """The project's interpreter (.venv, where BCC imports), else the running one."""
    return str(VENV_PY) if VENV_PY.exists() else sys.executable


def _descendants() -> dict[int, str]:
    """This test process's descendants now: pid -> "starttime cmdline" (the start time tells a
    reused pid apart)."""
    parent: dict[int, int] = {}
    info: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] in ("Z", "X"):  # exited, not yet waited for: holds no CPU
                continue
            parent[int(d)] = int(fields[1])
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            info[int(d)] = f"{fields[19]} {cmd.strip()}"
        except (OSError, ValueError, IndexError):
            continue
    me, out = os.getpid(), {}
    for pid in parent:
        p, seen = pid, 0
        while p in parent and p != me and seen < 64:
            p, seen = parent[p], seen + 1
        if p == me and pid != me:
            out[pid] = info[pid]
    return out


@pytest.fixture(autouse=True)
def no_stray_processes():
    """A process a test started and left running (a lab reader, a recorder, fio) competes with
    the next tests for the 2 CPUs and the disk, and bends their verdicts: after each test, the
    ones it left are killed and named on stderr.  Processes of wider-scoped fixtures (set up
    before this one) are left alone."""
    before = _descendants()
    yield
    import signal
    import time

    stray = {p: c for p, c in _descendants().items() if before.get(p) != c}
    if not stray:
        return
    deadline = time.monotonic() + 2
    while stray and time.monotonic() < deadline:  # a process being reaped by its test's finally
        time.sleep(0.1)
        now = _descendants()
        stray = {p: c for p, c in stray.items() if now.get(p) == c}
    for p, c in stray.items():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            continue
        print(f"\nconftest: killed a process the test left running: {p} {c.split(' ', 1)[-1]}", file=sys.stderr)
