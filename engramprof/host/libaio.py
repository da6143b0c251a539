"""What tracing Linux AIO (libaio) reads needs from this kernel, and whether it has it.

There is no aio tracepoint: the libaio probe (probes/libaio.bpf.c, loaded by
engramprof/bpf/libaio.py) reads the iocbs and io_events from the process's memory at the AIO
syscalls' tracepoints, and follows each iocb's fd to its file with struct offsets from BTF (the
``--file`` selector's fd walk, engramprof/bpf/btf.py FD_WALK, plus the members below).  The
doctor (engramprof/host/doctor.py) reports from these lists which of them this kernel has.
"""
from __future__ import annotations

from engramprof.host import btf as kbtf
from engramprof.host import tracepoints as tp
from engramprof.host.uring import tracepoint_fields

#: without these there is no read to see: the iocbs at submit, what io_submit took, the reaps
REQUIRED = ("syscalls:sys_enter_io_submit", "syscalls:sys_exit_io_submit",
            "syscalls:sys_enter_io_getevents", "syscalls:sys_exit_io_getevents")
REQUIRED_FIELDS = {
    "syscalls:sys_enter_io_submit": ("ctx_id", "nr", "iocbpp"),
    "syscalls:sys_exit_io_submit": ("ret",),
    "syscalls:sys_enter_io_getevents": ("ctx_id", "events"),
    "syscalls:sys_exit_io_getevents": ("ret",),
}
FEATURES = {
    "HAVE_PGETEVENTS": ["syscalls:sys_enter_io_pgetevents", "syscalls:sys_exit_io_pgetevents"],
    "HAVE_DESTROY": ["syscalls:sys_enter_io_destroy", "syscalls:sys_exit_io_destroy"],
    "HAVE_SETUP": ["syscalls:sys_enter_io_setup", "syscalls:sys_exit_io_setup"],
    "HAVE_BIO": ["block:block_bio_queue", "block:block_bio_backmerge", "block:block_rq_complete",
                 "block:block_bio_complete"],
    "HAVE_IOMAP": ["iomap:iomap_dio_rw_begin"],
}
FEATURE_EFFECT = {
    "HAVE_PGETEVENTS": "reads reaped with io_pgetevents are not seen completing",
    "HAVE_DESTROY": "reads in flight at io_destroy stay counted as in flight",
    "HAVE_SETUP": "a context's first events consumed in user space before its ring was touched are missed",
    "HAVE_BIO": "no bios: bio_count / bio_ns of libaio reads are null",
    "HAVE_IOMAP": "bios are credited only to the iocb of a one-iocb io_submit",
}
#: (macro, struct, member path, bytes the probe reads): the fd walk's (probes/targets.h
#: fd_file_walk: an iocb's file, its O_DIRECT flag, whether it is a regular file)
BTF_FIELDS = list(kbtf.FD_WALK)


def btf_status(btf_path: str = kbtf.VMLINUX) -> dict[str, object]:
    """{"offsets": {macro: offset}, "missing": [names]}; never raises."""
    missing: list[str] = []
    offsets: dict[str, int] = {}
    try:
        b = kbtf.load(btf_path)
    except (OSError, ValueError) as exc:
        return {"offsets": {}, "missing": [f"BTF {btf_path} ({exc})"]}
    for macro, sname, path, size in BTF_FIELDS:
        got = b.member_path(sname, path)
        if got is None:
            missing.append(f"{sname}.{path}")
        elif got[1] != size:
            missing.append(f"{sname}.{path} ({got[1]} bytes, the probe reads {size})")
        else:
            offsets[macro] = got[0]
    return {"offsets": offsets, "missing": missing}


def missing_tracepoints(root) -> list[str]:
    """Required tracepoints (and fields of them) this kernel lacks, by name."""
    out = []
    for n in REQUIRED:
        if root is None or not tp.available(n, root):
            out.append(n)
            continue
        have = tracepoint_fields(n, root)
        out += [f"{n} field {f}" for f in REQUIRED_FIELDS.get(n, ()) if f not in have]
    return out
