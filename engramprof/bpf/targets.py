"""The target filter every probe shares (probes/targets.h): constants and the maps' contents.

A probe's config carries a :class:`~engramprof.target.selection.Selection` (or None: the one
process ``tgid``).  :func:`inline` puts targets.h into the program text, :func:`defines` gives
its constants, and :func:`fill` writes the target tgids and cgroup ids into the loaded
object's maps (right after load, before the recording is armed: until then the maps are empty
and nothing passes the filter), and the device + inode of every ``--file``.  :func:`sync` keeps them up to date (the recorder calls it
about once a second: new sub-groups of a v2 cgroup, the processes of a v1 cgroup).
"""
from __future__ import annotations

import ctypes
import os

from engramprof.bpf import btf
from engramprof.bpf import structs as layout
from engramprof.host import tracepoints as tp
from engramprof.host.files import unescape as _unescape
from engramprof.target.selection import MAX_FILES

MAX_TARGETS = 16384
MAX_CGROUPS = 4096
#: --cgroup v2 directories matched by (level, id) constants, bpf_get_current_ancestor_cgroup_id
#: (MATCH_CGROUPS 2); more of them, or a tracer in a cgroup namespace: the `target_cgroups` hash
CGROUP_SLOTS = 8
#: the initial cgroup namespace's fixed inode number (include/linux/proc_ns.h, PROC_CGROUP_INIT_INO)
CGROUP_NS_INIT_INO = 0xEFFFFFFB


def _in_init_cgroup_ns() -> bool:
    try:
        return os.stat("/proc/self/ns/cgroup").st_ino == CGROUP_NS_INIT_INO
    except OSError:
        return False


def _mount_root(point: str) -> str | None:
    """The root (inside its filesystem) of the mount at ``point``, from /proc/self/mountinfo
    (the last such mount: the one on top)."""
    root = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                a = line.split(" - ")[0].split()
                if len(a) >= 5 and _unescape(a[4]) == point:
                    root = _unescape(a[3])
    except OSError:
        return None
    return root


def cgroup_level(path: str) -> int | None:
    """The kernel's level of a cgroup2 directory (the root cgroup: 0): its depth below the cgroup2
    mount point plus the depth of the mount's root in the hierarchy (a bind mount of a sub-tree).
    None when it cannot be known from here (a cgroup namespace shows paths from its own root)."""
    if not _in_init_cgroup_ns():
        return None
    path = os.path.realpath(path)
    try:
        dev = os.stat(path).st_dev
        depth = 0
        while True:
            up = os.path.dirname(path)
            if up == path or os.stat(up).st_dev != dev or not os.path.exists(os.path.join(up, "cgroup.controllers")):
                break
            path, depth = up, depth + 1
    except OSError:
        return None
    root = _mount_root(path)
    if root is None:
        return None
    return depth + len([c for c in root.split("/") if c])


def cgroup_slots(selection) -> list[tuple[int, int]] | None:
    """(level, id) of every --cgroup v2 directory, for MATCH_CGROUPS 2; None: use the hash."""
    if selection is None or not selection.cgroups_v2 or len(selection.cgroups_v2) > CGROUP_SLOTS:
        return None
    out = []
    for c in selection.cgroups_v2:
        level = cgroup_level(c)
        try:
            ino = os.stat(c).st_ino
        except OSError:
            return None
        if level is None:
            return None
        out.append((level, ino))
    return out


def inline(src: str) -> str:
    return src.replace('#include "targets.h"', (layout.probe_dir() / "targets.h").read_text())


def _group_dead() -> bool:
    root = tp.tracefs_root()
    try:
        return root is not None and "group_dead" in (root / "events/sched/sched_process_exit/format").read_text()
    except OSError:
        return False


