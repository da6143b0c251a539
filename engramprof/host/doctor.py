"""Can this machine trace?  One check per row, each with a status and a one-line fix.

Statuses:

- ``pass``  the thing is there and works;
- ``info``  worth knowing, never a problem (kprobes: engramprof does not use them);
- ``warn``  ``engramprof syscalls`` still runs, but some evidence or fallback is affected;
- ``fail``  ``engramprof syscalls`` cannot run here.  Only the checks it depends on
  (privileges, tracefs, the required tracepoints, BCC import, kernel headers, loading a
  tracepoint program) ever fail, so ``Report.ok`` -- the doctor's exit status -- is simply
  "no row failed".

Every check is a plain function of injectable inputs (paths, callables), so tests can fake
a missing tracepoint, an unmounted tracefs, a BCC import failure, an unprivileged user and so
on without root.  :func:`run_checks` runs them all; :func:`can_trace` runs only the cheap
ones that decide whether tracing can start (no BPF compile) for other commands to call.

Nothing here reads user data: cachestat(2) and RWF_NOWAIT are tried on temporary files the
doctor creates itself (``tempfile.mkstemp``) and removes.  The BPF self-test runs in a child
process so that a compiler or loader crash, or its diagnostics on stderr, cannot take the
doctor down or spoil its output.
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from engramprof.host import btf as kbtf
from engramprof.host import tracepoints as tp
from engramprof.host import libaio as libaio_needs
from engramprof.host import uring as uring_needs
from engramprof.host.cachestat import SYS_CACHESTAT, cachestat

PASS, INFO, WARN, FAIL = "pass", "info", "warn", "fail"
STATUSES = (PASS, INFO, WARN, FAIL)

# Capability bit numbers (linux/capability.h).
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

MIN_KERNEL = (5, 11)  # ring buffer (5.8), task storage + bpf_get_current_task_btf (5.11)
SELFTEST_TRACEPOINT = "syscalls:sys_enter_preadv2"
SELFTEST_TIMEOUT_S = 180

FIX_SETUP = "run `make setup` (as root)"
FIX_PRIVS = "run as root (sudo), or with CAP_BPF and CAP_PERFMON in the effective set"
FIX_TRACEFS_READ = "run as root (sudo): tracefs is readable by root only unless remounted with gid=/mode="


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when ``engramprof syscalls`` can run here: no row failed."""
        return not any(c.status == FAIL for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def get(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def read_paths(self) -> list[str]:
        """The read paths this machine can trace: [], ['syscalls'] or ['syscalls', 'faults']."""
        return read_paths(self.checks)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "read_paths": self.read_paths, "checks": [c.to_dict() for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# --------------------------------------------------------------------------- small helpers

def _read_text(path: str | os.PathLike) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cap_eff(proc_status: str | os.PathLike) -> int | None:
    text = _read_text(proc_status)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                return None
    return None


def _has(caps: int, bit: int) -> bool:
    return bool(caps >> bit & 1)


@dataclass
class Mount:
    mountpoint: str
    fstype: str
    options: list[str]  # per-superblock options (where cgroup v1 lists its controllers)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse /proc/self/mountinfo text (see proc(5))."""
    mounts = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, right = line.split(" - ", 1)
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 2:
            continue
        mp = lf[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        opts = rf[2].split(",") if len(rf) > 2 else []
        mounts.append(Mount(mp, rf[0], opts))
    return mounts


def _mounts(mountinfo: str | os.PathLike) -> list[Mount]:
    return parse_mountinfo(_read_text(mountinfo) or "")


def _fs_of(path: str, mounts: list[Mount]) -> Mount | None:
    real = os.path.realpath(path)
    best = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        if real == mp or real.startswith(mp + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                best = m
    return best


def kernel_config(name: str, release: str | None = None,
                  paths: Iterable[str] | None = None) -> str | None:
    """Value of CONFIG_<name> ('y', 'm', ...), 'n' when '# ... is not set', None when unknown."""
    release = release or platform.release()
    paths = paths if paths is not None else ("/proc/config.gz", f"/boot/config-{release}")
    for p in paths:
        try:
            opener = gzip.open if str(p).endswith(".gz") else open
            with opener(p, "rt", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(f"{name}="):
                return line.split("=", 1)[1].strip()
            if line.strip() == f"# {name} is not set":
                return "n"
        return "n"
    return None


@contextlib.contextmanager
def _own_tempfile(directory: str | os.PathLike, size: int = 8192):
    """A temporary file of the doctor's own in ``directory``, filled with ``size`` bytes."""
    fd, name = tempfile.mkstemp(prefix=".engramprof-doctor-", dir=directory)
    try:
        os.write(fd, (b"engramprof-doctor\n" * (size // 18 + 1))[:size])
        yield fd
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


def _cachestat_counts(fd: int) -> dict:
    """cachestat(2) of the whole file as a dict; raises OSError (ENOSYS when the kernel lacks it)."""
    return asdict(cachestat(fd))


def _preadv_nowait(fd: int, size: int) -> int:
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        raise OSError(errno.EOPNOTSUPP, "this Python has no os.RWF_NOWAIT")
    return os.preadv(fd, [bytearray(size)], 0, flag)


def _import_bcc():
    return importlib.import_module("bcc")


# --------------------------------------------------------------------------- the checks

def check_privileges(euid: int | None = None, proc_status: str | os.PathLike = "/proc/self/status") -> Check:
    name = "privileges"
    euid = os.geteuid() if euid is None else euid
    caps = _cap_eff(proc_status)
    if caps is None:
        if euid == 0:
            return Check(name, PASS, "root (euid 0); CapEff not readable, assuming full capabilities")
        return Check(name, FAIL, f"not root (euid {euid}) and CapEff unreadable: engramprof syscalls "
                                 "needs root or CAP_BPF+CAP_PERFMON", FIX_PRIVS)
    admin = _has(caps, CAP_SYS_ADMIN)
    bpf_perf = _has(caps, CAP_BPF) and _has(caps, CAP_PERFMON)
    have = ", ".join(n for n, b in (("CAP_SYS_ADMIN", CAP_SYS_ADMIN), ("CAP_BPF", CAP_BPF),
                                    ("CAP_PERFMON", CAP_PERFMON)) if _has(caps, b)) or "none of them"
    if euid == 0 and (admin or bpf_perf):
        return Check(name, PASS, f"root (euid 0), CapEff {caps:#018x} ({have})")
    if admin or bpf_perf:
        return Check(name, PASS, f"euid {euid} with {have} in CapEff (tracefs must be readable too)")
    who = "root but a restricted CapEff" if euid == 0 else f"not root (euid {euid})"
    return Check(name, FAIL, f"{who}: CapEff {caps:#x} lacks CAP_BPF+CAP_PERFMON; engramprof syscalls "
                             "needs root or CAP_BPF+CAP_PERFMON",
                 FIX_PRIVS if euid != 0 else "run in a container/session that keeps CAP_BPF and CAP_PERFMON "
                                             "(e.g. docker run --cap-add BPF --cap-add PERFMON)")


def check_kernel(release: str | None = None, machine: str | None = None) -> Check:
    release = release or platform.release()
    machine = machine or platform.machine()
    try:
        nums = tuple(int(x) for x in release.split("-", 1)[0].split(".")[:2])
    except ValueError:
        return Check("kernel", WARN, f"{release} ({machine}): cannot parse the version",
                     "use Linux >= 5.11 (ring buffer, task storage)")
    if nums >= MIN_KERNEL:
        return Check("kernel", PASS, f"Linux {release} ({machine})")
    return Check("kernel", WARN, f"Linux {release} ({machine}) is older than "
                                 f"{MIN_KERNEL[0]}.{MIN_KERNEL[1]}: BPF ring buffer / task storage may be missing",
                 "use Linux >= 5.11 (see the bpf rows below for what actually works)")


def check_btf(btf_path: str | os.PathLike = "/sys/kernel/btf/vmlinux") -> Check:
    if os.path.exists(btf_path):
        return Check("BTF", PASS, f"{btf_path} present")
    return Check("BTF", WARN, f"{btf_path} missing: BTF-typed helpers (task storage) are unavailable",
                 "use a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def _tracefs_mounted_unreadable(candidates, mounts: list[Mount]) -> str | None:
    cands = {os.path.normpath(str(c)) for c in candidates}
    for m in mounts:
        if m.fstype == "tracefs" and os.path.normpath(m.mountpoint) in cands:
            return m.mountpoint
    return None


def check_tracefs(candidates=None,
                  mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> tuple[Check, Path | None]:
    candidates = tp.candidates() if candidates is None else candidates
    root = tp.tracefs_root(candidates)
    looked = ", ".join(str(c) for c in candidates)
    if root is None:
        mp = _tracefs_mounted_unreadable(candidates, _mounts(mountinfo))
        if mp:
            return Check("tracefs", FAIL, f"mounted at {mp} but not readable by euid {os.geteuid()}",
                         FIX_TRACEFS_READ), None
        return Check("tracefs", FAIL, f"not mounted (looked in {looked})",
                     "mount -t tracefs nodev /sys/kernel/tracing  (as root; `make setup` does it)"), None
    events = root / "events"
    if not os.access(events, os.R_OK | os.X_OK):
        return Check("tracefs", FAIL, f"mounted at {root} but {events} is not readable by euid {os.geteuid()}",
                     FIX_TRACEFS_READ), None
    return Check("tracefs", PASS, f"mounted at {root}"), root


def _default_tracepoints() -> dict[str, bool]:
    return {name: name in tp.REQUIRED for name in tp.ALL}


def check_tracepoints(root: Path | None, tracepoints: Mapping[str, bool] | None = None) -> list[Check]:
    """One row per required tracepoint; one row each for the optional syscall variants and the
    evidence tracepoints, listing the missing ones.  ``tracepoints`` maps name -> required."""
    tracepoints = _default_tracepoints() if tracepoints is None else tracepoints
    rows = []
    present = {n: (root is not None and tp.available(n, root)) for n in tracepoints}
    for n, req in tracepoints.items():
        if not req:
            continue
        purpose = tp.ALL.get(n, "required")
        if present[n]:
            rows.append(Check(f"tracepoint {n}", PASS, f"present ({purpose})"))
        elif root is None:
            rows.append(Check(f"tracepoint {n}", FAIL, f"cannot look for {n}: tracefs unusable ({purpose})",
                              "fix the tracefs row first"))
        else:
            cat = n.split(":", 1)[0]
            fix = ("use a kernel built with CONFIG_FTRACE_SYSCALLS=y" if cat == "syscalls"
                   else f"use a kernel that has the {cat} tracepoints")
            rows.append(Check(f"tracepoint {n}", FAIL, f"{n} is missing from {root}/events ({purpose})", fix))
    groups = [
        ("tracepoints: other read calls", [n for n, r in tracepoints.items() if not r and n.startswith("syscalls:")],
         "these calls will not be traced", "use a kernel built with CONFIG_FTRACE_SYSCALLS=y"),
        ("tracepoints: evidence", [n for n, r in tracepoints.items() if not r and not n.startswith("syscalls:")],
         "traces will lack the matching evidence columns",
         "use a kernel with these tracepoints (filemap, block, vmscan, sched)"),
    ]
    for gname, names, effect, fix in groups:
        if not names:
            continue
        missing = [n for n in names if not present[n]]
        if not missing:
            rows.append(Check(gname, PASS, f"all {len(names)} present"))
        elif root is None:
            rows.append(Check(gname, WARN, f"cannot look: tracefs unusable ({len(names)} optional tracepoints)",
                              "fix the tracefs row first"))
        else:
            lst = "; ".join(f"{n} ({tp.ALL.get(n, '?')})" for n in missing)
            rows.append(Check(gname, WARN, f"missing {len(missing)} of {len(names)}: {lst}; {effect}", fix))
    return rows


#: the page-fault probe's tracepoints (probes/faults.bpf.c): name -> (needed for the fault path, purpose)
FAULT_TRACEPOINTS = {
    "filemap:mm_filemap_fault": (True, "a file-backed page fault: device, inode, page index"),
    "raw_syscalls:sys_enter": (True, "a faulting thread's next syscall closes its open fault"),
    "filemap:mm_filemap_map_pages": (False, "fault-around: the pages mapped with a fault (mapped_pages)"),
    "exceptions:page_fault_user": (False, "a fault's entry time and address (x86 only; without it the "
                                          "address is 0 and a fault starts at its first filemap event)"),
    # the kernel's major-fault rule (docs/model.md "Page faults: one fault, major or minor")
    "readahead:page_cache_sync_ra": (False, "a fault's page was missing: major faults counted as the kernel does"),
    "readahead:page_cache_async_ra": (False, "a minor fault that started async readahead, told from a missing page"),
    "readahead:page_cache_ra_order": (False, "a fault's read-around: its page was missing"),
    "readahead:page_cache_ra_unbounded": (False, "a fault's read-around (fallback): its page was missing"),
    "mmap_lock:mmap_lock_acquire_returned": (False, "a fault retried under the mmap lock: major, as the kernel counts it"),
    "mmap_lock:mmap_lock_released": (False, "which pass of a fault held the mmap lock"),
    "exceptions:page_fault_kernel": (False, "faults a syscall takes on the target's mappings (x86 only)"),
}
READ_PATH_SYSCALLS, READ_PATH_FAULTS, READ_PATH_URING, READ_PATH_LIBAIO = "syscalls", "faults", "io_uring", "libaio"
#: the request read paths and the row that says each is fully traced here (status pass)
REQUEST_PATH_ROWS = {READ_PATH_URING: "io_uring reads", READ_PATH_LIBAIO: "libaio reads"}


def check_faults(root: Path | None, tracepoints: Mapping[str, tuple[bool, str]] | None = None) -> list[Check]:
    """Rows for the page-fault read path (memory-mapped readers) and the read paths this machine can
    trace.  A missing fault tracepoint is a warning: syscall readers are still traced."""
    tracepoints = FAULT_TRACEPOINTS if tracepoints is None else tracepoints
    name = "tracepoints: page faults"
    if root is None:
        return [Check(name, WARN, "cannot look: tracefs unusable; memory-mapped readers cannot be traced",
                      "fix the tracefs row first")]
    present = {n: tp.available(n, root) for n in tracepoints}
    need = [n for n, (req, _) in tracepoints.items() if req and not present[n]]
    opt = [n for n, (req, _) in tracepoints.items() if not req and not present[n]]
    if need:
        lst = "; ".join(f"{n} ({tracepoints[n][1]})" for n in need)
        return [Check(name, WARN, f"missing {lst}: page faults of memory-mapped readers (numpy.memmap, "
                                  "torch.from_file, safetensors) cannot be traced; syscall readers still are",
                      "use a kernel with the filemap and raw_syscalls tracepoints (Linux >= 5.x generic)")]
    have = ", ".join(n for n in tracepoints if present[n])
    if not opt:
        return [Check(name, PASS, f"all {len(tracepoints)} present ({have}): faults with their address")]
    lst = "; ".join(f"{n} ({tracepoints[n][1]})" for n in opt)
    # the exceptions: tracepoints are x86-only: their absence (arm64) is expected, not a problem
    status = INFO if set(opt) <= {"exceptions:page_fault_user", "exceptions:page_fault_kernel"} else WARN
    return [Check(name, status, f"faults traced without {lst}",
                  "" if status == INFO else "use a kernel with these tracepoints")]


def check_uring(root: Path | None, btf: Callable[[], dict] | None = None) -> list[Check]:
    """One row for io_uring reads (probes/uring.bpf.c): the io_uring tracepoints and their fields,
    the request's struct members in the kernel's BTF (engramprof/host/uring.py lists them), each
    missing one named.  ``btf()`` replaces the BTF lookup (returns the dict of
    :func:`engramprof.host.uring.btf_status`).  Never a failure: syscall readers are still traced."""
    name = "io_uring reads"
    if root is None:
        return [Check(name, WARN, "cannot look: tracefs unusable; io_uring readers cannot be traced",
                      "fix the tracefs row first")]
    need = uring_needs.missing_tracepoints(root)
    st = (btf or uring_needs.btf_status)()
    lacking_btf = list(st.get("missing", []))
    opt = [(n, uring_needs.FEATURE_EFFECT[f]) for f, names in uring_needs.FEATURES.items()
           for n in names if not tp.available(n, root)]
    if need or lacking_btf:
        parts = []
        if need:
            parts.append("tracepoints " + ", ".join(need))
        if lacking_btf:
            parts.append("BTF " + ", ".join(lacking_btf))
        return [Check(name, WARN, f"missing {'; '.join(parts)}: io_uring read requests cannot be traced",
                      "use a kernel with the io_uring tracepoints and BTF (CONFIG_DEBUG_INFO_BTF=y), Linux >= 6.x")]
    tps = [*uring_needs.REQUIRED, *(n for names in uring_needs.FEATURES.values() for n in names)]
    have = ", ".join(n.split(":", 1)[1] for n in tps if tp.available(n, root))
    fields = ", ".join(f"{s}.{m}" for _mac, s, m, _sz in uring_needs.BTF_FIELDS)
    ops = ", ".join(uring_needs.OPCODES[m] for m in st.get("opcodes", {}))
    detail = f"tracepoints {have}; BTF {fields}; opcodes {ops}"
    if opt:
        lst = "; ".join(f"{n} ({effect})" for n, effect in opt)
        return [Check(name, WARN, f"{detail}; missing {lst}", "use a kernel with these io_uring tracepoints")]
    return [Check(name, PASS, detail)]


def check_libaio(root: Path | None, btf: Callable[[], dict] | None = None) -> list[Check]:
    """One row for Linux AIO reads (probes/libaio.bpf.c): the AIO syscalls' tracepoints and their
    fields, and the file / inode members of the kernel's BTF it reads besides the fd walk
    (engramprof/host/libaio.py lists them), each missing one named.  ``btf()`` replaces the BTF
    lookup (returns :func:`engramprof.host.libaio.btf_status`'s dict).  Never a failure."""
    name = "libaio reads"
    if root is None:
        return [Check(name, WARN, "cannot look: tracefs unusable; libaio readers cannot be traced",
                      "fix the tracefs row first")]
    need = libaio_needs.missing_tracepoints(root)
    lacking_btf = list((btf or libaio_needs.btf_status)().get("missing", []))
    if need or lacking_btf:
        parts = (["tracepoints " + ", ".join(need)] if need else []) + (["BTF " + ", ".join(lacking_btf)]
                                                                         if lacking_btf else [])
        return [Check(name, WARN, f"missing {'; '.join(parts)}: libaio read iocbs cannot be traced",
                      "use a kernel with the syscalls tracepoints (CONFIG_FTRACE_SYSCALLS=y) and BTF")]
    opt = [(n, libaio_needs.FEATURE_EFFECT[f]) for f, names in libaio_needs.FEATURES.items()
           for n in names if not tp.available(n, root)]
    tps = [*libaio_needs.REQUIRED, *(n for names in libaio_needs.FEATURES.values() for n in names)]
    have = ", ".join(n.split(":", 1)[1] for n in tps if tp.available(n, root))
    fields = ", ".join(f"{s}.{m}" for _mac, s, m, _sz in libaio_needs.BTF_FIELDS)
    detail = (f"tracepoints {have}; BTF {fields}; completions seen when reaped (io_getevents, or the ring "
              "read in user space), no aio completion tracepoint")
    if opt:
        lst = "; ".join(f"{n} ({effect})" for n, effect in opt)
        return [Check(name, WARN, f"{detail}; missing {lst}", "use a kernel with these syscalls tracepoints")]
    return [Check(name, PASS, detail)]


def check_read_files(btf_path: str | os.PathLike = kbtf.VMLINUX) -> Check:
    """The syscall probe's fd -> file -> inode walk (probes/targets.h): every struct member it
    reads is in the kernel's BTF with the size it reads.  Without it the probe cannot name the
    file of a read (dev, ino), its O_DIRECT flag or read()'s position: a failure."""
    name = "read files"
    structs = ", ".join(dict.fromkeys(s for _mac, s, _m, _sz in kbtf.FD_WALK))
    try:
        problems = kbtf.walk_problems(kbtf.load(str(btf_path)))
    except (OSError, ValueError) as exc:
        return Check(name, FAIL, f"cannot read the kernel's BTF ({btf_path}: {exc}): the file of a read cannot be "
                                 "taken in the kernel", "use a kernel built with CONFIG_DEBUG_INFO_BTF=y")
    if problems:
        return Check(name, FAIL, f"the kernel's BTF lacks {', '.join(problems)}: the file of a read cannot be taken "
                                 "in the kernel", "report this kernel version: the fd walk needs these members")
    return Check(name, PASS, f"each read's file taken in the kernel (dev, ino, O_DIRECT, read()'s f_pos): "
                             f"{len(kbtf.FD_WALK)} BTF members of {structs}")


def read_paths(checks: Iterable[Check]) -> list[str]:
    """The read paths this machine can trace, from the rows: 'syscalls' when syscalls can run,
    'faults' when the fault tracepoints are there too, 'io_uring' / 'libaio' when their rows pass."""
    rows = list(checks)
    if any(c.status == FAIL for c in rows):
        return []
    out = [READ_PATH_SYSCALLS]
    if any(c.name == "tracepoints: page faults" and c.detail.startswith(("all ", "faults traced")) for c in rows):
        out.append(READ_PATH_FAULTS)
    passed = {c.name for c in rows if c.status == PASS}
    out += [path for path, row in REQUEST_PATH_ROWS.items() if row in passed]
    return out


def check_read_paths(checks: Iterable[Check]) -> Check:
    paths = read_paths(checks)
    if not paths:
        return Check("read paths", FAIL, "none: `engramprof syscalls` cannot run here (see the failed rows)",
                     "fix the failed rows above")
    requests = "".join(f", {p} read requests" for p in paths if p in REQUEST_PATH_ROWS)
    if READ_PATH_FAULTS in paths:
        return Check("read paths", PASS, "syscalls (preadv2/preadv/pread64/read/readv readers), page faults "
                                         f"(memory-mapped readers){requests}")
    return Check("read paths", WARN, f"syscalls (preadv2/preadv/pread64/read/readv readers){requests}; page faults "
                                     "of memory-mapped readers are not traced here",
                 "see the `tracepoints: page faults` row")


def check_kprobes(root: Path | None, release: str | None = None,
                  config_paths: Iterable[str] | None = None) -> Check:
    parts = []
    has_events = root is not None and (root / "kprobe_events").exists()
    if root is not None:
        parts.append(f"kprobe_events {'present' if has_events else 'absent'} in {root}")
    cfg = kernel_config("CONFIG_KPROBES", release, config_paths)
    if cfg is not None:
        parts.append("CONFIG_KPROBES=" + cfg if cfg != "n" else "CONFIG_KPROBES is not set")
    avail = has_events or cfg in ("y", "m")
    what = "available" if avail else "not available"
    return Check("kprobes", INFO, f"{what} ({'; '.join(parts) or 'unknown'}); engramprof uses tracepoints only "
                                  "and does not need them")


def check_bcc(bcc_import: Callable[[], object] | None = None) -> tuple[Check, object | None]:
    bcc_import = bcc_import or _import_bcc
    try:
        mod = bcc_import()
    except Exception as exc:  # ImportError, or anything a broken install raises
        return Check("bcc", FAIL, f"cannot import bcc: {type(exc).__name__}: {exc}",
                     "install python3-bpfcc and use a venv made with --system-site-packages: "
                     "`make setup` (PyPI's 'bcc' is unrelated)"), None
    ver = getattr(mod, "__version__", "?")
    where = os.path.dirname(getattr(mod, "__file__", "") or "") or "?"
    return Check("bcc", PASS, f"bcc {ver} imports ({where})"), mod


def check_headers(release: str | None = None, modules_root: str | os.PathLike = "/lib/modules",
                  kheaders: str | os.PathLike = "/sys/kernel/kheaders.tar.xz") -> Check:
    release = release or platform.release()
    build = Path(modules_root) / release / "build"
    if (build / "include").is_dir():
        target = os.path.realpath(build)
        via = f" -> {target}" if target != str(build) else ""
        return Check("kernel headers", PASS, f"{build}{via}")
    if os.path.exists(kheaders):
        return Check("kernel headers", WARN, f"{build} missing; BCC will fall back to {kheaders}",
                     FIX_SETUP + " to link Debian's headers")
    return Check("kernel headers", FAIL, f"{build} missing: BCC cannot compile probes",
                 FIX_SETUP + ": installs linux-headers and links /lib/modules/$(uname -r)/build")


# -- BPF self-test (runs in a child process: see _selftest_main) --

_SELFTEST_PROG = r"""
#include <linux/fs.h>
BPF_ARRAY(ep_count, u64, 1);
#ifdef EP_RINGBUF
BPF_RINGBUF_OUTPUT(ep_rb, 1);
#endif
#ifdef EP_TASK
BPF_TASK_STORAGE(ep_ts, u64);
#endif
TRACEPOINT_PROBE(syscalls, sys_enter_preadv2) {
    if ((bpf_get_current_pid_tgid() >> 32) != EP_TGID)
        return 0;
    int k = 0;
    u64 *c = ep_count.lookup(&k);
    if (c)
        __sync_fetch_and_add(c, 1);
#ifdef EP_TASK
    u64 *v = ep_ts.task_storage_get(bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (v)
        *v = args->fd;
#endif
#ifdef EP_RINGBUF
    u64 x = args->fd;
    ep_rb.ringbuf_output(&x, sizeof(x), 0);
#endif
    return 0;
}
"""


def _summarize_error(exc: BaseException, log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    key = [ln for ln in lines if "error:" in ln or "fatal" in ln.lower()]
    if not key:
        key = [ln for ln in lines if "Unable to" in ln or "invalid" in ln.lower() or "expected" in ln]
    msg = str(exc).strip()
    if key:
        msg = f"{msg} ({key[0][:200]})"
    return msg.replace("\n", " ")


def _try_program(BPF, defines: list[str]) -> dict:
    """Compile, load and attach one variant; fire a preadv2 of our own; count what came back."""
    log_fd, log_name = tempfile.mkstemp(prefix="engramprof-doctor-bcc-")
    saved = os.dup(2)
    b = None
    res: dict = {"ok": False, "error": "", "events": 0, "ringbuf_records": None}
    try:
        os.dup2(log_fd, 2)
        try:
            b = BPF(text=_SELFTEST_PROG.encode(), cflags=[f"-DEP_TGID={os.getpid()}"] + [f"-D{d}" for d in defines])
        finally:
            os.dup2(saved, 2)
        got: list[int] = []
        if "EP_RINGBUF" in defines:
            b["ep_rb"].open_ring_buffer(lambda ctx, data, size: got.append(size))
        with _own_tempfile(tempfile.gettempdir(), 4096) as fd:
            os.preadv(fd, [bytearray(64)], 0)  # CPython issues preadv2 for this
        res["events"] = int(b["ep_count"][0].value)
        if "EP_RINGBUF" in defines:
            b.ring_buffer_poll(timeout=200)
            res["ringbuf_records"] = len(got)
        res["ok"] = True
    except Exception as exc:
        os.dup2(saved, 2)
        with open(log_name, errors="replace") as f:
            res["error"] = _summarize_error(exc, f.read())
    finally:
        os.close(saved)
        os.close(log_fd)
        with contextlib.suppress(OSError):
            os.unlink(log_name)
        if b is not None:
            with contextlib.suppress(Exception):
                b.cleanup()
    return res


def bpf_selftest() -> dict:
    """Load the minimal tracepoint program (with ring buffer + task storage when they work).

    Returns {"load": res, "ringbuf": res|None, "task_storage": res|None}, each res a dict with
    ok/error/events; None means "not tested".  Call it in a child process (see
    :func:`run_bpf_selftest`)."""
    from bcc import BPF

    full = _try_program(BPF, ["EP_RINGBUF", "EP_TASK"])
    if full["ok"]:
        return {"load": full, "ringbuf": full, "task_storage": full}
    minimal = _try_program(BPF, [])
    if not minimal["ok"]:
        return {"load": minimal, "ringbuf": None, "task_storage": None}
    return {"load": minimal, "ringbuf": _try_program(BPF, ["EP_RINGBUF"]),
            "task_storage": _try_program(BPF, ["EP_TASK"])}


def _selftest_main() -> None:  # entry point of the child process
    try:
        out = bpf_selftest()
    except Exception as exc:
        out = {"load": {"ok": False, "error": f"{type(exc).__name__}: {exc}", "events": 0},
               "ringbuf": None, "task_storage": None}
    sys.stdout.write(json.dumps(out) + "\n")


def run_bpf_selftest(timeout: float = SELFTEST_TIMEOUT_S) -> dict:
    """Run :func:`bpf_selftest` in a child process of this Python."""
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        p = subprocess.run([sys.executable, "-c", "from engramprof.host.doctor import _selftest_main; _selftest_main()"],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"load": {"ok": False, "error": f"self-test timed out after {timeout:.0f}s", "events": 0},
                "ringbuf": None, "task_storage": None}
    for line in reversed(p.stdout.splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return {"load": {"ok": False, "error": f"self-test process exited {p.returncode}: {tail}", "events": 0},
            "ringbuf": None, "task_storage": None}


def _load_fix(error: str) -> str:
    e = error.lower()
    if "header" in e or "file not found" in e or "unable to find" in e:
        return FIX_SETUP + " (kernel headers for BCC)"
    if "permission" in e or "operation not permitted" in e:
        return FIX_PRIVS
    return (FIX_SETUP + "; if it still fails, compile a TRACEPOINT_PROBE with BCC by hand to see "
            "the full clang/verifier log")


def check_bpf_programs(blocked_by: str | None, bpf_probe: Callable[[], dict] | None = None) -> list[Check]:
    """Rows: the tracepoint program loads, ring buffer map, task storage map."""
    n_load = "bpf: tracepoint program loads"
    n_rb, n_ts = "bpf: ring buffer map", "bpf: task storage map"
    if blocked_by:
        return [Check(n_load, FAIL, f"not attempted: {blocked_by}", "fix the failed rows above"),
                Check(n_rb, WARN, "not tested (no program could be loaded)", "fix the failed rows above"),
                Check(n_ts, WARN, "not tested (no program could be loaded)", "fix the failed rows above")]
    res = (bpf_probe or run_bpf_selftest)()
    load = res.get("load") or {"ok": False, "error": "no result"}
    rows = []
    if load.get("ok"):
        ev = load.get("events", 0)
        if ev:
            rows.append(Check(n_load, PASS, f"compiled, loaded and attached on {SELFTEST_TRACEPOINT} "
                                            f"(<linux/fs.h>); saw {ev} event(s) from a test preadv2"))
        else:
            rows.append(Check(n_load, WARN, f"loaded and attached on {SELFTEST_TRACEPOINT} but a test preadv2 "
                                            "was not seen", "check that this Python's os.preadv issues preadv2"))
    else:
        rows.append(Check(n_load, FAIL, f"BCC could not compile/load it: {load.get('error') or 'unknown error'}",
                          _load_fix(load.get("error") or "")))

    rb = res.get("ringbuf")
    if rb is None:
        rows.append(Check(n_rb, WARN, "not tested (the minimal program did not load)", "fix the row above"))
    elif rb.get("ok"):
        recs = rb.get("ringbuf_records")
        extra = f"; {recs} record(s) read back" if recs is not None else ""
        rows.append(Check(n_rb, PASS, f"BPF_RINGBUF_OUTPUT loads{extra}"))
    else:
        rows.append(Check(n_rb, WARN, f"BPF_RINGBUF_OUTPUT does not load: {rb.get('error')}",
                          "use Linux >= 5.8; records must otherwise go through a perf buffer"))

    ts = res.get("task_storage")
    if ts is None:
        rows.append(Check(n_ts, WARN, "not tested (the minimal program did not load)", "fix the row above"))
    elif ts.get("ok"):
        rows.append(Check(n_ts, PASS, "BPF_TASK_STORAGE with bpf_get_current_task_btf() loads"))
    else:
        rows.append(Check(n_ts, WARN, f"BPF_TASK_STORAGE does not load: {ts.get('error')}",
                          "use Linux >= 5.11 with BTF; per-thread state must otherwise live in a hash map by tid"))
    return rows


def check_psi(pressure_dir: str | os.PathLike = "/proc/pressure") -> Check:
    ok, bad, mem = [], [], ""
    for res in ("cpu", "memory", "io"):
        text = _read_text(Path(pressure_dir) / res)
        if text is None:
            bad.append(res)
        else:
            ok.append(res)
            if res == "memory":
                mem = " | ".join(ln.split(" total=")[0] for ln in text.strip().splitlines()[:2])
    if not bad:
        return Check("PSI", PASS, f"{pressure_dir}/{{cpu,memory,io}} readable; memory: {mem}")
    return Check("PSI", WARN, f"{', '.join(bad)} not readable under {pressure_dir}: no pressure evidence",
                 "boot with psi=1 (kernels with CONFIG_PSI_DEFAULT_DISABLED) or use CONFIG_PSI=y")


def check_cachestat(directory: str | os.PathLike,
                    syscall: Callable[[int], dict] | None = None) -> Check:
    syscall = syscall or _cachestat_counts
    fallback = "residency falls back to mincore(2) (mmap, never reads the pages)"
    dirs = [str(directory)]
    if os.path.realpath(tempfile.gettempdir()) != os.path.realpath(directory):
        dirs.append(tempfile.gettempdir())
    last = ""
    for d in dirs:
        try:
            with _own_tempfile(d) as fd:
                try:
                    st = syscall(fd)
                except OSError as exc:
                    if exc.errno == errno.ENOSYS:
                        return Check("cachestat(2)", WARN, f"syscall {SYS_CACHESTAT} is ENOSYS (needs Linux >= 6.5); "
                                                           f"{fallback}", "nothing to do, or use Linux >= 6.5")
                    return Check("cachestat(2)", WARN, f"failed on a test file in {d}: {exc}; {fallback}",
                                 "nothing to do; residency uses mincore(2)")
                return Check("cachestat(2)", PASS, f"syscall {SYS_CACHESTAT} works "
                                                   f"(test file: {st.get('nr_cache', '?')} pages cached)")
        except OSError as exc:  # could not create the temp file here
            last = f"{d}: {exc.strerror or exc}"
    return Check("cachestat(2)", WARN, f"could not create a test file ({last})",
                 "pass --path DIR for a writable directory")


def parse_cgroups(mounts: list[Mount], read=_read_text) -> dict:
    """{'version': 'v1'|'v2'|'hybrid'|'none', 'v1': {controller: mountpoint},
    'v2': mountpoint|None, 'v2_controllers': [..]}"""
    non_controllers = {"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "xattr",
                       "nsdelegate", "memory_recursiveprot", "clone_children", "noprefix",
                       "memory_localevents", "favordynmods", "cpuset_v2_mode"}
    v1: dict[str, str] = {}
    v2 = None
    for m in mounts:
        if m.fstype == "cgroup":
            for o in m.options:
                if o in non_controllers or "=" in o:
                    continue
                v1.setdefault(o, m.mountpoint)
        elif m.fstype == "cgroup2" and v2 is None:
            v2 = m.mountpoint
    v2_ctl = (read(os.path.join(v2, "cgroup.controllers")) or "").split() if v2 else []
    if v1 and v2:
        version = "hybrid"
    elif v2:
        version = "v2"
    elif v1 or any(m.fstype == "cgroup" for m in mounts):
        version = "v1"
    else:
        version = "none"
    return {"version": version, "v1": v1, "v2": v2, "v2_controllers": v2_ctl}


def check_cgroups(mountinfo: str | os.PathLike = "/proc/self/mountinfo", read=_read_text) -> list[Check]:
    cg = parse_cgroups(_mounts(mountinfo), read)
    rows = []
    if cg["version"] == "none":
        rows.append(Check("cgroup version", WARN, "no cgroup filesystem mounted",
                          "mount cgroup2 at /sys/fs/cgroup (or the v1 controllers)"))
    else:
        bits = []
        if cg["v1"]:
            bits.append("v1: " + ", ".join(sorted(cg["v1"])))
        if cg["v2"]:
            bits.append(f"v2 at {cg['v2']}: " + (", ".join(cg["v2_controllers"]) or "no controllers"))
        rows.append(Check("cgroup version", PASS, f"{cg['version']} ({'; '.join(bits)})"))
    for label, v1name, v2name, use in (("memory", "memory", "memory", "memcg reclaim and memory pressure"),
                                       ("io", "blkio", "io", "io pressure and throttle evidence")):
        if v2name in cg["v2_controllers"]:
            rows.append(Check(f"cgroup {label} controller", PASS, f"v2 '{v2name}' at {cg['v2']}"))
        elif v1name in cg["v1"]:
            rows.append(Check(f"cgroup {label} controller", PASS, f"v1 '{v1name}' at {cg['v1'][v1name]}"))
        else:
            rows.append(Check(f"cgroup {label} controller", WARN,
                              f"neither v2 '{v2name}' nor v1 '{v1name}' is mounted: no per-cgroup {use}",
                              f"enable it (cgroup v2: echo +{v2name} > cgroup.subtree_control; "
                              f"v1: mount -t cgroup -o {v1name} cgroup /sys/fs/cgroup/{v1name})"))
    return rows


def check_rwf_nowait(directory: str | os.PathLike, preadv: Callable[[int, int], int] | None = None,
                     mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> Check:
    preadv = preadv or _preadv_nowait
    m = _fs_of(str(directory), _mounts(mountinfo))
    where = f"{m.fstype} at {m.mountpoint}" if m else str(directory)
    name = "RWF_NOWAIT"
    try:
        with _own_tempfile(directory) as fd:
            try:
                n = preadv(fd, 4096)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    return Check(name, PASS, f"accepted on {where} (the test read returned EAGAIN: not cached)")
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                    return Check(name, WARN, f"not supported on {where} ({exc.strerror}): "
                                             "NOWAIT-first readers cannot be used or compared there",
                                 "keep tables on a filesystem that supports it (ext4, xfs, btrfs) to replay "
                                 "NOWAIT-first readers")
                return Check(name, WARN, f"test read on {where} failed: {exc}",
                             "check --path points at the tables' filesystem")
            return Check(name, PASS, f"supported on {where} (cached test read returned {n} bytes)")
    except OSError as exc:
        return Check(name, WARN, f"could not create a test file in {directory}: {exc.strerror or exc}",
                     "pass --path DIR for a writable directory on the tables' filesystem")


# --------------------------------------------------------------------------- orchestration

def _first_fail(rows: Iterable[Check]) -> Check | None:
    return next((r for r in rows if r.status == FAIL), None)


def _gate_rows(*, euid=None, proc_status="/proc/self/status", tracefs_candidates=None,
               tracepoints=None, bcc_import=None, release=None, modules_root="/lib/modules",
               mountinfo="/proc/self/mountinfo", kheaders="/sys/kernel/kheaders.tar.xz"):
    """The checks `engramprof syscalls` depends on (cheap: no compile)."""
    priv = check_privileges(euid, proc_status)
    tfs, root = check_tracefs(tracefs_candidates, mountinfo)
    tps = check_tracepoints(root, tracepoints)
    bcc, _ = check_bcc(bcc_import)
    hdr = check_headers(release, modules_root, kheaders)
    return priv, (tfs, root), tps, bcc, hdr


def run_checks(path: str | os.PathLike = ".", *,
               euid: int | None = None,
               proc_status: str | os.PathLike = "/proc/self/status",
               release: str | None = None,
               btf_path: str | os.PathLike = "/sys/kernel/btf/vmlinux",
               tracefs_candidates=None,
               tracepoints: Mapping[str, bool] | None = None,
               fault_tracepoints: Mapping[str, tuple[bool, str]] | None = None,
               kernel_config_paths: Iterable[str] | None = None,
               bcc_import: Callable[[], object] | None = None,
               modules_root: str | os.PathLike = "/lib/modules",
               kheaders: str | os.PathLike = "/sys/kernel/kheaders.tar.xz",
               bpf_probe: Callable[[], dict] | None = None,
               pressure_dir: str | os.PathLike = "/proc/pressure",
               cachestat_call: Callable[[int], dict] | None = None,
               mountinfo: str | os.PathLike = "/proc/self/mountinfo",
               preadv: Callable[[int, int], int] | None = None,
               uring_btf: Callable[[], dict] | None = None,
               libaio_btf: Callable[[], dict] | None = None) -> Report:
    """Run every check; each keyword replaces one input so tests can inject faults.

    ``tracepoints`` maps tracepoint name -> required (default: engramprof.host.tracepoints.ALL,
    required = REQUIRED); ``fault_tracepoints`` maps name -> (required, purpose) for the page-fault
    path (default FAULT_TRACEPOINTS).  ``bpf_probe`` replaces the BPF self-test child process and returns
    the dict :func:`bpf_selftest` returns.  ``cachestat_call(fd)`` and ``preadv(fd, size)``
    replace the syscalls tried on the doctor's temporary files; ``uring_btf()`` the io_uring row's
    BTF lookup, ``libaio_btf()`` the libaio row's."""
    priv, (tfs, root), tps, bcc, hdr = _gate_rows(
        euid=euid, proc_status=proc_status, tracefs_candidates=tracefs_candidates, tracepoints=tracepoints,
        bcc_import=bcc_import, release=release, modules_root=modules_root, mountinfo=mountinfo,
        kheaders=kheaders)
    rows = [priv, check_kernel(release), check_btf(btf_path), check_read_files(btf_path), tfs, *tps,
            *check_faults(root, fault_tracepoints),
            *check_uring(root, uring_btf), *check_libaio(root, libaio_btf),
            check_kprobes(root, release, kernel_config_paths), bcc, hdr]

    blocked = None
    if priv.status == FAIL:
        blocked = "insufficient privileges"
    elif root is None:
        blocked = "tracefs unusable"
    elif not tp.available(SELFTEST_TRACEPOINT, root):
        blocked = f"{SELFTEST_TRACEPOINT} missing"
    elif bcc.status == FAIL:
        blocked = "bcc does not import"
    rows += check_bpf_programs(blocked, bpf_probe)

    rows += [check_psi(pressure_dir), check_cachestat(path, cachestat_call), *check_cgroups(mountinfo),
             check_rwf_nowait(path, preadv, mountinfo)]
    rows.append(check_read_paths(rows))
    return Report(rows)


def can_trace(**inject) -> tuple[bool, str]:
    """Cheap answer to "can `engramprof syscalls` start here?" (privileges, tracefs, required
    tracepoints, bcc import, kernel headers; no compile).  Returns (True, "") or (False, a
    one-line reason with its fix).  Keywords as for :func:`run_checks`."""
    priv, (tfs, _), tps, bcc, hdr = _gate_rows(**inject)
    bad = _first_fail([priv, tfs, *tps, bcc, hdr])
    if bad is None:
        return True, ""
    return False, f"{bad.detail}; fix: {bad.fix}"
