"""The target filter every probe shares (probes/targets.h): constants and the maps' contents.

A probe's config carries a :class:`~engramprof.record.selection.Selection` (or None: the one
process ``tgid``).  :func:`inline` puts targets.h into the program text, :func:`defines` gives
its constants, and :func:`fill` writes the target tgids and cgroup ids into the loaded
object's maps (right after load, before the recording is armed: until then the maps are empty
and nothing passes the filter), and the device + inode of every ``--file``.  :func:`sync` keeps them up to date (the recorder calls it
about once a second: new sub-groups of a v2 cgroup, the processes of a v1 cgroup).
"""
from __future__ import annotations

import ctypes

from engramprof import tracepoints as tp
from engramprof.bpf import layout

MAX_TARGETS = 16384
MAX_CGROUPS = 4096
MAX_FILES = 65536


def inline(src: str) -> str:
    return src.replace('#include "targets.h"', (layout.probe_dir() / "targets.h").read_text())


def _group_dead() -> bool:
    root = tp.tracefs_root()
    try:
        return root is not None and "group_dead" in (root / "events/sched/sched_process_exit/format").read_text()
    except OSError:
        return False


def defines(selection, tgid: int, tid: int) -> dict[str, int]:
    if selection is None:
        mode, cg, children, files = 1, 0, 0, 0
    else:
        mode, cg, children = selection.match_tgids, int(bool(selection.cgroups_v2)), int(selection.children)
        files = int(bool(selection.files))
    out = {"TARGET_TGID": tgid, "TARGET_TID": tid, "MATCH_TGIDS": mode, "MATCH_CGROUPS": cg,
           "FOLLOW_CHILDREN": children, "HAVE_GROUP_DEAD": int(bool(children) and _group_dead()),
           "MATCH_FILES": files, "MAX_TARGETS": MAX_TARGETS, "MAX_CGROUPS": MAX_CGROUPS, "MAX_FILES": MAX_FILES}
    if files:  # the fd -> inode walk, with the running kernel's struct layout
        from engramprof.bpf import btf

        out.update(btf.fd_walk_offsets())
    return out


class TargetMaps:
    """The loaded object's target maps, kept in step with the selection."""

    def __init__(self, bpf, selection):
        self.selection = selection
        self.tgids = bpf["target_tgids"] if selection is not None and selection.match_tgids == 2 else None
        self.cgroups = bpf["target_cgroups"] if selection is not None and selection.cgroups_v2 else None
        self.files = bpf["target_files"] if selection is not None and selection.files else None
        if self.files is not None:  # fixed for the whole trace (device + inode of each --file)
            for dev, ino in sorted(selection.file_keys()):
                k = self.files.Key()
                k.dev, k.ino = dev, ino
                self.files[k] = ctypes.c_uint8(1)
        self.tgids_put: set[int] = set()
        self.cgroups_put: set[int] = set()
        self.sync(initial=True)

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

    def live_tgids(self) -> list[int]:
        """The tgids in the kernel's map now (the fork / exit hooks add and remove them)."""
        if self.tgids is None:
            return []
        return [k.value for k in self.tgids.keys()]
