"""The probes' shared kernel code is pasted from probes/*.h by one resolver (layout.inline_headers),
and the structs user space decodes are parsed by one parser (layout.parse_struct).

No BPF needed: the program texts are built from plans with every feature on.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engramprof.bpf import structs as layout

PROBES = Path(layout.probe_dir())


def _texts() -> dict[str, str]:
    from engramprof.bpf import faults, sched
    from engramprof.bpf import syscalls as syscalls_probe
    from engramprof.export import probe as ep
    from engramprof.target.selection import Selection

    out = {}
    for raw in (True, False):
        p = syscalls_probe.assumed_plan(syscalls_probe.SyscallsConfig(tgid=4242, syscall_hook="raw" if raw else "tracepoint"), "test")
        out[f"preadv raw={raw}"] = syscalls_probe.program_text(p)
        e = ep.ExportPlan(config=ep.ExportProbeConfig(selection=Selection(pids=[4242])),
                          features={f: True for f in ep.FEATURES}, raw_syscalls=raw)
        out[f"export raw={raw}"] = ep.program_text(e)
    out["faults"] = faults.program_text(faults.FaultProbePlan(
        config=faults.FaultProbeConfig(tgid=4242), features={f: True for f in faults.FEATURES}))
    out["sched"] = sched.program_text(sched.SchedPlan(
        config=sched.SchedConfig(tgid=4242), features={f: True for f in sched.FEATURES}))
    return out


@pytest.fixture(scope="module")
def texts():
    try:
        return _texts()
    except (AttributeError, TypeError) as exc:  # a plan / config class renamed: adapt the builder above
        pytest.fail(f"cannot build the program texts: {exc}")


def test_every_local_include_is_pasted_once(texts):
    for what, text in texts.items():
        assert not re.search(r'^#include "', text, flags=re.M), what
        for guard in ("ENGRAMPROF_COMMON_H", "ENGRAMPROF_TIDBITS_H"):
            assert text.count(f"#define {guard}\n") == 1, (what, guard)


def test_inflight_state_is_written_once(texts):
    """struct inflight, offcpu_state, bio_wait and the call_out_bits helpers come from probes/inflight.h
    alone: the two probes do not define them again."""
    for name in ("syscalls.bpf.c", "export.bpf.c"):
        src = (PROBES / name).read_text()
        assert '#include "inflight.h"' in src
        code = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
        for own in ("struct inflight {", "struct offcpu_state {", "struct bio_wait {", "BPF_ARRAY(call_out_bits",
                    "RAW_TRACEPOINT_PROBE(sys_enter)", "reclaim_begin(void)", "(sched, sched_wakeup)"):
            assert own not in code, (name, own)
    for what, text in texts.items():
        if what.startswith(("preadv", "export")):
            assert text.count("struct inflight {") == 1 and text.count("BPF_ARRAY(call_out_bits") == 1, what
            assert text.count("RAW_TRACEPOINT_PROBE(sys_enter)") == 1, what  # (#if USE_RAW_SYSCALLS)


def test_one_bit_per_tid_helpers_are_written_once():
    """The bit arithmetic of call_out_bits / fault_out_bits / open_spans is probes/tidbits.h's."""
    for path in PROBES.glob("*"):
        if path.name == "tidbits.h" or path.suffix not in (".c", ".h"):
            continue
        code = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
        assert "& 63" not in code and ">> 6;" not in code, path.name


def test_the_one_struct_parser():
    from engramprof.bpf import pagecache

    text = "struct s {\n\tu64 a;   /* one */\n\tu32 b;\n\tu16 c;\n\tu8 d;\n\tu8 __pad0;\n};\n"
    dt = layout.parse_struct(text, "s")
    assert dt.names == ("a", "b", "c", "d", "__pad0") and dt.itemsize == 16
    assert pagecache.struct_dtype("pagecache_record") == layout.parse_struct(
        (PROBES / "pagecache.h").read_text(), "pagecache_record")
    with pytest.raises(KeyError):
        layout.parse_struct(text, "t")


#: probe source -> its header of what kernel and user space share (libbpf-tools: X.bpf.c + X.h)
PROBE_HEADERS = {"syscalls.bpf.c": "syscalls.h", "faults.bpf.c": "faults.h", "sched.bpf.c": "sched.h",
                 "evictions.bpf.c": "evictions.h", "pagecache.bpf.c": "pagecache.h", "export.bpf.c": "export.h",
                 "uring.bpf.c": "uring.h"}


def test_each_probe_has_its_header_and_records_live_only_there():
    """Each probe includes its own probes/<p>.h, and no record that user space decodes is
    defined in a .bpf.c (a second definition could drift from the one Python parses)."""
    records = set()
    for h in set(PROBE_HEADERS.values()):
        text = (PROBES / h).read_text()
        records |= set(re.findall(r"^struct (\w+) \{", text, flags=re.M))
        assert "BPF_" not in re.sub(r"/\*.*?\*/", "", text, flags=re.S), f"{h} holds a map: kernel-only state"
    assert {"call_record", "fault_record", "offcpu_record", "eviction_record", "pagecache_record",
            "read_stats"} <= records
    for src, h in PROBE_HEADERS.items():
        text = (PROBES / src).read_text()
        assert f'#include "{h}"' in text, src
        again = sorted(set(re.findall(r"^struct (\w+) \{", text, flags=re.M)) & records)
        assert not again, f"{src} defines {again}, which {h} or another probe header holds"


def test_kernel_types_match_the_running_kernel():
    """probes/kernel_types.h declares the x86-64 register frame instead of including
    <linux/ptrace.h> (a second of clang per probe): each member at the offset this kernel's BTF
    gives struct pt_regs, and the same size."""
    import os

    from engramprof.host import btf

    if os.uname().machine != "x86_64":
        pytest.skip("kernel_types.h declares pt_regs for x86_64 only; other machines include the kernel's header")
    if not os.path.exists(btf.VMLINUX):
        pytest.skip(f"no kernel BTF at {btf.VMLINUX} to compare with")
    text = (PROBES / "kernel_types.h").read_text()
    body = re.search(r"struct pt_regs \{(.*?)\};", text, re.S).group(1)
    names = re.findall(r"\b([a-z][a-z0-9_]*)\b(?=[,;])", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
    b = btf.load()
    tid = b.struct_id("pt_regs")
    assert [b.member(tid, n)[0] for n in names] == [8 * i for i in range(len(names))], names
    assert b.size_of(tid) == 8 * len(names)
    for probe in PROBES.glob("*.bpf.c"):  # the costly kernel headers stay out of every probe
        assert not re.search(r"#include <linux/(fs|ptrace|uio|aio_abi)\.h>", probe.read_text()), probe.name


@pytest.mark.bpf
def test_every_program_text_compiles_in_both_syscall_hooks(texts):
    """Each text above compiles and loads, with raw_syscalls and with the per-syscall
    tracepoints, whose argument structs name kernel types (rwf_t, aio_context_t): the recorder
    picks the raw hook on x86_64, so no other test compiles the tracepoint form."""
    from bcc import BPF

    from engramprof.bpf.base import CFLAGS, quiet_stderr

    failed = []
    for name, text in texts.items():
        try:
            with quiet_stderr():
                b = BPF(text=text.encode(), cflags=CFLAGS)
            b.cleanup()
        except Exception as exc:  # BCC raises bare Exception on a compile / load failure
            failed.append(f"{name}: {exc}")
    assert not failed, failed
