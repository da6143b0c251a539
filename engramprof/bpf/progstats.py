"""Runs of a loaded program the kernel skipped: ``struct bpf_prog_info``'s recursion_misses.

A tracepoint program does not run while another BPF program runs on the same CPU (the per-CPU
``bpf_prog_active`` guard of trace_call_bpf; a raw tracepoint's own recursion counter): a block
completion interrupt that lands while the CPU runs a sched_switch or fault program is not seen,
and nothing in the probe's own maps says so.  The kernel counts every such skip in the skipped
program's ``recursion_misses`` (measured here, 6.18: one or two skipped ``block_rq_complete``
runs in a 20-second recording of a cold mmap reader, 5,212 in 6 s under fio's libaio engine, and
skipped ``sched_wakeup`` runs).  A skipped completion leaves its bio untimed and its slot of the
bio table held (probes/bios.h: hence its raw completion hooks, whose guard is their own); a
skipped ``sched_switch`` an off-CPU span unended.

:func:`skipped_runs` reads it for every program of a BCC object (``bpf_obj_get_info`` on the
program's fd, which stays open after detach until cleanup).  The kernel fills as much of the
struct as it knows: a kernel without the field (before 5.12) gives None, "not counted".
"""
from __future__ import annotations

import ctypes
import sys
from functools import lru_cache

#: struct bpf_prog_info (include/uapi/linux/bpf.h): recursion_misses is the u64 at this offset
RECURSION_MISSES_OFFSET = 208
#: the length asked for: up to the end of recursion_misses
INFO_LEN = RECURSION_MISSES_OFFSET + 8

#: BCC's program-name prefixes (TRACEPOINT_PROBE, RAW_TRACEPOINT_PROBE) -> the hook's prefix
_PREFIXES = (("tracepoint__", ""), ("raw_tracepoint__", "raw:"))


@lru_cache(maxsize=1)
def _libbcc():
    """libbcc's bpf_obj_get_info, typed once (it is called for every program every second)."""
    from bcc import libbcc  # deferred: BCC is imported only where programs are loaded

    f = libbcc.lib.bpf_obj_get_info
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    f.restype = ctypes.c_int
    return f


def recursion_misses(fd: int, get_info=None) -> int | None:
    """The kernel's count of skipped runs of the program behind ``fd``; None: not counted (an
    older kernel, or the fd gone)."""
    get_info = get_info or _libbcc()
    buf = ctypes.create_string_buffer(INFO_LEN)
    n = ctypes.c_uint32(INFO_LEN)
    if get_info(fd, buf, ctypes.byref(n)) != 0 or n.value < INFO_LEN:
        return None
    return int.from_bytes(buf.raw[RECURSION_MISSES_OFFSET:INFO_LEN], sys.byteorder)


def hook_name(func_name: str | bytes) -> str:
    """``tracepoint__block__block_rq_complete`` -> ``block:block_rq_complete``;
    ``raw_tracepoint__sched_switch`` -> ``raw:sched_switch``; any other name as it is."""
    name = func_name.decode() if isinstance(func_name, bytes) else func_name
    for prefix, shown in _PREFIXES:
        if name.startswith(prefix):
            return shown + name[len(prefix):].replace("__", ":", 1)
    return name


def skipped_runs(bpf, get_info=None) -> dict[str, int] | None:
    """{hook: skipped runs} of every program of a BCC object that the kernel skipped at least
    once; None when the kernel does not count (or no program is loaded)."""
    funcs = getattr(bpf, "funcs", None) or {}
    out: dict[str, int] = {}
    counted = False
    for name, fn in list(funcs.items()):
        n = recursion_misses(fn.fd, get_info)
        if n is None:
            continue
        counted = True
        if n:
            hook = hook_name(name)
            out[hook] = out.get(hook, 0) + n
    return out if counted else None


def summarize(per_source: dict[str, dict[str, int] | None]) -> dict:
    """A recording's skipped runs: ``runs`` in all (None: no probe's were counted) and
    ``sources``: {source: {hook: runs}} of the probes the kernel skipped."""
    counted = {name: got for name, got in per_source.items() if got is not None}
    return {"runs": sum(sum(got.values()) for got in counted.values()) if counted else None,
            "sources": {name: dict(sorted(got.items())) for name, got in counted.items() if got}}


def hooks_line(skipped: dict | None, top: int = 3) -> str:
    """``block:block_rq_complete 2 (faults), sched:sched_wakeup 1 (sched)``: the hooks the kernel
    skipped most, for one line ("" when none)."""
    rows = [(n, hook, src) for src, hooks in ((skipped or {}).get("sources") or {}).items()
            for hook, n in hooks.items()]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    more = len(rows) - top
    return ", ".join(f"{hook} {n:,} ({src})" for n, hook, src in rows[:top]) + (f", {more} more" if more > 0 else "")


def sentence(skipped: dict | None) -> str | None:
    """What the skips cost, in one sentence (None: none skipped, or not counted)."""
    runs = (skipped or {}).get("runs")
    if not runs:
        return None
    return (f"the kernel skipped {runs:,} runs of the probes' programs (another BPF program was running "
            f"on that CPU): {hooks_line(skipped)}; what those hooks would have seen is missing (a skipped "
            "completion leaves its bio untimed)")
