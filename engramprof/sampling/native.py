"""Native frames of a read: the user stack the probe copied at the call, unwound with the
binaries' DWARF call-frame information (``.eh_frame``) and symbolized from the binaries' symbol tables.

Why not BCC's own user stack map (``BPF_STACK_TRACE`` with ``BPF_F_USER_STACK``): the kernel walks
frame pointers, and neither Debian's libc nor RocksDB (rocksdict's wheel) keeps them; measured on
rocksdict's direct reads, every stack ended at ``pread64`` (one frame).  The probe therefore copies
the thread's saved user registers (ip, sp, bp) and up to ``STACK_BYTES`` of its stack from sp up
at the call's exit (the user stack cannot change while the thread is in the kernel: the copy is the
stack at the read), for at most one call per CPU every ``NATIVE_EVERY_NS`` (probes/syscalls.bpf.c);
this module unwinds the copy the way a debugger does (CFA rules of each frame's FDE: x86_64 rsp /
rbp, the return address at CFA-8) until the copy ends, a frame has no FDE, or the walk reaches the
interpreter (the Python frames are py-spy's).

pyelftools parses a module's CFI once (rocksdict's 11k FDEs: about 5 s); every stack after that is
a few lookups.  Symbolizing needs the process's mappings: a worker thread unwinds while the target
still runs (:class:`NativeStacks`).
"""
from __future__ import annotations

import bisect
import queue
import struct
import threading
from typing import Callable

import pyarrow as pa

from engramprof.trace.schema import sample_schema

#: the interpreter's own modules: the walk stops there (py-spy has the Python frames above)
PYTHON_MODULES = ("python", "libpython")
MAX_FRAMES = 48
#: a module's CFI is parsed once a process lifetime; the worker gives up after this many stacks
MAX_STACKS = 2000
_RSP, _RBP, _RA = 7, 6, 16
DW_CFA_GNU_ARGS_SIZE = 0x2E


class Mapping:
    __slots__ = ("start", "end", "offset", "path")

    def __init__(self, start: int, end: int, offset: int, path: str):
        self.start, self.end, self.offset, self.path = start, end, offset, path


def read_maps(pid: int) -> list[Mapping]:
    """The executable file mappings of ``pid`` (sorted by start)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(Mapping(lo, hi, int(parts[2], 16), parts[5].strip()))
    return sorted(out, key=lambda m: m.start)


class Module:
    """One ELF file's CFI: FDEs by address, decoded on first use."""

    def __init__(self, path: str):
        from elftools.elf.elffile import ELFFile

        self.path = path
        self._f = open(path, "rb")
        self.elf = ELFFile(self._f)
        self.loads = [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in self.elf.iter_segments()
                      if s["p_type"] == "PT_LOAD"]
        self._starts: list[int] | None = None  # parsed at the first walk through this module
        self.fdes: list = []
        self._rows: dict[int, tuple[list[int], list[dict]]] = {}
        self._syms: tuple[list[int], list] | None = None

    @property
    def starts(self) -> list[int]:
        """The FDEs' first addresses, sorted (the CFI parsed on first use: a module only named,
        such as the interpreter where the walk stops, is never parsed)."""
        if self._starts is None:
            self._starts = []
            dw = self.elf.get_dwarf_info(follow_links=False) if self.elf.has_dwarf_info() else None
            if dw is not None and dw.has_EH_CFI():
                from elftools.dwarf.callframe import FDE

                self.fdes = sorted((e for e in dw.EH_CFI_entries() if isinstance(e, FDE)),
                                   key=lambda e: e.header["initial_location"])
                self._starts = [e.header["initial_location"] for e in self.fdes]
        return self._starts

    def symbol(self, va: int) -> str | None:
        """The function symbol holding ``va`` (its table read on first use)."""
        if self._syms is None:
            syms = []
            sec = self.elf.get_section_by_name(".symtab") or self.elf.get_section_by_name(".dynsym")
            for sym in (sec.iter_symbols() if sec is not None else []):
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]:
                    syms.append((sym["st_value"], sym["st_size"], sym.name))
            syms.sort()
            self._syms = ([v for v, _, _ in syms], syms)
        i = bisect.bisect_right(self._syms[0], va) - 1
        if i < 0:
            return None
        v, size, name = self._syms[1][i]
        return name if va < v + max(size, 1) else None

    def vaddr(self, file_off: int) -> int | None:
        for off, va, sz in self.loads:
            if off <= file_off < off + sz:
                return file_off - off + va
        return None

    def rule_at(self, va: int) -> dict | None:
        """The CFI row (``cfa`` and register rules) in force at ``va``, or None."""
        i = bisect.bisect_right(self.starts, va) - 1
        if i < 0:
            return None
        fde = self.fdes[i]
        if va >= fde.header["initial_location"] + fde.header["address_range"]:
            return None
        rows = self._rows.get(i)
        if rows is None:
            # DW_CFA_GNU_args_size (C++ code with exceptions) says nothing about the CFA; pyelftools
            # parses it but cannot decode a table that holds it
            fde.instructions = [x for x in fde.instructions if x.opcode != DW_CFA_GNU_ARGS_SIZE]
            table = fde.get_decoded().table
            rows = self._rows[i] = ([r["pc"] for r in table], table)
        k = bisect.bisect_right(rows[0], va) - 1
        return rows[1][k] if k >= 0 else None