def defines(selection, tgid: int, tid: int, fd_walk: bool = False) -> dict[str, int]:
    """probes/targets.h's constants.  ``fd_walk``: the probe reads an fd's file itself
    (targets.h fd_file_walk(), FD_WALK 1), so the walk's offsets are filled without --file too
    (a probe that always walks may define FD_WALK in its own source instead: syscalls.bpf.c)."""
    slots = cgroup_slots(selection)
    if selection is None:
        mode, cg, children, files = 1, 0, 0, 0
    else:
        mode, children = selection.match_tgids, int(selection.children)
        cg = 0 if not selection.cgroups_v2 else 2 if slots is not None else 1
        files = int(bool(selection.files))
    out = {"TARGET_TGID": tgid, "TARGET_TID": tid, "TRACER_TGID": os.getpid(), "MATCH_TGIDS": mode,
           "MATCH_CGROUPS": cg, "FOLLOW_CHILDREN": children, "HAVE_GROUP_DEAD": int(bool(children) and _group_dead()),
           "MATCH_FILES": files, "MAX_TARGETS": MAX_TARGETS, "MAX_CGROUPS": MAX_CGROUPS, "MAX_FILES": MAX_FILES,
           "CGROUP_SLOTS_USED": len(slots or ()), **({"FD_WALK": 1} if fd_walk else {})}
    for i in range(CGROUP_SLOTS):
        level, ino = (slots or [])[i] if i < len(slots or ()) else (0, 0)
        out[f"CG_LEVEL_{i}"], out[f"CG_ID_{i}"] = level, ino
    if files or fd_walk:  # the fd -> inode walk, with the running kernel's struct layout
        out.update(btf.fd_walk_offsets())
    return out


def watches_copy_up(selection) -> bool:
    """Some --file is an overlayfs file whose data is in a lower layer: a copy-up (the file opened
    for write) moves its pages to a new inode in the upper layer, to be added while tracing."""
    if selection is None or not selection.files:
        return False
    return any(i.copy_up_path for ids in selection.identities().values() for i in ids)


def needs_sync(selection) -> bool:
    """TargetMaps.sync has work to do about once a second: a cgroup's sub-groups (the hash) or a v1
    cgroup's processes, or an overlay file's copy-up."""
    if selection is None:
        return False
    return bool(selection.cgroups_v1 or (selection.cgroups_v2 and cgroup_slots(selection) is None)
                or watches_copy_up(selection))


class TargetMaps:
    """The loaded object's target maps, kept in step with the selection."""

    def __init__(self, bpf, selection):
        self.selection = selection
        self.tgids = bpf["target_tgids"] if selection is not None and selection.match_tgids == 2 else None
        # the hash only when the ids are not constants (cgroup_slots): then sub-groups are synced
        self.cgroups = (bpf["target_cgroups"] if selection is not None and selection.cgroups_v2
                        and cgroup_slots(selection) is None else None)
        self.files = bpf["target_files"] if selection is not None and selection.files else None
        self.files_put: set[tuple[int, int]] = set()
        #: an overlayfs --file read from a lower layer: a copy-up gives it a new identity (sync)
        self.copy_up = self.files is not None and watches_copy_up(selection)
        self.file_memo = bpf["file_memo"] if self.copy_up else None
        if self.files is not None:  # device + inode of each --file (and of its copy-up, in sync)
            self._put_files(selection.file_keys())
        self.tgids_put: set[int] = set()
        self.cgroups_put: set[int] = set()
        self.sync(initial=True)

    def _put_files(self, keys) -> None:
        for dev, ino in sorted(set(keys) - self.files_put):
            k = self.files.Key()
            k.dev, k.ino = dev, ino
            self.files[k] = ctypes.c_uint8(1)
            self.files_put.add((dev, ino))

    def sync(self, initial: bool = False) -> None:
        s = self.selection
        if s is None:
            return
        one = ctypes.c_uint8(1)
        if self.tgids is not None:
            want = s.tgids_now(initial)
            for t in want - self.tgids_put:
                self.tgids[ctypes.c_uint32(t)] = one
            for t in s.tgids_left(self.tgids_put, want):
                try:
                    del self.tgids[ctypes.c_uint32(t)]
                except KeyError:
                    pass
            self.tgids_put = (self.tgids_put | want) - s.tgids_left(self.tgids_put, want)
        if self.cgroups is not None:
            for c in s.cgroup_ids_now() - self.cgroups_put:
                self.cgroups[ctypes.c_uint64(c)] = one
                self.cgroups_put.add(c)
        if self.copy_up and not initial:
            s.copied_up_keys()  # new identities join s.file_keys() (whichever probe asks first)
            new = s.file_keys() - self.files_put
            if new:
                self._put_files(new)
                # is_target_fd's per-CPU verdicts: one for the new inode could say "not in"
                self.file_memo.clear()

    def live_tgids(self) -> list[int]:
        """The tgids in the kernel's map now (the fork / exit hooks add and remove them)."""
        if self.tgids is None:
            return []
        return [k.value for k in self.tgids.keys()]
