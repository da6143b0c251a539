"""One recorder, one source protocol (issue 21 §1): every registered source implements the
whole protocol, the recorder never names a concrete source, and a source that cannot record
(unavailable, failing to load or to arm) is one "X not traced: why" note while the rest records.

The first three need no root; the last records for real (eBPF)."""
from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engramprof.record import recorder as recorder_mod
from engramprof.record.sources import SOURCES, Availability, Source
from engramprof.record.sources.base import NOT_ASKED, YES

#: the protocol: what the recorder calls on every source
PROTOCOL = ("available", "load", "arm", "begin_window", "drain", "sync_targets", "totals", "summary", "close")
#: the steps with a default in the base class (a source overrides what it needs)
DEFAULTED = ("start_meta", "detach", "snapshot", "closing_meta", "live_targets", "seen_tgids")


def test_every_registered_source_implements_the_whole_protocol():
    assert len(SOURCES) == len(set(SOURCES)) >= 6
    names = [n for cls in SOURCES for n in (cls.name, *cls.aliases)]
    assert len(names) == len(set(names)), names  # recorder.<name> is one source
    assert sum(cls.required for cls in SOURCES) == 1  # the one whose summary is the top level
    for cls in SOURCES:
        assert issubclass(cls, Source) and not inspect.isabstract(cls), cls
        for m in PROTOCOL:
            impl = getattr(cls, m)
            assert callable(impl) and not getattr(impl, "__isabstractmethod__", False), (cls, m)
            assert impl is not getattr(Source, m), (cls, m)  # its own, not the abstract one
        for m in DEFAULTED:
            assert callable(getattr(cls, m)), (cls, m)
        assert cls.title and cls.absent and isinstance(cls.absent_meta, dict), cls


def test_the_recorder_never_names_a_concrete_source():
    """No class, module, attribute or string of a source in recorder.py (docstrings aside): it
    loops over the registry."""
    path = Path(recorder_mod.__file__)
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    concrete = {cls.__name__ for cls in SOURCES} | {cls.__module__.rsplit(".", 1)[1] for cls in SOURCES}
    concrete |= {n for cls in SOURCES for n in (cls.name, *cls.aliases)}
    seen = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            seen.add(n.id)
        elif isinstance(n, ast.Attribute):
            seen.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            seen.update(n.value.replace(":", " ").split())
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            mod = getattr(n, "module", None) or ""
            seen.update(mod.split("."))
            seen.update(a.name.split(".")[-1] for a in n.names)
    assert not (seen & concrete), seen & concrete


# ---- the recorder's loop, with fake sources (no probe, no root) -------------------------

class Fake(Source):
    """Records the steps it is driven through; ``fail_at``: the step that raises."""

    name = "fake"
    title = "fake parts"
    calls: list

    def __init__(self, rec, fail_at: str | None = None, why: str = ""):
        super().__init__(rec)
        self.fail_at, self.why, self.steps, self.drains = fail_at, why, [], 0

    def _step(self, step):
        self.steps.append(step)
        if self.fail_at == step:
            raise RuntimeError(f"{step} failed on purpose")

    def available(self):
        self.steps.append("available")
        return Availability(False, self.why) if self.fail_at == "available" else YES

    def load(self):
        self._step("load")

    def arm(self):
        self._step("arm")

    def begin_window(self, start_ns):
        self._step("begin_window")

    def drain(self, sink):
        self.drains += 1

    def detach(self):
        self._step("detach")
        return None

    def sync_targets(self):
        pass

    def totals(self):
        return {"drains": self.drains}

    def summary(self):
        return {"drains": self.drains}

    def close(self):
        self.steps.append("close")


def _fakes(**kinds):
    """Source classes named after ``kinds`` (name -> (fail_at, why, required))."""
    out = []
    for name, (fail_at, why, required) in kinds.items():
        cls = type(f"Fake_{name}", (Fake,), {"name": name, "title": f"{name} events", "required": required,
                                             "absent_meta": {name: None},
                                             "__init__": lambda self, rec, f=fail_at, w=why: Fake.__init__(self, rec, f, w)})
        out.append(cls)
    return out