def unwind(ip: int, sp: int, bp: int, stack: bytes, maps: list[Mapping], module: Callable[[str], Module | None]) -> list[tuple[int, str]]:
    """(address, module path) per frame, innermost first: ``ip`` then each return address."""
    starts = [m.start for m in maps]

    def word(addr: int) -> int | None:
        o = addr - sp
        return struct.unpack_from("<Q", stack, o)[0] if 0 <= o <= len(stack) - 8 else None

    frames: list[tuple[int, str]] = []
    pc, rsp, rbp = ip, sp, bp
    for depth in range(MAX_FRAMES):
        i = bisect.bisect_right(starts, pc) - 1
        if i < 0 or pc >= maps[i].end:
            break
        m = maps[i]
        frames.append((pc, m.path))
        if m.path.rsplit("/", 1)[-1].startswith(PYTHON_MODULES):
            break
        mod = module(m.path)
        va = mod.vaddr(pc - m.start + m.offset) if mod is not None else None
        # a return address is after its call: look the caller's rule up at the call itself
        row = mod.rule_at(va - (1 if depth else 0)) if va is not None else None
        if row is None:
            break
        cfa_rule = row["cfa"]
        if cfa_rule.expr is not None or cfa_rule.reg not in (_RSP, _RBP):
            break
        cfa = (rsp if cfa_rule.reg == _RSP else rbp) + cfa_rule.offset
        ra_rule = row.get(_RA)
        ra = word(cfa + (ra_rule.arg if ra_rule is not None and ra_rule.type == "OFFSET" else -8))
        bp_rule = row.get(_RBP)
        if bp_rule is not None and bp_rule.type == "OFFSET":
            rbp = word(cfa + bp_rule.arg)
            if rbp is None:
                break
        if not ra:
            break
        pc, rsp = ra, cfa
    return frames


def symbolize(frames: list[tuple[int, str]], module: Callable[[str], "Module | None"], maps: list[Mapping]) -> str:
    """``frames`` as text, one a line, innermost first: ``function<TAB>module<TAB>0`` (the Python
    stacks' format; line 0: native code has no line here).  Names from each binary's symbol table
    (``.symtab``, else ``.dynsym``), demangled by libstdc++: no need for the process to be alive
    (BCC's symbolizer reads the live process's mappings)."""
    starts = [m.start for m in maps]
    out = []
    for depth, (addr, path) in enumerate(frames):
        m = maps[bisect.bisect_right(starts, addr) - 1]
        mod = module(path)
        va = mod.vaddr(addr - m.start + m.offset) if mod is not None else None
        name = mod.symbol(va - (1 if depth else 0)) if va is not None else None
        out.append(f"{short_name(demangle(name)) if name else hex(addr)}\t{path}\t0")
    return "\n".join(out)


_CXA = None


def demangle(name: str) -> str:
    """C++ (and Rust's legacy) mangled names through libstdc++'s ``__cxa_demangle``."""
    global _CXA
    if not name.startswith("_Z"):
        return name
    import ctypes
    import ctypes.util

    if _CXA is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            _CXA = lib.__cxa_demangle
            _CXA.restype = ctypes.c_void_p
            _CXA.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        except (OSError, AttributeError):
            _CXA = False
    if not _CXA:
        return name
    status = ctypes.c_int(0)
    p = _CXA(name.encode(), None, None, ctypes.byref(status))
    if not p or status.value != 0:
        return name
    try:
        return ctypes.string_at(p).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(p))


def short_name(name: str) -> str:
    """A C++ / Rust function as a reader names it: no argument list, no return type, template
    arguments as ``<...>``, no Rust hash suffix
    (``rocksdb::BlockBasedTable::RetrieveBlock<...>``)."""
    out, depth, word = [], 0, []
    for c in name:
        if c == "<":
            if depth == 0:
                word.append("<...>")
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif depth:
            continue
        elif c == "(" and word:  # the parameters (an operator() keeps its name: rare here)
            break
        elif c == " ":  # a return type before the name
            out, word = [], []
        else:
            word.append(c)
    name = "".join(word) or name
    parts = name.rsplit("::", 1)
    if len(parts) == 2 and len(parts[1]) == 17 and parts[1].startswith("h"):
        name = parts[0]
    return name


