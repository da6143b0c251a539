"""The exporter's run: listen, load the probe, keep the targets in step, analyse each window,
serve /metrics until SIGTERM (or SIGINT).

The listener is opened before the probe is loaded, so a port in use is refused at once.  The
main thread does the periodic work once a second (target maps, ring drain, live targets) and
the window analysis; prometheus_client's HTTP thread calls the collector, which reads the
maps under the same lock.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from engramprof.errors import UserError
from engramprof.export import probe as export_probe
from engramprof.export.files import FileNames
from engramprof.export.metrics import ExporterCollector
from engramprof.export.options import Listen
from engramprof.export.window import WindowAnalyser
from engramprof.target.process import pid_state

#: reads recorded per window for its analysis (the probe's sample budget): 96 bytes each in the ring,
#: about 0.6 KiB each while the analysis runs (benchmarks/RESULTS.md "Exporter cost")
DEFAULT_WINDOW_SAMPLE = 25_000


@dataclass
class ExportSettings:
    selection: object
    listen: Listen
    window_s: float
    labels: dict
    markers: str | None
    window_sample: int = DEFAULT_WINDOW_SAMPLE
    hook: str = "auto"


def _alive(pid: int) -> bool:
    st = pid_state(pid)
    return st is not None and st not in ("Z", "X")


def _cgroup_procs(dirs) -> set[int]:
    out = set()
    for c in dirs:
        for d, _sub, _files in os.walk(c):
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out.update(int(x) for x in f.read().split())
            except (OSError, ValueError):
                continue
    return out


def read_vmstat() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                k, _, v = line.partition(" ")
                out[k] = int(v)
    except (OSError, ValueError):
        pass
    return out


class ExportState:
    """What the collector reads: the probe's maps and the window totals, under one lock."""

    def __init__(self, settings: ExportSettings, probe, analyser: WindowAnalyser):
        self.settings = settings
        self.probe = probe
        self.analyser = analyser
        self.lock = threading.Lock()
        sel = settings.selection
        self.files = FileNames(sel, self.target_pids)
        self._wanted = {(d, i) for d, i, _p in sel.files}
        self._live: int | None = None

    # ---- targets ---------------------------------------------------------------------------
    def target_pids(self) -> set[int]:
        sel = self.settings.selection
        pids = {p for p in sel.pids if _alive(p)}
        if self.probe is not None and self.probe.targets.tgids is not None:
            pids |= {p for p in self.probe.targets.live_tgids() if _alive(p)}
        if sel.cgroups_v2 or sel.cgroups_v1:
            pids |= _cgroup_procs(sel.cgroups_v2 + sel.cgroups_v1)
        return pids

    def refresh_targets(self) -> None:
        sel = self.settings.selection
        self.probe.sync_targets()
        self._live = None if not (sel.pids or sel.cgroups_v2 or sel.cgroups_v1) else len(self.target_pids())

    # ---- what the collector asks -----------------------------------------------------------
    @property
    def fault_latency(self) -> bool:
        """Faults are spans with a latency (probes/export.bpf.c FAULT_SPANS)."""
        f = self.probe.plan.features
        return bool(self.probe.plan.raw_syscalls and f.get("HAVE_PFU") and f.get("HAVE_FAULT"))

    def live_targets(self):
        return self._live

    def wanted_file(self, dev: int, ino: int) -> bool:
        return not self._wanted or (dev, ino) in self._wanted

    def file_name(self, dev: int, ino: int) -> str:
        return self.files.name(dev, ino)

    def snapshot(self) -> dict:
        """The probe's maps, read together, and the wall-clock time they were read at: the
        samples carry it, so a scrape the host was slow to serve is not misdated."""
        with self.lock:
            p = self.probe
            snap = {"stats": p.read_stats(), "totals": p.totals(), "bio": p.bio_histogram(),
                    "bio_seconds": p.bio_seconds(), "skipped": p.skipped_runs()}
        snap["at"] = time.time()
        return snap

    def name_new_files(self) -> None:
        """Resolve the file of each key while its reader is alive (called once a second)."""
        for k in self.probe.file_keys():
            if k[1]:
                self.files.name(k[0], k[1])

    def selection_waiting(self) -> list[str]:
        sel = self.settings.selection
        out = [f"pid {p} is not running: waiting (engramprof_target_waiting)" for p in sel.pids if not _alive(p)]
        return out + sel.waiting()

    def window_totals(self):
        return self.analyser.totals

    def vmstat(self) -> dict[str, int]:
        vm = read_vmstat()
        evicted = vm.get("pgsteal_file")
        if evicted is None:
            evicted = sum(v for k, v in vm.items() if k.startswith("pgsteal_"))
        return {"pgsteal_file": evicted, "workingset_refault_file": vm.get("workingset_refault_file", 0)}


