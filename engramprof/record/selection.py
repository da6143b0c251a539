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
import re
import stat as stat_mod
from dataclasses import dataclass, field

from engramprof.errors import UserError
from engramprof.record.target import pid_state

CGROUP2_MOUNT = "/sys/fs/cgroup/unified"


def kernel_dev(st_dev: int) -> int:
    return (os.major(st_dev) << 20) | os.minor(st_dev)


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


@dataclass(frozen=True)
class FileIdentity:
    """One (device, inode) a ``--file`` is matched by, and where it was learnt: ``stat``, ``open
    file`` (the inode an fd points to: what is_target_fd reads), ``mapping`` (what /proc/PID/maps
    names), ``overlay upper`` / ``overlay lower N`` (the real file of an overlayfs path: the
    inode that owns the page cache, what the filemap tracepoints and a mapping's faults report)."""

    dev: int  # the kernel's encoding: major << 20 | minor
    ino: int
    source: str
    real_path: str = ""  # overlay sources: the layer's file (what cachestat(2) must be asked about)
    copy_up_path: str = ""  # overlay lower: where a copy-up would put the file (the upper layer)


def _unescape(s: str) -> str:
    """/proc/self/mountinfo's octal escapes (space, tab, newline, backslash)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


@dataclass(frozen=True)
class Mount:
    dev: int  # the superblock's s_dev, kernel encoding
    root: str  # the path inside the filesystem mounted here ("/" unless a bind mount of a sub-tree)
    point: str
    fstype: str
    options: str  # the super options (overlay: lowerdir=, upperdir=, workdir=, ...)


def mount_of(mnt_id: int) -> Mount | None:
    """This process's mount ``mnt_id`` (from /proc/self/mountinfo)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.rstrip("\n").partition(" - ")
                a, b = left.split(), right.split()
                if len(a) < 5 or len(b) < 3 or int(a[0]) != mnt_id:
                    continue
                major, minor = (int(x) for x in a[2].split(":"))
                return Mount((major << 20) | minor, _unescape(a[3]), _unescape(a[4]), b[0], b[2])
    except (OSError, ValueError):
        pass
    return None


def _fdinfo(fd: int) -> tuple[int | None, int | None]:
    """(mnt_id, ino) of an open fd: ino is the inode the fd points to (file_inode)."""
    mnt = ino = None
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == "mnt_id":
                    mnt = int(v)
                elif k == "ino":
                    ino = int(v)
    except (OSError, ValueError):
        pass
    return mnt, ino


_LIBC = []


