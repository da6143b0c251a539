"""engramprof doctor: real checks on this machine (bpf) and injected faults (no root needed)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from engramprof.host import doctor as doc
from engramprof.host import tracepoints as tp

REPO = Path(__file__).resolve().parent.parent
FULL_CAPS = "000001ffffffffff"


# ----------------------------------------------------------------------------- a fake healthy machine

def _ok_probe():
    return {"load": {"ok": True, "events": 1, "error": ""},
            "ringbuf": {"ok": True, "ringbuf_records": 1, "error": ""},
            "task_storage": {"ok": True, "error": ""}}


def _no_probe():
    raise AssertionError("the BPF self-test must not run when a precondition failed")


class _FakeBcc:
    __version__ = "0.0-fake"
    __file__ = "/fake/bcc/__init__.py"


def _make_tracefs(root: Path, names) -> Path:
    for n in names:
        cat, ev = n.split(":", 1)
        d = root / "events" / cat / ev
        d.mkdir(parents=True, exist_ok=True)
        (d / "format").write_text(f"name: {ev}\n")
    return root


@pytest.fixture
def fake(tmp_path):
    """run_checks keywords for a machine where everything the gate needs is present (all faked)."""
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nCapEff:\t{FULL_CAPS}\n")
    tracefs = _make_tracefs(tmp_path / "tracefs", tp.ALL)
    modules = tmp_path / "modules"
    (modules / "6.18.0-fake" / "build" / "include").mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    return dict(path=data, euid=0, proc_status=status, release="6.18.0-fake",
                tracefs_candidates=(str(tracefs),), bcc_import=lambda: _FakeBcc,
                modules_root=modules, kheaders=tmp_path / "no-kheaders", bpf_probe=_ok_probe)


def _gate_kw(kw):
    return {k: v for k, v in kw.items()
            if k in ("euid", "proc_status", "tracefs_candidates", "tracepoints", "bcc_import",
                     "release", "modules_root", "kheaders")}


def _assert_fail_with_fix(report, name, fix_contains):
    row = report.get(name)
    assert row.status == "fail", row
    assert row.fix and fix_contains in row.fix, row
    assert not report.ok


def test_fake_healthy_machine_is_ok(fake):
    report = doc.run_checks(**fake)
    assert report.ok, [c for c in report.checks if c.status == "fail"]
    assert doc.can_trace(**_gate_kw(fake)) == (True, "")
    for c in report.checks:
        assert c.status in doc.STATUSES
        assert c.status != "fail"
        if c.status == "warn":
            assert c.fix, c
    names = [c.name for c in report.checks]
    assert len(names) == len(set(names))
    for required in tp.REQUIRED:
        assert report.get(f"tracepoint {required}").status == "pass"
    # the doctor's own temporary files are gone
    assert list(fake["path"].iterdir()) == []


def test_missing_required_tracepoint_fails(fake):
    bogus = "syscalls:sys_enter_nosuch"
    tps = {n: n in tp.REQUIRED for n in tp.ALL} | {bogus: True}
    report = doc.run_checks(**fake, tracepoints=tps)
    _assert_fail_with_fix(report, f"tracepoint {bogus}", "CONFIG_FTRACE_SYSCALLS")
    ok, reason = doc.can_trace(**_gate_kw(fake), tracepoints=tps)
    assert not ok and bogus in reason and "fix:" in reason


def test_missing_evidence_tracepoint_warns(fake):
    fmt = Path(fake["tracefs_candidates"][0]) / "events/filemap/mm_filemap_add_to_page_cache/format"
    fmt.unlink()
    report = doc.run_checks(**fake)
    row = report.get("tracepoints: evidence")
    assert row.status == "warn" and "mm_filemap_add_to_page_cache" in row.detail and row.fix
    assert report.ok


def test_unmounted_tracefs_fails(fake, tmp_path):
    fake.update(tracefs_candidates=(str(tmp_path / "not-mounted"),), bpf_probe=_no_probe)
    report = doc.run_checks(**fake)
    _assert_fail_with_fix(report, "tracefs", "mount -t tracefs")
    for required in tp.REQUIRED:
        assert report.get(f"tracepoint {required}").status == "fail"
    _assert_fail_with_fix(report, "bpf: tracepoint program loads", "fix the failed rows")
    ok, reason = doc.can_trace(**_gate_kw(fake))
    assert not ok and "not mounted" in reason and "mount -t tracefs" in reason


def test_bcc_import_failure_fails(fake):
    def broken():
        raise ImportError("No module named 'bcc'")

    fake.update(bcc_import=broken, bpf_probe=_no_probe)
    report = doc.run_checks(**fake)
    _assert_fail_with_fix(report, "bcc", "make setup")
    assert "No module named 'bcc'" in report.get("bcc").detail
    assert report.get("bpf: tracepoint program loads").status == "fail"
    ok, reason = doc.can_trace(**_gate_kw(fake))
    assert not ok and "cannot import bcc" in reason


def test_not_root_without_caps_fails(fake, tmp_path):
    status = tmp_path / "status-user"
    status.write_text("CapEff:\t0000000000000000\n")
    fake.update(euid=1000, proc_status=status, bpf_probe=_no_probe)
    report = doc.run_checks(**fake)
    _assert_fail_with_fix(report, "privileges", "CAP_BPF")
    ok, reason = doc.can_trace(**_gate_kw(fake))
    assert not ok
    assert reason.startswith("not root") and "needs root or CAP_BPF+CAP_PERFMON" in reason


@pytest.mark.parametrize("euid,caps,status", [
    (1000, (1 << doc.CAP_BPF) | (1 << doc.CAP_PERFMON), "pass"),
    (1000, 1 << doc.CAP_BPF, "fail"),
    (1000, 1 << doc.CAP_SYS_ADMIN, "pass"),
    (0, 0, "fail"),  # root in a container that dropped the capabilities
    (0, int(FULL_CAPS, 16), "pass"),
])
def test_privileges_from_capeff(tmp_path, euid, caps, status):
    p = tmp_path / "status"
    p.write_text(f"CapEff:\t{caps:016x}\n")
    row = doc.check_privileges(euid, p)
    assert row.status == status, row
    assert bool(row.fix) == (status == "fail")


def test_bpf_load_failure_fails(fake):
    def probe():
        return {"load": {"ok": False, "events": 0,
                         "error": "Failed to compile BPF module <text> (fatal error: 'linux/fs.h' file not found)"},
                "ringbuf": None, "task_storage": None}

    fake.update(bpf_probe=probe)
    report = doc.run_checks(**fake)
    _assert_fail_with_fix(report, "bpf: tracepoint program loads", "make setup")
    assert "linux/fs.h" in report.get("bpf: tracepoint program loads").detail
    assert report.get("bpf: ring buffer map").status == "warn"
    assert report.get("bpf: task storage map").status == "warn"


def test_ringbuf_and_task_storage_unsupported_warn(fake):
    def probe():
        return {"load": {"ok": True, "events": 3, "error": ""},
                "ringbuf": {"ok": False, "error": "invalid map type"},
                "task_storage": {"ok": False, "error": "unknown func bpf_task_storage_get"}}

    fake.update(bpf_probe=probe)
    report = doc.run_checks(**fake)
    assert report.ok
    for name in ("bpf: ring buffer map", "bpf: task storage map"):
        row = report.get(name)
        assert row.status == "warn" and row.fix


def test_missing_kernel_headers_fails(fake, tmp_path):
    fake.update(modules_root=tmp_path / "empty-modules")
    report = doc.run_checks(**fake)
    _assert_fail_with_fix(report, "kernel headers", "make setup")


def test_psi_missing_warns(fake, tmp_path):
    report = doc.run_checks(**fake, pressure_dir=tmp_path / "no-pressure")
    row = report.get("PSI")
    assert row.status == "warn" and "psi=1" in row.fix
    assert report.ok


def test_cachestat_enosys_warns_with_mincore_fallback(fake):
    seen = []

    def enosys(fd):
        seen.append(os.fstat(fd).st_size)
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    report = doc.run_checks(**fake, cachestat_call=enosys)
    row = report.get("cachestat(2)")
    assert row.status == "warn" and "mincore" in row.detail and row.fix
    assert seen and seen[0] > 0  # called on the doctor's own temporary file
    assert report.ok
    assert list(fake["path"].iterdir()) == []


def test_rwf_nowait_eopnotsupp_warns_and_cleans_up(fake):
    def nope(fd, size):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    report = doc.run_checks(**fake, preadv=nope)
    row = report.get("RWF_NOWAIT")
    assert row.status == "warn" and "not supported" in row.detail and row.fix
    assert report.ok
    assert list(fake["path"].iterdir()) == []


def test_real_cachestat_and_rwf_nowait_on_own_temp_file(tmp_path):
    """The real syscalls, unprivileged, on a file the doctor creates in tmp_path and removes."""
    assert doc.check_cachestat(tmp_path).status in ("pass", "warn")
    assert doc.check_rwf_nowait(tmp_path).status in ("pass", "warn")
    assert list(tmp_path.iterdir()) == []


MI_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
"""
MI_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
MI_HYBRID = MI_V1 + "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize("text,version,memory,io", [
    (MI_V1, "v1", "v1 'memory'", "v1 'blkio'"),
    (MI_V2, "v2", "v2 'memory'", "v2 'io'"),
    (MI_HYBRID, "hybrid", "v1 'memory'", "v1 'blkio'"),
    ("", "none", None, None),
])
def test_cgroup_detection(tmp_path, text, version, memory, io):
    mi = tmp_path / "mountinfo"
    mi.write_text(text)

    def read(p):
        if p == "/sys/fs/cgroup/cgroup.controllers":
            return "cpuset cpu io memory pids\n"
        if p == "/sys/fs/cgroup/unified/cgroup.controllers":
            return "hugetlb\n"
        return None

    rows = {c.name: c for c in doc.check_cgroups(mi, read)}
    assert rows["cgroup version"].detail.startswith(version) or version == "none"
    for label, want in (("memory", memory), ("io", io)):
        row = rows[f"cgroup {label} controller"]
        if want is None:
            assert row.status == "warn" and row.fix
        else:
            assert row.status == "pass" and row.detail.startswith(want), row
    if version == "v1":
        assert set(doc.parse_cgroups(doc.parse_mountinfo(text), read)["v1"]) == {"memory", "blkio", "cpu", "cpuacct"}


