"""The running kernel's BTF (/sys/kernel/btf/vmlinux): struct member offsets and enum values.

A fact of this machine, so it lives in the host layer: the probes' loaders (engramprof/bpf)
take struct layouts from it, and the doctor (engramprof/host/doctor.py) says from it which
kernel structures a probe needs are there.

Only what that needs is decoded: the type section is walked once (every kind's record length,
so the walk stays aligned), structs and unions by name, members through anonymous unions and
structs, typedefs / const / volatile resolved, and enums by name.
"""
from __future__ import annotations

import struct
from functools import lru_cache

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F

K_INT, K_PTR, K_ARRAY, K_STRUCT, K_UNION, K_ENUM, K_FWD, K_TYPEDEF, K_VOLATILE, K_CONST, K_RESTRICT = range(1, 12)
K_FUNC, K_FUNC_PROTO, K_VAR, K_DATASEC, K_FLOAT, K_DECL_TAG, K_TYPE_TAG, K_ENUM64 = range(12, 20)
# bytes after the 12-byte btf_type: fixed, and per vlen item
_EXTRA = {K_INT: (4, 0), K_ARRAY: (12, 0), K_STRUCT: (0, 12), K_UNION: (0, 12), K_ENUM: (0, 8),
          K_FUNC_PROTO: (0, 8), K_VAR: (4, 0), K_DATASEC: (0, 12), K_DECL_TAG: (4, 0), K_ENUM64: (0, 12)}
_QUALIFIERS = (K_TYPEDEF, K_VOLATILE, K_CONST, K_RESTRICT, K_TYPE_TAG)


