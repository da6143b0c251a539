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
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"

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


def pytest_configure(config):
    config.addinivalue_line("markers", "bpf: loads real eBPF probes (needs root and a traceable kernel)")


def pytest_runtest_setup(item):
    if item.get_closest_marker("bpf") is not None:
        require_bpf()


@pytest.fixture
def bpf_ok() -> bool:
    """Request it to need BPF (same effect as @pytest.mark.bpf); returns True."""
    require_bpf()
    return True


@pytest.fixture(scope="session")
def python_exe() -> str:
    """The project's interpreter (.venv, where BCC imports), else the running one."""
    return str(VENV_PY) if VENV_PY.exists() else sys.executable
