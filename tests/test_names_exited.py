"""Names for identities of a process that has exited (engramprof/bpf/names.py, no BPF): a
reader that opens a file, reads it and exits between two drains was never looked at alive; its
identities are joined to the last mount list read for it, else the tracer's own."""
from __future__ import annotations

import os

from engramprof.bpf import names
from engramprof.host.files import kernel_dev


def _probe_naming(inner: str) -> names.NamesProbe:
    p = object.__new__(names.NamesProbe)  # no compile: only the user-space join is under test
    p._mounts = {}
    p.inner_path = lambda dev, ino: (inner, True)
    return p


def _inner(path: str) -> str:
    """``path`` inside its filesystem: below the mount point of the longest mount holding it."""
    st = os.stat(path)
    best = ""
    for dev, root, point in names.mounts("self"):
        if dev == kernel_dev(st.st_dev) and (path + "/").startswith(point.rstrip("/") + "/") and len(point) > len(best):
            best, base = point, root
    return base.rstrip("/") + path[len(best.rstrip("/")):]


def test_a_file_of_a_process_that_has_exited_is_named_from_the_tracers_mounts(tmp_path):
    f = tmp_path / "chunk.bin"
    f.write_bytes(b"x" * 4096)
    st = os.stat(f)
    gone = 2 ** 22 + 7  # above pid_max's default: no such process
    assert not os.path.exists(f"/proc/{gone}")
    probe = _probe_naming(_inner(str(f)))
    assert probe.name(gone, kernel_dev(st.st_dev), st.st_ino) == str(f)
    # a live process is still named through its own root and mounts
    assert probe.name(os.getpid(), kernel_dev(st.st_dev), st.st_ino) == str(f)
