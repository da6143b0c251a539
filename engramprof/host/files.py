"""Files on this host as the kernel names them: (device, inode), mounts, overlayfs layers.

A file is matched by the probes, and asked about by cachestat(2), through the identity the
kernel gives it: the superblock's device in the kernel's encoding (``MKDEV``: major << 20 |
minor) and the inode.  On overlayfs the inode that owns the page cache is the layer's file,
not the overlay's: :func:`file_identities` names every identity a path has and where each was
learnt, :func:`real_file` the layer file behind an overlay path.
"""
from __future__ import annotations

import os
import re
import stat as stat_mod
from dataclasses import dataclass


def dev_t(major: int, minor: int) -> int:
    """The kernel's internal dev_t (MKDEV: major << 20 | minor), as the tracepoints give it."""
    return (major << 20) | minor


def kernel_dev(st_dev: int) -> int:
    """st_dev (user-space encoding) -> the kernel's dev_t."""
    return dev_t(os.major(st_dev), os.minor(st_dev))


def st_dev_of(kdev):
    """The kernel's dev_t (major << 20 | minor; scalars or numpy arrays) -> st_dev, the user-space
    encoding (glibc's makedev), as the trace's ``dev`` column holds it."""
    major, minor = kdev >> 20, kdev & 0xFFFFF
    return ((major & 0xFFF) << 8) | ((major & ~0xFFF) << 32) | (minor & 0xFF) | ((minor & ~0xFF) << 12)


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


def unescape(s: str) -> str:
    """/proc/self/mountinfo's octal escapes (space, tab, newline, backslash)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


@dataclass(frozen=True)
class Mount:
    dev: int  # the superblock's s_dev, kernel encoding
    root: str  # the path inside the filesystem mounted here ("/" unless a bind mount of a sub-tree)
    point: str
    fstype: str
    options: str  # the super options (overlay: lowerdir=, upperdir=, workdir=, ...)


def open_regular_files(pid: int, proc_root: str = "/proc") -> dict[tuple[int, int], str]:
    """(kernel dev_t, inode) -> path of the regular files ``pid`` has open now, from
    /proc/PID/fd: the identity is the open file's own (a stat through the fd link), never that
    of whatever the path names now.  A process that is gone or unreadable has none."""
    out: dict[tuple[int, int], str] = {}
    d = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for n in names:
        try:
            st = os.stat(f"{d}/{n}")
            link = os.readlink(f"{d}/{n}")
        except OSError:
            continue
        if stat_mod.S_ISREG(st.st_mode) and link.startswith("/"):
            out.setdefault((kernel_dev(st.st_dev), st.st_ino), link.removesuffix(" (deleted)"))
    return out


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
                return Mount((major << 20) | minor, unescape(a[3]), unescape(a[4]), b[0], b[2])
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
            upper = unescape(val).replace("\\,", ",").replace("\\:", ":")
        elif key == "lowerdir":
            top = re.split(r"(?<!\\)::", val)[0]
            lowers += [unescape(x).replace("\\,", ",").replace("\\:", ":") for x in re.split(r"(?<!\\):", top) if x]
        elif key == "lowerdir+":
            lowers.append(unescape(val).replace("\\,", ","))
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


#: a page fault on such a path is the process's own code (an executable or a shared library)
#: or a file the runtime maps for it (the loader's cache, libc's locale archive and gconv
#: modules, the kernel's AIO completion ring "/[aio]" of io_setup), not a table read: tables are
#: data files the reader maps, never these
#: the runtime's files a process maps for a moment (the loader maps its cache for each dlopen
#: and unmaps it at once: gone from /proc/PID/maps before a recorder reads it); named by their
#: identity up front (a stat: no page read)
RUNTIME_FILES = ("/etc/ld.so.cache", "/usr/lib/locale/locale-archive")
CODE_PATH = re.compile(r"(\.so(\.[0-9]+)*$)|(^/(usr/(local/)?)?s?bin/)|(^/(usr/)?lib(64|exec)?/.*\.so)"
                       r"|(^/etc/ld\.so\.cache$)|(^/usr/lib/locale/)|(/gconv/gconv-modules)|(^/\[aio\])")
