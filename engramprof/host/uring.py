"""What tracing io_uring reads needs from this kernel, and whether it has it.

The io_uring probe (probes/uring.bpf.c, loaded by engramprof/bpf/uring.py) reads the request
from two tracepoints and from kernel structs whose layout comes from BTF; the doctor
(engramprof/host/doctor.py) reports from the same lists which of them this kernel has, naming
every one that is missing.
"""
from __future__ import annotations

from engramprof.host import btf as kbtf
from engramprof.host import tracepoints as tp

#: without these there is no request to see: submit (the request, its opcode) and complete (its result)
REQUIRED = ("io_uring:io_uring_submit_req", "io_uring:io_uring_complete")
#: the fields of those tracepoints the probe reads (a kernel that renamed one cannot compile it)
REQUIRED_FIELDS = {
    "io_uring:io_uring_submit_req": ("ctx", "req", "user_data", "opcode", "flags", "sq_thread"),
    "io_uring:io_uring_complete": ("req", "res"),
}
FEATURES = {
    "HAVE_QUEUE_ASYNC": ["io_uring:io_uring_queue_async_work"],  # punted to io-wq (else: counted inline/async)
    # a request's page-cache insertions and bios, in the thread issuing it
    "HAVE_ISSUE_EVIDENCE": ["filemap:mm_filemap_add_to_page_cache",
                            "block:block_bio_queue", "block:block_bio_backmerge", "block:block_rq_complete",
                            "block:block_bio_complete"],
}
FEATURE_EFFECT = {
    "HAVE_QUEUE_ASYNC": "punts to io-wq are not seen (punted requests count as inline or async)",
    "HAVE_ISSUE_EVIDENCE": "requests carry no page-cache insertions, bios or bio time (pages_added, bio_count, "
                           "bio_ns null)",
}

#: (macro, struct, member path, bytes the probe reads): what the probe reads from the request
BTF_FIELDS = [
    ("U_OFF_REQ_FILE", "io_kiocb", "file", 8),
    ("U_OFF_REQ_FD", "io_kiocb", "cqe.fd", 4),
    ("U_OFF_RW_POS", "io_rw", "kiocb.ki_pos", 8),  # io_rw is the request's cmd area (offset 0)
    ("U_OFF_RW_WAITQ", "io_rw", "kiocb.ki_waitq", 8),
    ("U_OFF_RW_ADDR", "io_rw", "addr", 8),
    ("U_OFF_RW_LEN", "io_rw", "len", 4),
    ("U_OFF_RW_FLAGS", "io_rw", "flags", 4),
    ("U_OFF_FILE_INODE", "file", "f_inode", 8),
    ("U_OFF_FILE_FLAGS", "file", "f_flags", 4),
    ("U_OFF_INODE_INO", "inode", "i_ino", 8),
    ("U_OFF_INODE_SB", "inode", "i_sb", 8),
    ("U_OFF_INODE_MODE", "inode", "i_mode", 2),  # S_ISREG: a pipe / socket / procfs read is not a table read
    ("U_OFF_SB_DEV", "super_block", "s_dev", 4),
    # the io-wq worker's request: current->flags (PF_IO_WORKER), ->worker_private (struct io_worker),
    # its cur_work, the request's embedded io_wq_work (read only where a worker inserts or queues a bio)
    ("U_OFF_TASK_FLAGS", "task_struct", "flags", 4),
    ("U_OFF_TASK_WORKER", "task_struct", "worker_private", 8),
    ("U_OFF_WORKER_CUR_WORK", "io_worker", "cur_work", 8),
    ("U_OFF_REQ_WORK", "io_kiocb", "work", 16),
]
#: the read opcodes (enum io_uring_op); READV_FIXED is Linux 6.15+
OPCODES = {"OP_READ": "IORING_OP_READ", "OP_READV": "IORING_OP_READV", "OP_READ_FIXED": "IORING_OP_READ_FIXED",
           "OP_READV_FIXED": "IORING_OP_READV_FIXED"}
REQUIRED_OPCODES = ("OP_READ", "OP_READV", "OP_READ_FIXED")


def btf_status(btf_path: str = kbtf.VMLINUX) -> dict[str, object]:
    """What the probe needs from the kernel's BTF: {"offsets": {macro: offset}, "opcodes":
    {macro: value}, "missing": [names]}.  Never raises: a missing BTF file or struct member is
    listed in ``missing`` (the doctor prints it; engramprof.bpf.uring.plan refuses to load)."""
    missing: list[str] = []
    offsets: dict[str, int] = {}
    opcodes: dict[str, int] = {}
    try:
        b = kbtf.load(btf_path)
    except (OSError, ValueError) as exc:
        return {"offsets": {}, "opcodes": {}, "missing": [f"BTF {btf_path} ({exc})"]}
    for macro, sname, path, size in BTF_FIELDS:
        got = b.member_path(sname, path)
        if got is None:
            missing.append(f"{sname}.{path}")
        elif got[1] != size:
            missing.append(f"{sname}.{path} ({got[1]} bytes, the probe reads {size})")
        else:
            offsets[macro] = got[0]
    ops = b.enum_values("io_uring_op")
    for macro, name in OPCODES.items():
        if name in ops:
            opcodes[macro] = ops[name]
        elif macro in REQUIRED_OPCODES:
            missing.append(f"enum io_uring_op {name}")
    return {"offsets": offsets, "opcodes": opcodes, "missing": missing}


def tracepoint_fields(name: str, root) -> set[str]:
    """The field names of a tracepoint's format (empty when it is not there)."""
    cat, ev = name.split(":", 1)
    try:
        text = (root / "events" / cat / ev / "format").read_text()
    except OSError:
        return set()
    out = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:") and ";" in line:
            decl = line[len("field:"):line.index(";")].strip()
            out.add(decl.split()[-1].split("[")[0])
    return out


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
