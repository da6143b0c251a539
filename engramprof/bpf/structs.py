"""numpy views of the record structs the probes share with user space (probes/<p>.h).

Each header is the single definition of its records: this module parses the structs into numpy dtypes, and
:func:`check_against_compiled` compares them with the layout clang compiled (BCC's ctypes view
of the ``*_layout`` maps), so a header edit that Python misreads fails at load time instead of
silently decoding garbage.
"""
from __future__ import annotations

import ctypes
import re
from functools import lru_cache
from importlib import resources

import numpy as np

_CTYPES = {
    "u64": "<u8", "s64": "<i8", "u32": "<u4", "s32": "<i4", "u16": "<u2", "s16": "<i2",
    "u8": "u1", "s8": "i1",
}


def probe_dir():
    return resources.files("engramprof.probes")


#: the headers of what the probes share with user space (probes/<p>.h; engramprof.h includes
#: the syscall, fault, sched and eviction ones)
RECORD_HEADERS = ("engramprof.h", "pagecache.h", "export.h")


def header_text() -> str:
    """Every record header of the probes, in one text (each local #include pasted once)."""
    return inline_headers("".join(f'#include "{h}"\n' for h in RECORD_HEADERS))


_INCLUDE = re.compile(r'^#include "([\w.]+)"[ \t]*$', flags=re.M)


def inline_headers(src: str) -> str:
    """``src`` with each ``#include "x.h"`` of a header in probes/ replaced by its text, and so
    on inside it (a header already pasted: nothing).  BCC compiles one text, and the program
    printed by ``--ebpf`` is complete."""
    done: set[str] = set()

    def paste(m: re.Match) -> str:
        name = m.group(1)
        path = probe_dir() / name
        if not path.is_file():
            return m.group(0)
        if name in done:
            return ""
        done.add(name)
        return _INCLUDE.sub(paste, path.read_text())

    return _INCLUDE.sub(paste, src)


def parse_struct(text: str, name: str, where: str = "engramprof.h") -> np.dtype:
    """``struct name`` of C source ``text`` (fixed-width members only) as a numpy dtype: the one
    parser of the structs user space decodes (``where`` names the file in the error)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    m = re.search(r"struct\s+%s\s*\{(.*?)\};" % re.escape(name), text, flags=re.S)
    if not m:
        raise KeyError(f"struct {name} not in {where}")
    fields = []
    for line in m.group(1).split(";"):
        line = line.strip()
        if not line:
            continue
        ctype, fname = line.split()
        fields.append((fname, _CTYPES[ctype]))
    return np.dtype(fields, align=True)


@lru_cache(maxsize=None)
def struct_dtype(name: str) -> np.dtype:
    return parse_struct(header_text(), name)


@lru_cache(maxsize=None)
def header_define(name: str) -> int:
    m = re.search(r"#define\s+%s\s+(\d+)" % re.escape(name), header_text())
    if not m:
        raise KeyError(name)
    return int(m.group(1))


@lru_cache(maxsize=None)
def header_defines(prefix: str) -> dict[str, int]:
    """Every ``#define PREFIXNAME <int>`` of the header, as {NAME: value} (prefix removed)."""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"#define\s+%s(\w+)\s+(\d+)" % re.escape(prefix), header_text())}


def check_against_compiled(dtype: np.dtype, leaf: type[ctypes.Structure]) -> None:
    """Raise RuntimeError when the compiled struct differs from the dtype parsed from the header."""
    if ctypes.sizeof(leaf) != dtype.itemsize:
        raise RuntimeError(f"record layout mismatch: kernel struct is {ctypes.sizeof(leaf)} bytes, "
                           f"engramprof.h parsed to {dtype.itemsize}")
    for fname, _ftype in leaf._fields_:
        off = getattr(leaf, fname).offset
        if fname not in dtype.fields or dtype.fields[fname][1] != off:
            raise RuntimeError(f"record layout mismatch at field {fname} (compiled offset {off})")
