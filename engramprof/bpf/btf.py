"""Struct member offsets of the running kernel, read from its BTF (/sys/kernel/btf/vmlinux).

BCC compiles against whatever kernel headers are installed, which need not be the running
kernel's (here: 6.1 headers on a 6.18 kernel), so a probe that walks kernel structs must not
take their layout from the headers.  :func:`fd_walk_offsets` gives the byte offsets of the
members on the path ``current->files->fdt->fd[fd]->{f_flags, f_pos, f_inode->{i_mode, i_ino,
i_sb->s_dev}}`` as the running kernel laid them out; probes/targets.h reads each hop with bpf_probe_read_kernel.

The BTF reader is engramprof/host/btf.py (the doctor reads the same facts).
"""
from __future__ import annotations

import struct
from functools import lru_cache

from engramprof.errors import UserError
from engramprof.host.btf import BTF, FD_WALK, VMLINUX, load  # noqa: F401  (re-exported: the loaders' import)


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


@lru_cache(maxsize=4)
def fd_walk_offsets(why: str = "--file", path: str = VMLINUX) -> dict[str, int]:
    """The offsets for probes/targets.h's fd -> file -> inode walk; UserError (exit 1, naming
    ``why`` the walk is needed) when the kernel has no BTF or its structs are not as expected."""
    try:
        # parsed once per process (0.3 s each time), shared with the other probes' loaders
        return offsets(load(path))
    except OSError as exc:
        raise UserError(f"{why} needs the kernel's BTF to read file descriptors in the kernel: {path}: "
                        f"{exc.strerror or exc} (a kernel built with CONFIG_DEBUG_INFO_BTF=y has it)", code=1) from None
    except (ValueError, struct.error) as exc:
        raise UserError(f"{why}: cannot follow a file descriptor to its inode on this kernel ({exc})", code=1) from None