class Unwinder:
    """Unwinds and symbolizes stack copies, a module's CFI and symbols parsed once."""

    def __init__(self):
        self.maps: dict[int, list[Mapping]] = {}
        self._modules: dict[str, Module | None] = {}

    def module(self, path: str) -> Module | None:
        if path not in self._modules:
            try:
                self._modules[path] = Module(path)
            except Exception:  # not an ELF file we can read: the walk stops there
                self._modules[path] = None
        return self._modules[path]

    def frames(self, pid: int, ip: int, sp: int, bp: int, data: bytes) -> tuple[str, int]:
        maps = self.maps.get(pid, [])
        frames = unwind(ip, sp, bp, data, maps, self.module)
        return symbolize(frames, self.module, maps), len(frames)


def worker_main() -> None:
    """The unwinding process: pickled ``("maps", pid, maps)`` / ``("stack", pid, tid, ts, ip, sp,
    bp, data)`` items on stdin until EOF, then the pickled rows and the failure count on stdout."""
    import pickle
    import sys

    u = Unwinder()
    rows, failed = [], 0
    inp = sys.stdin.buffer
    while True:
        try:
            item = pickle.load(inp)
        except EOFError:
            break
        if item[0] == "maps":
            u.maps[item[1]] = [Mapping(*m) for m in item[2]]
            continue
        _, pid, tid, ts, ip, sp, bp, data = item
        try:
            text, depth = u.frames(pid, ip, sp, bp, data)
        except Exception:
            failed += 1
            continue
        rows.append({"ts_ns": ts, "pid": pid, "tid": tid, "frames": text, "depth": depth})
    pickle.dump((rows, failed), sys.stdout.buffer)
    sys.stdout.buffer.flush()


#: how long the recording's end waits for the unwinding process to finish its queue
STOP_WAIT_S = 60.0
WORKER_NICE = 10


class NativeStacks:
    """The probe's stack copies, unwound and symbolized in a process of their own (parsing a big
    module's CFI takes seconds of CPU: in the recorder it would hold the GIL from the drain).

    :meth:`add` (the drain): a copy, with the process's mappings read at its first (while it
    runs; a later library: the walk stops there); a writer thread feeds the process; :meth:`stop`
    ends its input and takes its rows (``ts_ns, pid, tid, frames, depth``: :attr:`rows`)."""

    def __init__(self, notes: list[str] | None = None):
        import subprocess
        import sys

        self.rows: list[dict] = []
        self.notes = notes if notes is not None else []
        self.dropped = 0
        self.failed = 0
        self._taken = 0
        self._maps_sent: set[int] = set()
        self._q: queue.Queue = queue.Queue()
        self._proc = subprocess.Popen([sys.executable, "-c", "from engramprof.sampling.native import worker_main; "
                                       "worker_main()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      preexec_fn=_nice)
        self._writer = threading.Thread(target=self._feed, name="engramprof-native", daemon=True)
        self._writer.start()

    def add(self, pid: int, tid: int, ts_ns: int, ip: int, sp: int, bp: int, data: bytes) -> None:
        if self._taken >= MAX_STACKS:
            self.dropped += 1
            return
        self._taken += 1
        if pid not in self._maps_sent:
            self._maps_sent.add(pid)
            try:
                maps = [(m.start, m.end, m.offset, m.path) for m in read_maps(pid)]
            except OSError:
                maps = []
            self._q.put(("maps", pid, maps))
        self._q.put(("stack", pid, tid, ts_ns, ip, sp, bp, data))

    def _feed(self) -> None:
        import pickle

        while True:
            item = self._q.get()
            if item is None:
                break
            try:
                pickle.dump(item, self._proc.stdin)
            except (BrokenPipeError, OSError):
                break
        try:
            self._proc.stdin.close()
        except OSError:
            pass

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        import pickle
        import subprocess

        self._q.put(None)
        self._writer.join(timeout=wait_s)  # it closes the worker's input
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(self._proc.stdout.read()), daemon=True)
        reader.start()
        reader.join(timeout=wait_s)
        if reader.is_alive():
            self._proc.kill()
            self.notes.append(f"native stacks not unwound: the unwinding took over {wait_s:g} s")
        try:
            self._proc.wait(timeout=5)
            if out and out[0]:
                self.rows, self.failed = pickle.loads(out[0])
        except (subprocess.TimeoutExpired, Exception) as exc:  # no native frames; nothing else changes
            self.notes.append(f"native stacks not unwound: {type(exc).__name__}")

    def summary(self) -> dict:
        return {"stacks": len(self.rows), "not_unwound": self.failed, "over_limit": self.dropped}


def _nice() -> None:
    import os

    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass


def native_table(rows: list[dict]):
    """The ``native_stacks`` series (engramprof.trace.SAMPLE_SCHEMAS)."""
    sch = sample_schema("native_stacks")
    return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in sch}, schema=sch)
