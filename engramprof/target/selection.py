"""What to trace (``--pid`` repeated, ``--children``, ``--cgroup``, ``--file``): checked at
start, resolved to what the probes filter on, kept up to date while recording.

Kinds combine as an intersection, values of one kind as a union: ``--pid A --pid B`` is either
process, ``--cgroup C --file F`` is the reads of F by the processes of C.  (A v1 cgroup is
resolved to its processes, which join the ``--pid`` set.)

* ``--pid``: the tgids, in the kernel: a compare for one pid, else the ``target_tgids`` hash.
* ``--children``: those pids and every descendant: the ones alive at start (from /proc) go into
  the hash; the kernel adds every process a target forks (sched_process_fork) and removes it
  when its thread group dies (sched_process_exit).
* ``--cgroup`` (cgroup2): up to 8 directories are compiled into the probes as (level, id)
  constants and tested with bpf_get_current_ancestor_cgroup_id(level), so sub-groups made
  during the trace match from their first event, at about the cost of one pid's compare
  (benchmarks/RESULTS.md, "Target selectors").  With more directories, or a tracer inside a
  cgroup namespace, the ids of the directories and of their sub-groups (each directory's inode
  number) go in the ``target_cgroups`` hash, matched with bpf_get_current_cgroup_id(), and the
  tree is walked again every second for new sub-groups.  A cgroup v1 directory
  (the hybrid layout's controllers) cannot be matched in the kernel: its processes
  (cgroup.procs, sub-groups included) are read at start and again every second.
* ``--file``: device + inode of each file (a directory: every regular file under it), in the
  kernel's encoding (MKDEV: major << 20 | minor), filtered in the probes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from engramprof.errors import UserError
from engramprof.host.files import FileIdentity, file_identities, kernel_dev, upper_copy
from engramprof.target.process import pid_state

CGROUP2_MOUNT = "/sys/fs/cgroup/unified"
MAX_FILES = 65536  # (dev, ino) keys a selection may hold: the probes' target_files map is this size




def _alive(pid: int) -> bool:
    st = pid_state(pid)
    return st is not None and st not in ("Z", "X")


def _ppids() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            out[int(name)] = int(data[data.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(roots) -> set[int]:
    """Every live process below the roots (from /proc, at this moment)."""
    kids: dict[int, list[int]] = {}
    for p, pp in _ppids().items():
        kids.setdefault(pp, []).append(p)
    out, todo = set(), list(roots)
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _cgroup_kind(path: str) -> str:
    """'v2' or 'v1'; UserError (exit 2) when path is not a cgroup directory."""
    if not os.path.exists(path):
        raise UserError(f"--cgroup {path}: no such cgroup directory", code=2)
    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "cgroup.procs")):
        raise UserError(f"--cgroup {path}: not a cgroup (no cgroup.procs in it)", code=2)
    return "v2" if os.path.exists(os.path.join(path, "cgroup.controllers")) else "v1"


def _cgroup_dirs(path: str):
    for d, _subdirs, _files in os.walk(path):
        yield d


def _files_of(path: str) -> list[tuple[int, int, str]]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"--file {path}: {exc.strerror or exc}", code=2) from None
    if os.path.isdir(path):
        out = []
        for d, _subdirs, files in os.walk(path):
            for name in sorted(files):
                p = os.path.join(d, name)
                try:
                    s = os.stat(p)
                except OSError:
                    continue
                if os.path.isfile(p):
                    out.append((kernel_dev(s.st_dev), s.st_ino, p))
        return out
    if not os.path.isfile(path):
        raise UserError(f"--file {path}: not a regular file or a directory", code=2)
    return [(kernel_dev(st.st_dev), st.st_ino, path)]


@dataclass
class Selection:
    pids: list[int] = field(default_factory=list)
    tid: int = 0
    children: bool = False
    cgroups_v2: list[str] = field(default_factory=list)
    cgroups_v1: list[str] = field(default_factory=list)
    files: list[tuple[int, int, str]] = field(default_factory=list)  # (kernel dev, inode, path)
    file_args: list[str] = field(default_factory=list)
    _v1_members: set[int] = field(default_factory=set)
    _identities: dict | None = None

    @classmethod
    def parse(cls, pids=(), tid: int = 0, children: bool = False, cgroups=(), files=()) -> "Selection":
        pids = list(dict.fromkeys(int(p) for p in pids or ()))
        if not (pids or cgroups or files):
            raise UserError("say what to trace: --pid PID (repeatable; --children for its descendants), "
                            "--cgroup PATH or --file PATH", code=2)
        if children and not pids:
            raise UserError("--children needs --pid (the root of the process tree)", code=2)
        if tid and len(pids) != 1:
            raise UserError("--tid needs exactly one --pid (the process the thread belongs to)", code=2)
        s = cls(pids=pids, tid=tid, children=children, file_args=list(files or ()))
        for c in cgroups or ():
            c = os.path.abspath(c)
            (s.cgroups_v2 if _cgroup_kind(c) == "v2" else s.cgroups_v1).append(c)
        seen = set()
        for f in files or ():
            for key in _files_of(f):
                if key[:2] not in seen:
                    seen.add(key[:2])
                    s.files.append(key)
        if files and not s.files:
            raise UserError(f"--file {', '.join(files)}: no regular file in it", code=2)

        if len(s.files) > MAX_FILES:
            raise UserError(f"--file names {len(s.files):,} files; at most {MAX_FILES:,} can be traced", code=2)
        return s

    def identities(self) -> dict[str, list[FileIdentity]]:
        """path -> the identities its reads are matched by (file_identities), learnt once."""
        if self._identities is None:
            self._identities, mounts = {}, {}
            for _dev, _ino, path in self.files:
                try:
                    self._identities[path] = file_identities(path, mounts=mounts)
                except OSError:  # gone since it was checked: stat's, as resolved then
                    self._identities[path] = [FileIdentity(_dev, _ino, "stat")]
        return self._identities

    def copied_up_keys(self) -> set[tuple[int, int]]:
        """Identities new since the last call: an overlay file read from a lower layer at start
        that has been copied up since (opened for write: its pages now belong to the upper
        copy, a new inode).  One lstat per such file; for TargetMaps.sync, about once a second."""
        new = set()
        for path, ids in self.identities().items():
            for i in list(ids):
                if i.copy_up_path and (up := upper_copy(i.copy_up_path, "overlay upper (copied up while tracing)")):
                    if (up.dev, up.ino) not in {(x.dev, x.ino) for x in ids}:
                        ids.append(up)
                        new.add((up.dev, up.ino))
        return new

    def file_keys(self) -> set[tuple[int, int]]:
        """(dev, ino) the probes match (probes/targets.h): every identity of every file."""
        return {(i.dev, i.ino) for ids in self.identities().values() for i in ids}

    @classmethod
    def of(cls, target) -> "Selection":
        return target if isinstance(target, Selection) else cls(pids=[int(target)])

    # ---- what the probes filter on -------------------------------------------------------
    @property
    def match_tgids(self) -> int:
        """0: any process; 1: the one pid (a compare in the kernel); 2: the tgid hash."""
        if len(self.pids) == 1 and not self.children and not self.cgroups_v1:
            return 1
        return 2 if (self.pids or self.cgroups_v1) else 0

    @property
    def selects_processes(self) -> bool:
        """Some selector names processes (--pid, --cgroup); --file alone selects only files."""
        return bool(self.pids or self.cgroups_v2 or self.cgroups_v1)

    @property
    def first_pid(self) -> int:
        return self.pids[0] if self.pids else 0

    @property
    def ends_with_targets(self) -> bool:
        """The trace ends when every target has exited (--pid, --children); a cgroup or a file
        selects whoever comes, so it runs until the duration or a signal."""
        return bool(self.pids) and not self.cgroups_v1

    def v1_members(self) -> set[int]:
        out = set()
        for c in self.cgroups_v1:
            for d in _cgroup_dirs(c):
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        out.update(int(x) for x in f.read().split())
                except (OSError, ValueError):
                    continue
        return out

    def tgids_now(self, initial: bool = False) -> set[int]:
        """The tgids to put in a probe's map now; `initial`: its first fill, when --children's
        descendants alive at start are walked (each probe's own map needs them; later forks:
        the kernel's fork hook)."""
        want = {p for p in self.pids if _alive(p)}
        if self.children and initial:
            want |= descendants(want)
        if self.cgroups_v1:
            self._v1_members = self.v1_members()
            want |= self._v1_members
        return want

    def v2_members(self) -> set[int]:
        """The processes in the v2 cgroups (and their sub-groups) now."""
        out = set()
        for c in self.cgroups_v2:
            for d in _cgroup_dirs(c):
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        out.update(int(x) for x in f.read().split())
                except (OSError, ValueError):
                    continue
        return out

    def file_readers(self) -> set[int]:
        """The processes that have a selected file open or mapped now (/proc/PID/fd, maps)."""
        keys = self.file_keys()
        out = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            if _holds(int(name), keys):
                out.add(int(name))
        return out

    def processes_now(self) -> set[int]:
        """The processes selected now, found in user space (/proc, cgroup.procs): for what has no
        kernel filter (`engramprof sample`).  Kinds intersect, as in the probes."""
        sets = []
        if self.pids:
            alive = {p for p in self.pids if _alive(p)}
            sets.append(alive | descendants(alive) if self.children else alive)
        if self.cgroups_v2 or self.cgroups_v1:
            sets.append(self.v1_members() | self.v2_members())
        if self.files:
            sets.append(self.file_readers())
        return set.intersection(*sets) if sets else set()

    def tgids_left(self, put: set[int], want: set[int]) -> set[int]:
        """Tgids put in the map that are to go: a v1 cgroup's members that left it."""
        if not self.cgroups_v1:
            return set()
        return {t for t in put - want if t not in self.pids and t not in self._v1_members}

    def cgroup_ids_now(self) -> set[int]:
        out = set()
        for c in self.cgroups_v2:
            for d in _cgroup_dirs(c):
                try:
                    out.add(os.stat(d).st_ino)
                except OSError:
                    continue
        return out

    # ---- what the user is told -----------------------------------------------------------
    def describe(self) -> str:
        parts = []
        if self.pids:
            parts.append(("pid " if len(self.pids) == 1 else "pids ") + ", ".join(map(str, self.pids))
                         + (f" tid {self.tid}" if self.tid else "") + (" and their descendants" if self.children else ""))
        for c in self.cgroups_v2 + self.cgroups_v1:
            parts.append(f"cgroup {c}")
        if self.files:
            n = len(self.files)
            parts.append(f"reads of {self.files[0][2]}" if n == 1 else f"reads of {n} files")
        return "; ".join(parts)

    def waiting(self) -> list[str]:
        """What matches nothing yet (not an error: the trace waits for it)."""
        out = []
        for c in self.cgroups_v2:
            if not any(_cgroup_has_procs(d) for d in _cgroup_dirs(c)):
                out.append(f"cgroup {c} has no processes yet: waiting for them")
        for c in self.cgroups_v1:
            if not self.v1_members():
                out.append(f"cgroup {c} has no processes yet: waiting for them")
        if self.files and not self.file_readers():
            what = self.files[0][2] if len(self.files) == 1 else f"any of the {len(self.files)} files"
            out.append(f"no process has {what} open or mapped yet: waiting for its readers")
        return out

    def meta(self) -> dict:
        return {"pids": self.pids, "children": self.children, "cgroups": self.cgroups_v2 + self.cgroups_v1,
                "files": [{"dev": d, "ino": i, "path": p,
                           "identities": [{"dev": x.dev, "ino": x.ino, "source": x.source}
                                          | ({"real_path": x.real_path} if x.real_path else {})
                                          for x in self.identities()[p]]}
                          for d, i, p in self.files] or None}

    def matched_note(self) -> str | None:
        """What a --file is matched by besides its stat identity (overlayfs: the real file), for
        the summary's notes; None when every file is matched by stat's alone."""
        extra = sorted({x.source for ids in self.identities().values() for x in ids if x.source != "stat"
                        and (x.dev, x.ino) not in self._stat_keys()})
        if not extra:
            return None
        real = sum(any(x.source.startswith("overlay ") for x in ids) for ids in self.identities().values())
        tail = f"; {real} on overlayfs, matched by its real file too" if real else ""
        return f"--file matched by device + inode: stat's and {', '.join(extra)}{tail} (meta.json files[].identities)"

    def _stat_keys(self) -> set[tuple[int, int]]:
        return {(d, i) for d, i, _p in self.files}


def _holds(pid: int, keys: set[tuple[int, int]]) -> bool:
    """pid has one of the files (dev, ino) open or mapped."""
    base = f"/proc/{pid}"
    try:
        for fd in os.listdir(f"{base}/fd"):
            try:
                st = os.stat(f"{base}/fd/{fd}")
            except OSError:
                continue
            if (kernel_dev(st.st_dev), st.st_ino) in keys:
                return True
    except OSError:
        return False
    try:
        with open(f"{base}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or parts[4] == "0":
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                if ((major << 20) | minor, int(parts[4])) in keys:
                    return True
    except (OSError, ValueError):
        pass
    return False


def _cgroup_has_procs(d: str) -> bool:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return bool(f.read().strip())
    except OSError:
        return False
