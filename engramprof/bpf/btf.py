"""Struct member offsets of the running kernel, read from its BTF (/sys/kernel/btf/vmlinux).

BCC compiles against whatever kernel headers are installed, which need not be the running
kernel's (here: 6.1 headers on a 6.18 kernel), so a probe that walks kernel structs must not
take their layout from the headers.  :func:`fd_walk_offsets` gives the byte offsets of the
members on the path ``current->files->fdt->fd[fd]->f_inode->{i_ino, i_sb->s_dev}`` as the
running kernel laid them out; probes/targets.h reads each hop with bpf_probe_read_kernel.

Only what that needs is decoded: the type section is walked once (every kind's record length,
so the walk stays aligned), structs and unions by name, members through anonymous unions and
structs, typedefs / const / volatile resolved.
"""
from __future__ import annotations

import struct
from functools import lru_cache

from engramprof.errors import UserError

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


# (macro, struct, member, size in bytes the probe reads)
FD_WALK = [
    ("OFF_TASK_FILES", "task_struct", "files", 8),
    ("OFF_FILES_FDT", "files_struct", "fdt", 8),
    ("OFF_FDT_MAX_FDS", "fdtable", "max_fds", 4),
    ("OFF_FDT_FD", "fdtable", "fd", 8),
    ("OFF_FILE_INODE", "file", "f_inode", 8),
    ("OFF_INODE_INO", "inode", "i_ino", 8),
    ("OFF_INODE_SB", "inode", "i_sb", 8),
    ("OFF_SB_DEV", "super_block", "s_dev", 4),
]


def offsets(btf: BTF, walk=FD_WALK) -> dict[str, int]:
    out = {}
    for macro, sname, mname, size in walk:
        sid = btf.struct_id(sname)
        if sid is None:
            raise ValueError(f"struct {sname} not in the kernel's BTF")
        m = btf.member(sid, mname)
        if m is None:
            raise ValueError(f"struct {sname} has no member {mname} in the kernel's BTF")
        got = btf.size_of(m[1])
        if got != size:
            raise ValueError(f"{sname}.{mname} is {got} bytes in the kernel's BTF, the probe reads {size}")
        out[macro] = m[0]
    return out


@lru_cache(maxsize=1)
def fd_walk_offsets(path: str = VMLINUX) -> dict[str, int]:
    """The offsets for probes/targets.h's fd -> inode walk; UserError (exit 1) when the kernel
    has no BTF or its structs are not as expected."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UserError(f"--file needs the kernel's BTF to read file descriptors in the kernel: {path}: "
                        f"{exc.strerror or exc} (a kernel built with CONFIG_DEBUG_INFO_BTF=y has it)", code=1) from None
    try:
        return offsets(BTF(data))
    except (ValueError, struct.error) as exc:
        raise UserError(f"--file: cannot follow a file descriptor to its inode on this kernel ({exc})", code=1) from None