def test_kernel_version_and_kprobes_info(tmp_path):
    assert doc.check_kernel("6.18.44-fc-v595", "x86_64").status == "pass"
    old = doc.check_kernel("4.19.0-21-amd64", "x86_64")
    assert old.status == "warn" and old.fix
    cfg = tmp_path / "config"
    cfg.write_text("CONFIG_BPF_SYSCALL=y\n# CONFIG_KPROBES is not set\n")
    row = doc.check_kprobes(None, "x", [str(cfg)])
    assert row.status == "info" and row.detail.startswith("not available") and "CONFIG_KPROBES is not set" in row.detail
    cfg.write_text("CONFIG_KPROBES=y\n")
    assert doc.check_kprobes(None, "x", [str(cfg)]).detail.startswith("available")


# ----------------------------------------------------------------------------- the CLI

def _cli(python_exe, *args, timeout=300):
    return subprocess.run([python_exe, "-m", "engramprof", "doctor", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def cli_json(python_exe, tmp_path_factory):
    """One real `engramprof doctor --json` run, shared (it compiles a BPF program when it can)."""
    d = tmp_path_factory.mktemp("doctor-path")
    p = _cli(python_exe, "--json", "--path", str(d))
    return p, d


def test_cli_json_shape_and_exit_code(cli_json):
    p, d = cli_json
    out = json.loads(p.stdout)
    assert set(out) == {"ok", "read_paths", "checks"} and isinstance(out["ok"], bool)
    assert set(out["read_paths"]) <= {"syscalls", "faults", "io_uring", "libaio"}
    assert out["checks"], out
    for c in out["checks"]:
        assert set(c) == {"name", "status", "detail", "fix"}
        assert c["status"] in doc.STATUSES and isinstance(c["detail"], str) and isinstance(c["fix"], str)
    assert out["ok"] == (not any(c["status"] == "fail" for c in out["checks"]))
    assert p.returncode == (0 if out["ok"] else 1), p.stderr
    assert list(d.iterdir()) == []


@pytest.mark.bpf
def test_this_machine_passes(cli_json):
    """On the development/CI kernel every check passes; kprobes is info (CONFIG_KPROBES off)."""
    p, _ = cli_json
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["ok"], p.stdout
    rows = {c["name"]: c for c in out["checks"]}
    assert rows["kprobes"]["status"] == "info"
    not_pass = {n: c for n, c in rows.items() if c["status"] != "pass" and n != "kprobes"}
    assert not not_pass, not_pass
    assert "saw" in rows["bpf: tracepoint program loads"]["detail"]
    assert doc.can_trace() == (True, "")
    # x86 6.18: every fault tracepoint is there, io_uring's and the AIO syscalls' too
    assert out["read_paths"] == ["syscalls", "faults", "io_uring", "libaio"]
    assert "exceptions:page_fault_user" in rows["tracepoints: page faults"]["detail"]


def test_cli_fault_exit_1_table_and_json(fake, monkeypatch):
    from typer.testing import CliRunner

    from engramprof.cli import app

    real = doc.run_checks
    kw = dict(fake, tracefs_candidates=("/nonexistent/tracefs",), bpf_probe=_no_probe)
    kw.pop("path")
    monkeypatch.setattr(doc, "run_checks", lambda path: real(path, **kw))
    runner = CliRunner()
    r = runner.invoke(app, ["doctor", "--path", str(fake["path"])])
    assert r.exit_code == 1, r.output
    assert "NOT OK" in r.output and "mount -t tracefs" in r.output
    r = runner.invoke(app, ["doctor", "--json", "--path", str(fake["path"])])
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["ok"] is False
    assert {c["name"]: c["status"] for c in out["checks"]}["tracefs"] == "fail"


def test_cli_bad_path_exit_2(python_exe, tmp_path):
    p = _cli(python_exe, "--path", str(tmp_path / "missing"), timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("engramprof: --path") and "Traceback" not in p.stderr


# ----------------------------------------------------------------------------- the conftest bpf marker

@pytest.mark.parametrize("require,outcome", [(None, "skipped"), ("1", "failed")])
def test_bpf_marker_skips_or_fails_with_reason(tmp_path, python_exe, require, outcome):
    conftest = (REPO / "tests" / "conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(conftest + "\n_REASON.append('fake: tracefs missing')\n")
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.bpf
        def test_marked():
            pass

        def test_fixture(bpf_ok):
            pass

        def test_plain():
            pass
    """))
    env = {k: v for k, v in os.environ.items() if k != "ENGRAMPROF_REQUIRE_BPF"}
    if require:
        env["ENGRAMPROF_REQUIRE_BPF"] = require
    p = subprocess.run([python_exe, "-m", "pytest", "-q", "-rsE", "-p", "no:cacheprovider", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    if outcome == "skipped":
        assert p.returncode == 0, p.stdout
        assert "1 passed, 2 skipped" in p.stdout and "needs BPF: fake: tracefs missing" in p.stdout
    else:
        assert p.returncode == 1, p.stdout
        assert "1 passed, 2 error" in p.stdout
        assert "ENGRAMPROF_REQUIRE_BPF=1 but BPF is unavailable: fake: tracefs missing" in p.stdout


def test_every_checked_tracepoint_is_used_by_the_probe():
    """doctor checks the tracepoint inventory; each entry is hooked by the probe (no dead checks)."""
    root = Path(__file__).resolve().parent.parent
    text = "".join(p.read_text() for p in (root / "probes").glob("*.[ch]"))
    for name in doc._default_tracepoints():
        cat, ev = name.split(":", 1)
        # a syscall's enter/exit pair may be hooked through probes/inflight.h's CALL_HOOKS(name, ...)
        pair = ev.removeprefix("sys_enter_").removeprefix("sys_exit_") if cat == "syscalls" else None
        assert f"TRACEPOINT_PROBE({cat}, {ev})" in text or (pair and f"\nCALL_HOOKS({pair}," in text), name


def test_every_fault_tracepoint_is_used_by_the_fault_probe():
    text = (Path(__file__).resolve().parent.parent / "probes" / "faults.bpf.c").read_text()
    from engramprof.bpf import faults
    assert set(faults.REQUIRED) == {n for n, (req, _) in doc.FAULT_TRACEPOINTS.items() if req}
    for name in doc.FAULT_TRACEPOINTS:
        cat, ev = name.split(":", 1)
        assert (f"TRACEPOINT_PROBE({cat}, {ev})" in text
                or (cat == "raw_syscalls" and f"RAW_TRACEPOINT_PROBE({ev})" in text)), name


# ----------------------------------------------------------------------------- the page-fault read path

@pytest.mark.parametrize("present,status,paths", [
    (list(doc.FAULT_TRACEPOINTS), "pass", ["syscalls", "faults"]),
    # arm64 (DGX Spark): no exceptions:page_fault_user -- expected, faults traced without the address
    ([n for n in doc.FAULT_TRACEPOINTS if n != "exceptions:page_fault_user"], "info", ["syscalls", "faults"]),
    ([n for n in doc.FAULT_TRACEPOINTS if n != "filemap:mm_filemap_map_pages"], "warn", ["syscalls", "faults"]),
    # no mm_filemap_fault: a warning, never a failure (syscall readers still traced)
    ([n for n in doc.FAULT_TRACEPOINTS if n != "filemap:mm_filemap_fault"], "warn", ["syscalls"]),
])
def test_fault_tracepoints_rows_and_read_paths(fake, tmp_path, present, status, paths):
    tracefs = _make_tracefs(tmp_path / "tracefs2", list(tp.ALL) + present)
    report = doc.run_checks(**dict(fake, tracefs_candidates=(str(tracefs),)))
    assert report.ok, report.failed
    row = report.get("tracepoints: page faults")
    assert row.status == status, row
    missing = [n for n in doc.FAULT_TRACEPOINTS if n not in present]
    for n in missing:
        assert n in row.detail
    if status == "warn":
        assert row.fix
    assert report.read_paths == paths
    rp = report.get("read paths")
    assert rp.status == ("pass" if "faults" in paths else "warn")
    assert ("memory-mapped" in rp.detail) and (("not traced" in rp.detail) == ("faults" not in paths))
    assert json.loads(report.to_json())["read_paths"] == paths


def test_read_paths_empty_when_syscalls_cannot_run(fake):
    report = doc.run_checks(**dict(fake, tracefs_candidates=("/nonexistent/tracefs",), bpf_probe=_no_probe))
    assert not report.ok and report.read_paths == []
    assert report.get("tracepoints: page faults").status == "warn"
    assert report.get("read paths").status == "fail"


def _uring_tracefs(fake, drop=(), drop_fields=()):
    from engramprof.host import uring

    root = Path(fake["tracefs_candidates"][0])
    names = [*uring.REQUIRED, *(n for ns in uring.FEATURES.values() for n in ns)]
    for n in names:
        if n in drop:
            continue
        cat, ev = n.split(":", 1)
        d = root / "events" / cat / ev
        d.mkdir(parents=True, exist_ok=True)
        fields = [f for f in uring.REQUIRED_FIELDS.get(n, ("req",)) if f not in drop_fields]
        (d / "format").write_text(f"name: {ev}\nformat:\n" + "".join(
            f"\tfield:u64 {f};\toffset:{8 * (i + 1)};\tsize:8;\tsigned:0;\n" for i, f in enumerate(fields)))


_URING_BTF_OK = {"offsets": {}, "opcodes": {"OP_READ": 22, "OP_READV": 1, "OP_READ_FIXED": 4}, "missing": []}


def test_uring_row_names_what_is_missing(fake):
    report = doc.run_checks(**fake, uring_btf=lambda: _URING_BTF_OK)
    row = report.get("io_uring reads")
    assert row.status == "warn" and "io_uring:io_uring_submit_req" in row.detail and row.fix
    assert report.ok  # syscall readers are still traced

    _uring_tracefs(fake, drop=("io_uring:io_uring_queue_async_work",), drop_fields=("sq_thread",))
    row = doc.run_checks(**fake, uring_btf=lambda: _URING_BTF_OK).get("io_uring reads")
    assert row.status == "warn" and "io_uring:io_uring_submit_req field sq_thread" in row.detail

    _uring_tracefs(fake, drop=("io_uring:io_uring_queue_async_work",))
    lacking = dict(_URING_BTF_OK, missing=["io_rw.kiocb.ki_waitq"])
    row = doc.run_checks(**fake, uring_btf=lambda: lacking).get("io_uring reads")
    assert row.status == "warn" and "io_rw.kiocb.ki_waitq" in row.detail

    row = doc.run_checks(**fake, uring_btf=lambda: _URING_BTF_OK).get("io_uring reads")
    assert row.status == "warn" and "io_uring:io_uring_queue_async_work" in row.detail  # optional: named too
    _uring_tracefs(fake)
    row = doc.run_checks(**fake, uring_btf=lambda: _URING_BTF_OK).get("io_uring reads")
    assert row.status == "pass" and "IORING_OP_READ_FIXED" in row.detail, row


def test_uring_row_on_this_kernel():
    """The real kernel (6.18 here): the BTF lookup finds every member the probe reads."""
    from engramprof.host import uring

    st = uring.btf_status()
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        assert st["missing"]
        return
    assert st["missing"] == [], st["missing"]
    assert {"U_OFF_REQ_FILE", "U_OFF_RW_POS", "U_OFF_SB_DEV"} <= set(st["offsets"])


def _libaio_tracefs(fake, drop=(), drop_fields=()):
    from engramprof.host import libaio

    root = Path(fake["tracefs_candidates"][0])
    for n in [*libaio.REQUIRED, *(n for ns in libaio.FEATURES.values() for n in ns)]:
        if n in drop:
            continue
        cat, ev = n.split(":", 1)
        d = root / "events" / cat / ev
        d.mkdir(parents=True, exist_ok=True)
        fields = [f for f in libaio.REQUIRED_FIELDS.get(n, ("ret",)) if f not in drop_fields]
        (d / "format").write_text(f"name: {ev}\nformat:\n" + "".join(
            f"\tfield:u64 {f};\toffset:{8 * (i + 1)};\tsize:8;\tsigned:0;\n" for i, f in enumerate(fields)))


_LIBAIO_BTF_OK = {"offsets": {"OFF_FILE_FLAGS": 64, "OFF_INODE_MODE": 0}, "missing": []}


def test_libaio_row_names_what_is_missing(fake):
    _libaio_tracefs(fake, drop=("syscalls:sys_exit_io_getevents", "syscalls:sys_exit_io_pgetevents"))
    report = doc.run_checks(**fake, libaio_btf=lambda: _LIBAIO_BTF_OK)
    row = report.get("libaio reads")
    assert row.status == "warn" and "syscalls:sys_exit_io_getevents" in row.detail and row.fix
    assert report.ok  # syscall readers are still traced

    _libaio_tracefs(fake, drop=("syscalls:sys_exit_io_pgetevents",), drop_fields=("iocbpp",))
    row = doc.run_checks(**fake, libaio_btf=lambda: _LIBAIO_BTF_OK).get("libaio reads")
    assert row.status == "warn" and "syscalls:sys_enter_io_submit field iocbpp" in row.detail

    _libaio_tracefs(fake, drop=("syscalls:sys_exit_io_pgetevents",))
    row = doc.run_checks(**fake, libaio_btf=lambda: dict(_LIBAIO_BTF_OK, missing=["inode.i_mode"])).get("libaio reads")
    assert row.status == "warn" and "inode.i_mode" in row.detail

    row = doc.run_checks(**fake, libaio_btf=lambda: _LIBAIO_BTF_OK).get("libaio reads")
    assert row.status == "warn" and "sys_exit_io_pgetevents (reads reaped with io_pgetevents" in row.detail
    _libaio_tracefs(fake)
    row = doc.run_checks(**fake, libaio_btf=lambda: _LIBAIO_BTF_OK).get("libaio reads")
    assert row.status == "pass" and "sys_enter_io_submit" in row.detail and "file.f_flags" in row.detail, row


def test_libaio_row_on_this_kernel():
    """The real kernel: the BTF lookup finds the members the probe reads."""
    from engramprof.host import libaio

    st = libaio.btf_status()
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        assert st["missing"]
        return
    assert st["missing"] == [] and {"OFF_FILE_FLAGS", "OFF_INODE_MODE"} <= set(st["offsets"]), st


def test_read_files_row_names_what_the_fd_walk_lacks(tmp_path):
    """The syscall probe's fd walk (probes/targets.h): this kernel has every member; a BTF file
    that cannot be read, or a walk naming a member the kernel lacks, fails naming it."""
    from engramprof.host import btf as kbtf

    if not os.path.exists(kbtf.VMLINUX):
        pytest.skip("this kernel has no BTF: the row's failure is checked below")
    row = doc.check_read_files()
    assert row.status == "pass" and "12 BTF members" in row.detail and "super_block" in row.detail, row
    bad = doc.check_read_files(tmp_path / "no-btf")
    assert bad.status == "fail" and "no-btf" in bad.detail and bad.fix, bad
    walk = kbtf.FD_WALK + [("OFF_X", "file", "f_no_such_member", 8), ("OFF_Y", "inode", "i_mode", 8)]
    assert kbtf.walk_problems(kbtf.load(), walk) == ["file.f_no_such_member", "inode.i_mode is 2 bytes"]