class BTF:
    """The types of one BTF blob (ids from 1)."""

    def __init__(self, data: bytes):
        if len(data) < 24:
            raise ValueError("BTF too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != MAGIC:
            raise ValueError(f"not BTF (magic {magic:#x})")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        self.data = data
        self.strings = hdr_len + str_off
        self.strings_end = self.strings + str_len
        self.types: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)]  # (kind, name_off, vlen, size_or_type, at)
        self.by_name: dict[str, list[int]] = {}
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        unpack = struct.unpack_from
        while pos < end:
            name_off, info, size = unpack("<III", data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            fixed, per = _EXTRA.get(kind, (0, 0))
            self.types.append((kind, name_off, vlen, size, pos + 12))
            if kind in (K_STRUCT, K_UNION) and name_off:
                self.by_name.setdefault(self.name(name_off), []).append(len(self.types) - 1)
            pos += 12 + fixed + per * vlen

    def name(self, off: int) -> str:
        end = self.data.index(b"\0", self.strings + off)
        return self.data[self.strings + off:end].decode()

    def resolve(self, tid: int) -> int:
        """Through typedefs and qualifiers to the type itself."""
        for _ in range(32):
            kind, _n, _v, ref, _at = self.types[tid]
            if kind not in _QUALIFIERS:
                return tid
            tid = ref
        return tid

    def size_of(self, tid: int) -> int:
        tid = self.resolve(tid)
        kind, _n, _v, size, at = self.types[tid]
        if kind == K_PTR:
            return 8
        if kind == K_ARRAY:
            elem, _index, n = struct.unpack_from("<III", self.data, at)
            return self.size_of(elem) * n
        return size

    def struct_id(self, name: str) -> int | None:
        """A struct named so with members (a forward declaration has none)."""
        for tid in self.by_name.get(name, []):
            kind, _n, vlen, _s, _at = self.types[tid]
            if kind == K_STRUCT and vlen:
                return tid
        return None

    def member(self, tid: int, name: str) -> tuple[int, int] | None:
        """(byte offset, type id) of member `name`, looking inside anonymous unions / structs."""
        kind, _n, vlen, _s, at = self.types[tid]
        kflag = struct.unpack_from("<I", self.data, at - 8)[0] >> 31
        for i in range(vlen):
            m_name, m_type, m_off = struct.unpack_from("<III", self.data, at + 12 * i)
            bits = m_off & 0xFFFFFF if kflag else m_off
            if m_name and self.name(m_name) == name:
                return bits // 8, m_type
            if not m_name:
                inner = self.resolve(m_type)
                if self.types[inner][0] in (K_STRUCT, K_UNION):
                    found = self.member(inner, name)
                    if found is not None:
                        return bits // 8 + found[0], found[1]
        return None

    def enum_values(self, name: str) -> dict[str, int]:
        """The constants of ``enum name`` ({} when the kernel has no such enum)."""
        for tid, (kind, name_off, vlen, _s, at) in enumerate(self.types):
            if kind not in (K_ENUM, K_ENUM64) or not name_off or self.name(name_off) != name:
                continue
            out = {}
            for i in range(vlen):
                if kind == K_ENUM:
                    n_off, val = struct.unpack_from("<Ii", self.data, at + 8 * i)
                else:
                    n_off, lo, hi = struct.unpack_from("<III", self.data, at + 12 * i)
                    val = lo | (hi << 32)
                out[self.name(n_off)] = val
            return out
        return {}

    def member_path(self, sname: str, path: str) -> tuple[int, int] | None:
        """(byte offset, size) of ``path`` ("cqe.fd", "kiocb.ki_pos") in ``struct sname``, through
        nested structs; None when the struct or a member is missing."""
        tid = self.struct_id(sname)
        if tid is None:
            return None
        off, mtype = 0, None
        for part in path.split("."):
            if mtype is not None:
                tid = self.resolve(mtype)
                if self.types[tid][0] not in (K_STRUCT, K_UNION):
                    return None
            m = self.member(tid, part)
            if m is None:
                return None
            off, mtype = off + m[0], m[1]
        return off, self.size_of(mtype)


# The syscall probe's fd -> file -> inode walk (probes/targets.h fd_file_walk): (macro, struct,
# member, size in bytes the probe reads).  Every syscall read names its file through it, and
# --file matches through it; engramprof/bpf/btf.py turns it into the probe's OFF_* constants.
FD_WALK = [
    ("OFF_TASK_FILES", "task_struct", "files", 8),
    ("OFF_FILES_FDT", "files_struct", "fdt", 8),
    ("OFF_FDT_MAX_FDS", "fdtable", "max_fds", 4),
    ("OFF_FDT_FD", "fdtable", "fd", 8),
    ("OFF_FILE_INODE", "file", "f_inode", 8),
    ("OFF_FILE_FLAGS", "file", "f_flags", 4),  # O_DIRECT
    ("OFF_FILE_POS", "file", "f_pos", 8),  # where read() / readv() read from
    ("OFF_INODE_MODE", "inode", "i_mode", 2),  # S_ISREG: read() of a pipe, socket or tty is no table read
    ("OFF_INODE_INO", "inode", "i_ino", 8),
    ("OFF_INODE_SB", "inode", "i_sb", 8),
    ("OFF_SB_DEV", "super_block", "s_dev", 4),
    ("OFF_SB_MAGIC", "super_block", "s_magic", 8),  # procfs, sysfs...: no table is read there
]


def walk_problems(btf: BTF, walk=FD_WALK) -> list[str]:
    """What of ``walk`` the kernel's BTF lacks or lays out otherwise than the probe reads it
    ("struct.member" or "struct.member is N bytes"); [] when the walk can be compiled."""
    out = []
    for _macro, sname, mname, size in walk:
        sid = btf.struct_id(sname)
        m = btf.member(sid, mname) if sid is not None else None
        if m is None:
            out.append(f"{sname}.{mname}")
        elif btf.size_of(m[1]) != size:
            out.append(f"{sname}.{mname} is {btf.size_of(m[1])} bytes")
    return out


@lru_cache(maxsize=2)
def load(path: str = VMLINUX) -> BTF:
    """The kernel's BTF, parsed once.  OSError when the file is missing, ValueError when it is
    not BTF."""
    with open(path, "rb") as f:
        return BTF(f.read())