def test_a_source_that_cannot_record_is_one_note_and_the_rest_records(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_mod, "check_privileges", lambda: None)
    classes = _fakes(main=(None, "", True), gone=("available", "the kernel lacks it", False),
                     off=("available", "", False), broken=("load", "", False), unarmed=("arm", "", False),
                     late=("begin_window", "", False), fine=(None, "", False))
    r = recorder_mod.Recorder(os.getpid(), output=str(tmp_path / "t"), sources=classes)
    assert r.gone is not None and r.fine is not None  # before start: every source of the list
    r.start()
    r.run(duration=0.3)
    summary = r.finish()
    by = {type(s).name: s for s in [*r.sources]}
    assert set(by) == {"main", "fine"}
    assert r.gone is None and r.broken is None and r.fine is by["fine"]
    notes = list(r.notes)
    assert notes == ["gone events not traced: the kernel lacks it",  # unavailable: its reason
                     "broken events not traced: load failed on purpose",
                     "unarmed events not traced: arm failed on purpose",
                     "late events not traced: begin_window failed on purpose"]  # "off": not asked, no note
    # the rest recorded: the required source's summary is the top level, the others by name
    assert summary["drains"] >= 2 and summary["fine"]["drains"] == summary["drains"]
    assert by["main"].steps == ["available", "load", "arm", "begin_window", "detach", "close"]
    assert by["fine"].steps == by["main"].steps
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["complete"] and meta["end_reason"] == "duration" and meta["notes"] == notes
    assert meta["fine"] == {"drains": summary["drains"]}
    assert all(meta[k] is None for k in ("gone", "off", "broken", "unarmed", "late"))  # absent_meta


def test_a_required_source_that_cannot_load_leaves_a_closed_bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_mod, "check_privileges", lambda: None)
    classes = _fakes(first=(None, "", False), main=("load", "", True), never=(None, "", False))
    r = recorder_mod.Recorder(os.getpid(), output=str(tmp_path / "t"), sources=classes)
    with pytest.raises(RuntimeError, match="load failed on purpose"):
        r.start()
    assert r.probe is None and r.sources == []
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["complete"] and meta["end_reason"] == "probe load failed"


def test_not_asked_is_silent():
    assert NOT_ASKED == Availability(False, "") and not NOT_ASKED.why and YES.ok


# ---- for real --------------------------------------------------------------------------

READER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
print("ready", file=sys.stderr, flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    os.preadv(fd, [bytearray(4096)], 0)
    time.sleep(0.001)
"""


@pytest.mark.bpf
def test_an_unavailable_source_beside_the_real_ones(tmp_path):
    """The real syscall source with a source that says it cannot record: one note, and the
    calls recorded as ever."""
    from engramprof import trace
    from engramprof.record.sources.syscalls import SyscallsSource

    class Missing(Fake):
        name, title = "missing", "missing reads"

        def __init__(self, rec):
            super().__init__(rec, "available", "the kernel lacks missing:tracepoint")

    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 16))
    p = subprocess.Popen([sys.executable, "-c", READER, str(data)], stderr=subprocess.PIPE, text=True)
    try:
        assert "ready" in p.stderr.readline()
        r = recorder_mod.Recorder(p.pid, output=str(tmp_path / "t"), sources=[Missing, SyscallsSource])
        r.start()
        time.sleep(0.2)
        r.run(duration=1.5)
        summary = r.finish()
    finally:
        p.kill()
        p.wait()
    assert [n for n in summary["notes"] if "missing" in n] == ["missing reads not traced: the kernel lacks "
                                                               "missing:tracepoint"]
    assert summary["calls"] > 100 and summary["recorded"] > 100 and summary["end_reason"] == "duration"
    assert "missing" not in summary and r.missing is None
    ev = trace.load(tmp_path / "t")
    assert len(ev) == summary["recorded"] and set(ev["path"]) == {str(data)}