def _serve(listen: Listen, registry):
    try:
        server, thread = start_http_server(listen.port, addr=listen.host, registry=registry)
    except OSError as exc:
        why = "port in use" if exc.errno == 98 else (exc.strerror or str(exc))
        raise UserError(f"--listen {listen.host}:{listen.port}: cannot listen: {why}", code=2) from None
    return server


def run(settings: ExportSettings) -> int:
    registry = CollectorRegistry()
    analyser = WindowAnalyser(settings.markers)
    state = ExportState(settings, None, analyser)
    analyser.lock = state.lock
    server = _serve(settings.listen, registry)  # before the probe: a port in use is refused at once
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        p = export_probe.ExportProbe(export_probe.plan(export_probe.ExportProbeConfig(
            selection=settings.selection, syscall_hook=settings.hook)))
    except BaseException:
        server.shutdown()
        raise
    state.probe = p
    analyser.read_paths = list(p.read_paths())
    if "libaio" in p.requests:
        analyser.libaio_bio = bool(p.requests["libaio"].plan.features.get("HAVE_BIO"))
    try:
        state.refresh_targets()
        registry.register(ExporterCollector(state, settings.labels))
        ProcessCollector(namespace="engramprof_exporter", registry=registry)
        _loop(settings, state, p, stop)
    finally:
        server.shutdown()
        with state.lock:
            p.close()
    return 0


def _loop(settings: ExportSettings, state: ExportState, p, stop: threading.Event) -> None:
    window_ns = int(settings.window_s * 1e9)
    with state.lock:
        p.set_sample_budget(settings.window_sample)
        unsampled0 = p.unsampled()
    start = time.monotonic_ns()
    print(f"Exporting {settings.selection.describe()} on {settings.listen.url} (window {settings.window_s:g} s); "
          "SIGTERM ends", file=sys.stderr, flush=True)
    for w in state.selection_waiting():
        print(f"engramprof export: {w}", file=sys.stderr, flush=True)
    parts: list[np.ndarray] = []
    request_parts: dict[str, list[np.ndarray]] = {}
    while not stop.wait(1.0):
        now = time.monotonic_ns()
        with state.lock:
            state.refresh_targets()
            state.name_new_files()
            parts.append(p.drain())
            for kind, recs in p.drain_requests().items():
                request_parts.setdefault(kind, []).append(recs)
            if now - start < window_ns:
                continue
            unsampled1 = p.unsampled()
            p.set_sample_budget(settings.window_sample)
        recs = np.concatenate(parts) if parts else np.empty(0, dtype=p.record_dtype)
        requests = {kind: np.concatenate(rs) for kind, rs in request_parts.items() if rs}
        parts, request_parts = [], {}
        spent = {k: unsampled1[k] > unsampled0.get(k, 0) for k in unsampled1}
        state.analyser.run(recs, start, now, budget_spent=spent.pop("records"), requests=requests,
                           requests_spent=spent)
        del recs, requests
        export_probe.release_freed_memory()  # the analysis's transient arrays: back to the kernel
        unsampled0, start = unsampled1, now
