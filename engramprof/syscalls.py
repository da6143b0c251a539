"""Per-call preadv2 / preadv / pread64 recording for one process (``engramprof syscalls``).

The probe (probes/preadv.bpf.c) writes one fixed-size record per call into a ring buffer
without waking user space; this module drains it every ``DRAIN_S`` in bulk (numpy over the
mapped ring), resolves fd -> path, adds safetensors tensor/row, and streams the records to the
trace bundle as one Parquet part per second, so memory stays flat however long it runs.  It
keeps running aggregates for the live view and the final summary; the kernel keeps exact
totals and per-fd log2 histograms so the summary stays right when records are lost.

It ends on: the duration, SIGINT/SIGTERM (the caller sets ``stop``), or the target's exit
(pidfd becomes readable).  In every case the trace is closed cleanly.
"""
from __future__ import annotations

import os
import queue
import select
import shlex
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from engramprof import trace as tracefmt
from engramprof.bpf import loader
from engramprof.errors import UserError
from engramprof.fdmap import FdResolver

DRAIN_S = 0.05
FLUSH_S = 1.0
SYSCALL_NAMES = np.array(["preadv2", "preadv", "pread64"], dtype=object)
_SYSCALL_DICT = pa.array(SYSCALL_NAMES.tolist(), type=pa.string())
RWF_NOWAIT = 0x8
EAGAIN = -11

# user-space latency histogram: 32 sub-buckets per power of two of ns (~2% resolution)
_SUB = 32


def _lat_index(ns: np.ndarray) -> np.ndarray:
    ns = np.maximum(ns.astype(np.float64), 1.0)
    e = np.floor(np.log2(ns))
    frac = ns / np.exp2(e) - 1.0
    return (e * _SUB + np.floor(frac * _SUB)).astype(np.int64)


def _lat_value(idx: np.ndarray | int) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.float64)
    e = np.floor(idx / _SUB)
    sub = idx - e * _SUB
    return np.exp2(e) * (1.0 + (sub + 0.5) / _SUB)


class LatencyHist:
    """Mergeable log-linear histogram of call durations (ns)."""

    def __init__(self):
        self.counts = np.zeros(64 * _SUB, dtype=np.int64)
        self.max_ns = 0
        self.n = 0

    def add(self, ns: np.ndarray, index: np.ndarray | None = None) -> None:
        """Add durations (``index``: their _lat_index, when the caller has it already)."""
        if len(ns) == 0:
            return
        idx = _lat_index(ns) if index is None else index
        self.counts += np.bincount(idx, minlength=len(self.counts))[: len(self.counts)]
        self.max_ns = max(self.max_ns, int(ns.max()))
        self.n += len(ns)

    def quantile(self, q: float) -> float:
        if self.n == 0:
            return float("nan")
        c = np.cumsum(self.counts)
        i = int(np.searchsorted(c, q * self.n, side="left"))
        return float(min(_lat_value(i), self.max_ns))