def _libc():
    import ctypes

    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _mapped_identity(fd: int) -> tuple[int, int] | None:
    """(dev, ino) /proc/self/maps shows for a mapping of fd: one page mapped read-only and never
    touched (no fault, nothing read, residency not disturbed).  On ext4 / xfs the same as stat's;
    a btrfs subvolume's stat st_dev is its own anonymous device.  (An overlayfs mapping's line
    names the overlay's inode since the backing-file rework (Linux 6.6+; before it the real
    file's): the real file is found from the layers, see _overlay_real_file.)"""
    import ctypes
    import mmap as _mmap

    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = _mmap.PAGESIZE
    addr = libc.mmap(None, page, _mmap.PROT_READ, _mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return None
    prefix = f"{addr:08x}-"  # the kernel prints a mapping's start as %08lx
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.startswith(prefix):
                    dev, ino = line.split()[3:5]
                    major, minor = (int(x, 16) for x in dev.split(":"))
                    return (major << 20) | minor, int(ino)
    except (OSError, ValueError):
        return None
    finally:
        libc.munmap(addr, page)
    return None


def overlay_layers(options: str) -> tuple[str | None, list[str]]:
    """(upperdir, [lowerdir, ...] top first) from an overlay mount's super options.  Layer paths
    escape ':' (lowerdir separator) and ',' with a backslash; data-only layers (after '::') are
    left out: they hold data of metacopy files only."""
    upper, lowers = None, []
    for opt in re.split(r"(?<!\\),", options):
        key, _, val = opt.partition("=")
        if key == "upperdir":
            upper = _unescape(val).replace("\\,", ",").replace("\\:", ":")
        elif key == "lowerdir":
            top = re.split(r"(?<!\\)::", val)[0]
            lowers += [_unescape(x).replace("\\,", ",").replace("\\:", ":") for x in re.split(r"(?<!\\):", top) if x]
        elif key == "lowerdir+":
            lowers.append(_unescape(val).replace("\\,", ","))
    return upper, lowers


def _regular(p: str) -> os.stat_result | None:
    try:
        s = os.lstat(p)
    except OSError:
        return None
    return s if stat_mod.S_ISREG(s.st_mode) else None


def upper_copy(p: str, source: str = "overlay upper") -> FileIdentity | None:
    """The upper layer's file at ``p`` when it holds the data (no metacopy xattr: a copy-up of
    the metadata only leaves the data in the lower file), else None."""
    s = _regular(p)
    if s is None:
        return None
    try:
        os.getxattr(p, "trusted.overlay.metacopy", follow_symlinks=False)
        return None
    except OSError:
        return FileIdentity(kernel_dev(s.st_dev), s.st_ino, source, p)


def _overlay_real_file(opened: str, st: os.stat_result, mount: Mount) -> FileIdentity | None:
    """The real file behind an overlayfs path (``opened``: its path as /proc/self/fd shows it):
    the upper layer's copy if there is one (a file opened for write once was copied up), else
    the topmost lower layer's, checked by inode number (an overlay file's st_ino is its lower
    file's, in the low bits with xino)."""
    if opened != mount.point and not opened.startswith(mount.point.rstrip("/") + "/"):
        return None
    rel = os.path.join(mount.root, opened[len(mount.point):].lstrip("/")).lstrip("/")
    upper, lowers = overlay_layers(mount.options)

    if upper and (up := upper_copy(os.path.join(upper, rel))) is not None:
        return up
    for n, lower in enumerate(lowers, 1):
        s = _regular(os.path.join(lower, rel))
        if s is None:
            continue
        if s.st_ino == st.st_ino or (s.st_ino & 0xFFFFFFFF) == (st.st_ino & 0xFFFFFFFF):
            return FileIdentity(kernel_dev(s.st_dev), s.st_ino, f"overlay lower {n}", os.path.join(lower, rel),
                                os.path.join(upper, rel) if upper else "")
        return None  # another file (renamed in the overlay: a redirect): not the data of this path
    return None


def file_identities(path: str, st: os.stat_result | None = None, mounts: dict | None = None) -> list[FileIdentity]:
    """Every (dev, ino) that can back an fd of ``path`` or own its pages, without reading a page:
    stat's, the open file's (fdinfo ino on its mount's superblock: what is_target_fd reads; a
    mapping's where fdinfo has no ino), and on overlayfs the real file's (upper or lower layer).  The first source of an
    identity is kept; stat's comes first.  ``mounts``: a cache of mount_of by mount id (many
    files of one directory)."""
    if st is None:
        st = os.stat(path)
    out: dict[tuple[int, int], FileIdentity] = {}

    def add(ident: FileIdentity) -> None:
        out.setdefault((ident.dev, ident.ino), ident)

    add(FileIdentity(kernel_dev(st.st_dev), st.st_ino, "stat"))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        fd = None
    if fd is not None:
        try:
            mnt_id, ino = _fdinfo(fd)
            if mounts is None:
                mounts = {}
            if mnt_id is not None and mnt_id not in mounts:
                mounts[mnt_id] = mount_of(mnt_id)
            mount = mounts.get(mnt_id) if mnt_id is not None else None
            if mount is not None and ino is not None:
                add(FileIdentity(mount.dev, ino, "open file"))
            elif os.fstat(fd).st_size > 0 and (m := _mapped_identity(fd)) is not None:
                # a kernel whose fdinfo has no ino line: the inode a mapping names (i_sb->s_dev,
                # i_ino: the open file's; ~1 ms a file, it reads /proc/self/maps)
                add(FileIdentity(m[0], m[1], "mapping"))
            if mount is not None and mount.fstype == "overlay":
                try:
                    opened = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    opened = None
                real = _overlay_real_file(opened, st, mount) if opened else None
                if real is not None:
                    add(real)
        finally:
            os.close(fd)
    return list(out.values())


def real_file(path: str) -> str | None:
    """The layer file behind an overlayfs path (the one that owns its page cache), None when
    ``path`` is not on overlayfs or its layer is not found.  cachestat(2) of an overlay fd
    counts the overlay inode's own mapping, which holds no page: ask it about this file."""
    try:
        ids = file_identities(path)
    except OSError:
        return None
    return next((i.real_path for i in ids if i.real_path), None)


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
        from engramprof.bpf.targets import MAX_FILES

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
