"""Whether a process runs a CPython interpreter, from its executable mappings (thread kinds:
analysis/thread_kinds takes every thread of a process that does not as native)."""
from __future__ import annotations

import os
import re

#: the file name of a CPython interpreter's code: the python3.X executable (Debian links libpython
#: into it) or libpython3.X.so (a program embedding the interpreter: uwsgi, a C++ server)
_CPYTHON_FILE = re.compile(r"^(lib)?python([23](\.\d+)?[a-z]*)?(\.so(\.[\d.]+)?)?$")


def runs_cpython(pid: int, proc_root: str = "/proc") -> tuple[bool | None, str]:
    """Whether ``pid`` runs a CPython interpreter, and why: one of its executable file mappings
    is a python3.X executable or a libpython3.X.so (True), none is (False), or /proc/PID/maps
    could not be read (None).  Reads the process's maps only, never its memory.  A program that
    links the interpreter statically under another name is taken as not CPython (its threads
    native); a stack sampler that finds the interpreter overrides this (analysis/thread_kinds)."""
    try:
        with open(f"{proc_root}/{pid}/maps") as f:
            files = {line.split(None, 5)[5].strip() for line in f
                     if line.count(" ") >= 5 and "x" in line.split(None, 2)[1] and "/" in line}
    except (OSError, IndexError) as exc:
        return None, f"/proc/{pid}/maps unreadable ({getattr(exc, 'strerror', None) or exc})"
    files = {f for f in files if f.startswith("/")}
    hits = sorted(f for f in files if _CPYTHON_FILE.match(os.path.basename(f.removesuffix(" (deleted)"))))
    if hits:
        return True, f"maps {hits[0]}"
    return False, f"none of its {len(files)} executable file mappings is python3.X or libpython3.X"