def pid_state(pid: int) -> str | None:
    """'R', 'S', 'Z', ... or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:][:1].decode()
    except (OSError, ValueError):
        return None


def check_target(pid: int, tid: int = 0) -> None:
    st = pid_state(pid)
    if st is None or st in ("Z", "X"):
        raise UserError(f"no process with pid {pid}", code=2)
    if tid and not os.path.isdir(f"/proc/{pid}/task/{tid}"):
        raise UserError(f"pid {pid} has no thread {tid}", code=2)


def check_privileges() -> None:
    """One-line error unless this process may load and attach the probes (doctor's check)."""
    from engramprof import doctor

    c = doctor.check_privileges()
    if c.status == doctor.FAIL:
        raise UserError(c.detail.split("; engramprof syscalls")[0] + ": tracing needs root or CAP_BPF + CAP_PERFMON",
                        code=1)


@dataclass
class FileStat:
    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0
    misses: int = 0
    eagain: int = 0


@dataclass
class LiveState:
    """What the live view and the summary read; updated once per drain."""

    started_ns: int = 0
    recorded: int = 0
    eagain: int = 0
    nowait: int = 0
    pages_added: int = 0
    calls_with_misses: int = 0
    bio_ns: int = 0
    reclaim_ns: int = 0
    offcpu_ns: int = 0
    runq_ns: int = 0
    hist: LatencyHist = field(default_factory=LatencyHist)
    files: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    slowest: pd.DataFrame | None = None
    # per-second window for the live view
    window_calls: int = 0
    window_eagain: int = 0
    window_nowait: int = 0
    window_hist: LatencyHist = field(default_factory=LatencyHist)


class SyscallTracer:
    def __init__(self, pid: int, tid: int = 0, min_us: float = 0.0, output: str | None = None,
                 sample_hz: float = 10.0, syscall_hook: str = "auto", argv: list[str] | None = None):
        self.pid, self.tid = pid, tid
        self.output = output
        self.sample_hz = sample_hz
        self.config = loader.ProbeConfig(tgid=pid, tid=tid, min_ns=int(min_us * 1000), syscall_hook=syscall_hook)
        self.argv = argv or []
        self.stop = threading.Event()
        self.end_reason = "running"
        self.state = LiveState()
        self.writer: tracefmt.TraceWriter | None = None
        self.probe: loader.LoadedProbe | None = None
        self.sampler = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pidfd: int | None = None
        self.notes: list[str] = []
        self._fds_seen: set[int] = set()
        self._path_index: dict[str, int] = {}
        self._path_values: list[str] = []
        self.intern_path("")
        self._tensor_index: dict[str, int] = {"": 0}
        self._tensor_values: list[str] = [""]
        self._layouts: dict[str, object] = {}
        self._tensor_codes: dict[int, np.ndarray] = {}
        self._write_q: queue.Queue = queue.Queue(maxsize=8)
        self.partial_at_start = 0
        self._vm_events: list[np.ndarray] = []
        self.kswapd_events = 0
        self._write_thread: threading.Thread | None = None
        self._missing_cols: list[str] = []

    # ---- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        # Arrow's default (mimalloc) pool keeps freed batches mapped: over a long trace the
        # collector's RSS creeps up; the system allocator returns them (measured flat, see README)
        pa.set_memory_pool(pa.system_memory_pool())
        check_target(self.pid, self.tid)
        check_privileges()
        p = loader.plan(self.config)
        self.plan = p
        self._missing_cols = p.missing_columns
        if p.missing:
            self.notes.append(f"tracepoints missing, evidence not collected: {', '.join(p.missing)}")
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except OSError:
            raise UserError(f"no process with pid {self.pid}", code=2) from None
        self.fds = FdResolver(self.pid)
        cmdline = _cmdline(self.pid)
        if self.output:
            self.writer = tracefmt.TraceWriter(self.output, meta={
                "pid": self.pid, "tid": self.tid or None, "target_cmdline": cmdline,
                "engramprof_argv": self.argv, "probe": loader.PROBE_FILE,
                "probe_version": loader.layout.header_define("ENGRAMPROF_PROBE_VERSION"),
                "syscall_hook": "raw_syscalls" if p.raw_syscalls else "syscalls tracepoints",
                "min_ns": self.config.min_ns, "missing_tracepoints": p.missing,
                "missing_evidence": p.missing_columns,
            })
        try:
            self.probe = loader.LoadedProbe(p)
        except BaseException:
            if self.writer:  # leave a closed, loadable (empty) bundle that says why
                self.writer.close(end_reason="probe load failed", end_ns=time.monotonic_ns())
            raise
        self.state.started_ns = time.monotonic_ns()
        if self.writer:
            self.writer.update_meta(start_ns=self.state.started_ns)
            self.writer.flush_meta()
        self._start_sampler()

    def _start_sampler(self) -> None:
        if not self.sample_hz:
            return
        try:
            from engramprof.samplers import Sampler
        except ImportError:
            return
        try:
            self.sampler = Sampler(pid=self.pid, hz=self.sample_hz)
            self.sampler.start(self.writer)
        except Exception as exc:  # samplers are context; never lose the trace over them
            self.sampler = None
            self.notes.append(f"samplers not running: {exc}")

    def target_exited(self) -> bool:
        if self._pidfd is None:
            return False
        r, _, _ = select.select([self._pidfd], [], [], 0)
        return bool(r)

    def run(self, duration: float | None = None, on_tick=None) -> None:
        """Drain until duration / stop / target exit; call on_tick(self) about once a second."""
        t0 = time.monotonic()
        last_flush = t0
        while True:
            if self.stop.wait(DRAIN_S):
                self.end_reason = self.end_reason if self.end_reason != "running" else "signal"
                break
            self.drain()
            now = time.monotonic()
            if now - last_flush >= FLUSH_S:
                self.flush()
                if on_tick:
                    on_tick(self)
                self._reset_window()
                last_flush = now
            if duration is not None and now - t0 >= duration:
                self.end_reason = "duration"
                break
            if self.target_exited():
                self.end_reason = "target-exit"
                break

    def finish(self) -> dict:
        """Detach, drain what is left, write the closing metadata; return the summary."""
        probe = self.probe
        totals, hists, bio_hist = {}, {}, None
        end_ns = time.monotonic_ns()
        if probe is not None:
            end_ns = probe.detach() or end_ns
            self.drain()
            totals = probe.totals()
            hists = probe.histograms(self._fds_seen)
            bio_hist = probe.bio_histogram() if self.plan.features.get("HAVE_BIO") else None
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception as exc:
                self.notes.append(f"sampler stop failed: {exc}")
        self.flush()
        self._stop_write_thread()
        summary = self.summary(totals, hists, end_ns, bio_hist)
        if self.writer:
            self._write_hist_table(hists)
            if bio_hist is not None:
                slots = np.nonzero(bio_hist)[0]
                self.writer.write_table("bio_latency_log2", pd.DataFrame(
                    {"log2_slot": slots, "ns_lower": [1 << int(i) for i in slots], "count": bio_hist[slots]}))
            self.writer.close(end_ns=end_ns, end_reason=self.end_reason, totals=totals,
                              lost_records=totals.get("lost_records", 0), notes=self.notes,
                              partial_at_start=self.partial_at_start,
                              fd_history={str(k): v for k, v in self.fds.history.items()})
        if probe is not None:
            probe.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return summary

    # ---- data path --------------------------------------------------------------------
    # Strings (path, tensor, syscall) travel as dictionary codes: the recorder interns each
    # distinct string once, builds Arrow dictionary arrays from int32 codes, and Parquet
    # stores them without hashing a string per record.

    def _intern(self, table: dict, values: list, v: str) -> int:
        code = table.get(v)
        if code is None:
            code = table[v] = len(values)
            values.append(v)
        return code

    def intern_path(self, p: str) -> int:
        return self._intern(self._path_index, self._path_values, p)

    def drain(self) -> None:
        ev = self.probe.vm_ring.drain()
        if len(ev):
            self._vm_events.append(ev)
        recs = self.probe.ring.drain()
        if len(recs) == 0:
            return
        early = recs["ts_ns"] < self.probe.armed_ns
        if early.any():  # entered while the probes were still being attached: partial evidence
            self.partial_at_start += int(early.sum())
            recs = recs[~early]
            if len(recs) == 0:
                return
        table, codes, tcodes = self._to_table(recs)
        self._account(recs, codes, tcodes)
        self._pending.append(table)
        self._pending_rows += len(recs)
        if self._pending_rows >= 500_000:
            self.flush()

    def flush(self) -> None:
        """Hand the pending records to the writer thread (one Parquet part)."""
        if self._vm_events:  # kswapd wake/sleep events (system-wide, rare)
            ev = np.concatenate(self._vm_events)
            self._vm_events = []
            self.kswapd_events += len(ev)
            if self.writer:
                self.writer.append_samples("kswapd_events", pd.DataFrame({
                    "ts_ns": ev["ts_ns"].astype(np.int64), "nid": ev["nid"].astype(np.int32),
                    "event": np.where(ev["kind"] == 0, "wake", "sleep")}))
        if not self._pending:
            return
        table = pa.concat_tables(self._pending, promote_options="permissive") if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_rows = [], 0
        if self.writer:
            self._start_write_thread()
            self._write_q.put(table)

    def _start_write_thread(self) -> None:
        if self._write_thread is None:
            self._write_thread = threading.Thread(target=self._write_loop, name="engramprof-writer", daemon=True)
            self._write_thread.start()

    def _write_loop(self) -> None:
        while True:
            table = self._write_q.get()
            if table is None:
                return
            try:
                self.writer.append_calls(table)
            except Exception as exc:  # disk full, ...: keep tracing, say so at the end
                self.notes.append(f"writing calls failed: {exc}")

    def _stop_write_thread(self) -> None:
        if self._write_thread is not None:
            self._write_q.put(None)
            self._write_thread.join()
            self._write_thread = None

    def _to_table(self, recs: np.ndarray) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """The records as an Arrow table, plus their path codes and tensor codes."""
        n = len(recs)
        fds = recs["fd"]
        ts = recs["ts_ns"].astype(np.int64)
        codes, stale = self.fds.resolve_codes(fds, ts, self.intern_path)
        tensor_codes = np.full(n, self._tensor_index[""], dtype=np.int32)
        rows = np.full(n, -1, dtype=np.int64)
        offsets = recs["offset"]
        for code in np.unique(codes).tolist():
            lay = self._layout_for(self._path_values[code])
            if lay is None:
                continue
            sel = codes == code
            idx, r = lay.locate(offsets[sel])
            tensor_codes[sel] = self._tensor_codes_for(code, lay)[idx]  # idx -1 -> last entry ("")
            rows[sel] = r
        self._fds_seen.update(np.unique(fds).tolist())
        path_dict = pa.array(self._path_values, type=pa.string())
        tensor_dict = pa.array(self._tensor_values, type=pa.string())
        cols = {
            "ts_ns": pa.array(ts),
            "dur_ns": pa.array(recs["dur_ns"].astype(np.int64)),
            "pid": pa.array(recs["pid"].astype(np.int32)),
            "tid": pa.array(recs["tid"].astype(np.int32)),
            "path": pa.DictionaryArray.from_arrays(pa.array(codes), path_dict),
            "offset": pa.array(offsets),
            "size": pa.array(recs["size"].astype(np.int64)),
            "ret": pa.array(recs["ret"]),
            "flags": pa.array(recs["flags"].astype(np.int64)),
            "syscall": pa.DictionaryArray.from_arrays(pa.array(np.minimum(recs["syscall"], 2).astype(np.int32)), _SYSCALL_DICT),
            "fd": pa.array(fds),
            "pages_added": pa.array(recs["pages_added"].astype(np.int32)),
            "bio_count": pa.array(recs["bio_count"].astype(np.int32)),
            "bio_ns": pa.array(recs["bio_ns"].astype(np.int64)),
            "reclaim_ns": pa.array(recs["reclaim_ns"].astype(np.int64)),
            "offcpu_ns": pa.array(recs["offcpu_ns"].astype(np.int64)),
            "runq_ns": pa.array(recs["runq_ns"].astype(np.int64)),
            "path_stale": pa.array(stale),
            "tensor": pa.DictionaryArray.from_arrays(pa.array(tensor_codes), tensor_dict),
            "row": pa.array(rows),
        }
        for c in self._missing_cols:  # not measured on this kernel: null, not a misleading 0
            cols[c] = pa.nulls(n, type=cols[c].type)
        return pa.Table.from_arrays(list(cols.values()), names=list(cols)), codes, tensor_codes

    def _tensor_codes_for(self, path_code: int, lay) -> np.ndarray:
        """Tensor code of each of a layout's live tensors, then "" (for offsets outside them);
        interned once per file."""
        codes = self._tensor_codes.get(path_code)
        if codes is None:
            codes = np.array([self._intern(self._tensor_index, self._tensor_values, t) for t in lay.live_names]
                             + [self._tensor_index[""]], dtype=np.int32)
            self._tensor_codes[path_code] = codes
        return codes

    def _layout_for(self, path: str):
        """The safetensors layout of path, or None (not safetensors / unreadable); cached."""
        if path in self._layouts:
            return self._layouts[path]
        lay = None
        if path:
            try:
                from engramprof import layout

                lay = layout.load(path)
            except Exception:  # not (or no longer) a readable safetensors file
                lay = None
        self._layouts[path] = lay
        return lay

    def _account(self, recs: np.ndarray, codes: np.ndarray, tcodes: np.ndarray) -> None:
        s = self.state
        dur = recs["dur_ns"].astype(np.int64)
        n = len(recs)
        is_eagain = recs["ret"] == EAGAIN
        nowait = int(((recs["flags"] & RWF_NOWAIT) != 0).sum())
        misses = recs["pages_added"]
        s.recorded += n
        s.eagain += int(is_eagain.sum())
        s.nowait += nowait
        s.pages_added += int(misses.sum())
        s.calls_with_misses += int((misses > 0).sum())
        s.bio_ns += int(recs["bio_ns"].sum())
        s.reclaim_ns += int(recs["reclaim_ns"].sum())
        s.offcpu_ns += int(recs["offcpu_ns"].sum())
        s.runq_ns += int(recs["runq_ns"].sum())
        idx = _lat_index(dur)  # once for both histograms
        s.hist.add(dur, idx)
        s.window_calls += n
        s.window_eagain += int(is_eagain.sum())
        s.window_nowait += nowait
        s.window_hist.add(dur, idx)
        self._add_stats(s.files, self._path_values, codes, dur, misses > 0, is_eagain)
        if (tcodes != 0).any():  # safetensors tensors (code 0 = no tensor)
            t = tcodes != 0
            self._add_stats(s.tensors, self._tensor_values, tcodes[t], dur[t], (misses > 0)[t], is_eagain[t])
        # the 10 slowest calls so far: only records beating the current 10th are looked at
        floor = int(s.slowest["dur_ns"].min()) if s.slowest is not None and len(s.slowest) >= 10 else -1
        top = np.nonzero(dur > floor)[0]
        if len(top) > 10:
            top = top[np.argpartition(dur[top], len(top) - 10)[-10:]]
        if len(top):
            self._merge_slowest(recs[top], dur[top], codes[top])

    @staticmethod
    def _add_stats(into: dict, names: list, codes: np.ndarray, dur: np.ndarray, miss: np.ndarray,
                   eagain: np.ndarray) -> None:
        """Per-name running totals (files, tensors) from one drain, vectorised over codes."""
        m = len(names)
        calls = np.bincount(codes, minlength=m)
        total = np.bincount(codes, weights=dur, minlength=m)
        nmiss = np.bincount(codes, weights=miss, minlength=m)
        neag = np.bincount(codes, weights=eagain, minlength=m)
        mx = np.zeros(m, dtype=np.int64)
        np.maximum.at(mx, codes, dur)
        for code in np.nonzero(calls)[0].tolist():
            fs = into.setdefault(names[code], FileStat())
            fs.calls += int(calls[code])
            fs.total_ns += int(total[code])
            fs.max_ns = max(fs.max_ns, int(mx[code]))
            fs.misses += int(nmiss[code])
            fs.eagain += int(neag[code])

    def _merge_slowest(self, r: np.ndarray, dur: np.ndarray, codes: np.ndarray) -> None:
        s = self.state
        names, rws = [], []
        for c, off in zip(codes.tolist(), r["offset"].tolist()):
            lay = self._layout_for(self._path_values[c])
            t, w = lay.map_offsets(np.array([off])) if lay is not None else ([""], [-1])
            names.append(t[0])
            rws.append(int(w[0]))
        cand = pd.DataFrame({
            "ts_ns": r["ts_ns"].astype(np.int64), "dur_ns": dur, "tid": r["tid"].astype(np.int64),
            "path": np.array([self._path_values[c] for c in codes.tolist()], dtype=object),
            "offset": r["offset"], "size": r["size"].astype(np.int64), "ret": r["ret"],
            "pages_added": r["pages_added"].astype(np.int64), "bio_count": r["bio_count"].astype(np.int64),
            "bio_ns": r["bio_ns"].astype(np.int64), "reclaim_ns": r["reclaim_ns"].astype(np.int64),
            "offcpu_ns": r["offcpu_ns"].astype(np.int64), "runq_ns": r["runq_ns"].astype(np.int64),
            "tensor": np.array(names, dtype=object), "row": np.array(rws, dtype=np.int64),
        })
        s.slowest = (pd.concat([s.slowest, cand], ignore_index=True) if s.slowest is not None else cand).nlargest(10, "dur_ns")

    def _reset_window(self) -> None:
        s = self.state
        s.window_calls = s.window_eagain = s.window_nowait = 0
        s.window_hist = LatencyHist()

    def _write_hist_table(self, hists: dict[int, np.ndarray]) -> None:
        rows = []
        for fdslot, counts in hists.items():
            path = self.fds.history.get(fdslot, [(0, "")])[-1][1]
            for slot in np.nonzero(counts)[0]:
                rows.append((fdslot, path, int(slot), 1 << int(slot), int(counts[slot])))
        df = pd.DataFrame(rows, columns=["fd_slot", "path", "log2_slot", "ns_lower", "count"])
        self.writer.write_table("latency_log2_by_fd", df)

    # ---- summary ----------------------------------------------------------------------
    def summary(self, totals: dict, hists: dict, end_ns: int, bio_hist: np.ndarray | None = None) -> dict:
        s = self.state
        dur_s = max((end_ns - s.started_ns) / 1e9, 1e-9)
        calls = int(totals.get("calls", s.recorded))
        lost = int(totals.get("lost_records", 0))
        filtered = int(totals.get("filtered", 0))
        lat = {"p50": _us(s.hist.quantile(0.5)), "p99": _us(s.hist.quantile(0.99)), "max": _us(s.hist.max_ns)}
        lat_source = "records"
        if lost or filtered:
            kh = sum(hists.values()) if hists else None
            if kh is not None and kh.sum():
                lat = {"p50": _us(_log2_quantile(kh, 0.5)), "p99": _us(_log2_quantile(kh, 0.99)),
                       "max": _us(totals.get("max_ns", 0))}
                lat_source = "kernel log2 histogram (records were lost or filtered)"
        files = sorted(s.files.items(), key=lambda kv: -kv[1].total_ns)
        slow = []
        if s.slowest is not None:
            for r in s.slowest.itertuples():
                slow.append({"ts_ns": int(r.ts_ns), "tid": int(r.tid), "path": r.path, "offset": int(r.offset),
                             "size": int(r.size), "ret": int(r.ret), "dur_us": round(r.dur_ns / 1e3, 1),
                             "pages_added": int(r.pages_added), "bio_count": int(r.bio_count),
                             "bio_us": round(r.bio_ns / 1e3, 1), "reclaim_us": round(r.reclaim_ns / 1e3, 1),
                             "offcpu_us": round(r.offcpu_ns / 1e3, 1), "runq_us": round(r.runq_ns / 1e3, 1)})
        out = {
            "pid": self.pid,
            "tid": self.tid or None,
            "duration_s": round(dur_s, 3),
            "end_reason": self.end_reason,
            "calls": calls,
            "calls_per_s": round(calls / dur_s, 1),
            "recorded": s.recorded,
            "lost_records": lost,
            "filtered_short": filtered,
            "partial_at_start": self.partial_at_start,
            "kswapd_events": self.kswapd_events,
            "kswapd_events_lost": int(totals.get("vm_events_lost", 0)),
            "eagain": int(totals.get("eagain", s.eagain)),
            "eagain_rate": round(int(totals.get("eagain", s.eagain)) / calls, 4) if calls else 0.0,
            "nowait_share": round(int(totals.get("nowait", s.nowait)) / calls, 4) if calls else 0.0,
            "latency_us": lat,
            "latency_source": lat_source,
            "evidence": {
                "calls_with_misses": s.calls_with_misses,
                "pages_added": s.pages_added,
                "bio_ms": round(s.bio_ns / 1e6, 3),
                "reclaim_ms": round(s.reclaim_ns / 1e6, 3),
                "offcpu_ms": round(s.offcpu_ns / 1e6, 3),
                "runq_ms": round(s.runq_ns / 1e6, 3),
            },
            "device": _bio_summary(bio_hist),
            "files": [{"path": p, "calls": f.calls, "total_ms": round(f.total_ns / 1e6, 3),
                       "max_us": round(f.max_ns / 1e3, 1), "calls_with_misses": f.misses, "eagain": f.eagain}
                      for p, f in files[:10]],
            "tensors": [{"tensor": t, "calls": f.calls, "total_ms": round(f.total_ns / 1e6, 3),
                         "max_us": round(f.max_ns / 1e3, 1), "calls_with_misses": f.misses, "eagain": f.eagain}
                        for t, f in sorted(s.tensors.items(), key=lambda kv: -kv[1].total_ns)[:10]],
            "slowest": slow,
            "missing_evidence": self.plan.missing_columns if self.probe else [],
            "syscall_hook": "raw_syscalls" if self.plan.raw_syscalls else "syscalls tracepoints",
            "output": self.output,
            "notes": self.notes,
        }
        if self.sampler is not None:
            try:
                out["context"] = self.sampler.summary()
            except Exception as exc:
                self.notes.append(f"sampler summary failed: {exc}")
        return out


def _bio_summary(h: np.ndarray | None) -> dict | None:
    """Device service (bio queue -> complete) of the target's bios, from the kernel histogram."""
    if h is None or not h.sum():
        return None
    return {"bios": int(h.sum()), "p50_us_lower": _us(_log2_quantile(h, 0.5)),
            "p99_us_lower": _us(_log2_quantile(h, 0.99)),
            "note": "log2 buckets: true value is between the figure and twice it"}


def _us(ns: float) -> float | None:
    return None if ns != ns else round(ns / 1e3, 2)


def _log2_quantile(counts: np.ndarray, q: float) -> float:
    c = np.cumsum(counts)
    i = int(np.searchsorted(c, q * c[-1], side="left"))
    return float(1 << i)  # the lower edge of log2 slot i, which holds [2^i, 2^(i+1)) ns


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return shlex.join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ""
