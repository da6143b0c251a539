"""The exporter's metric families, built at each scrape from the probe's maps and the window
totals (prometheus_client collectors: the library writes the text format).

Label sets are bounded: ``file`` (one per file the targets read: table files, at most the
probe's MAX_FILES), ``kind`` (syscall, fault, io_uring, libaio), ``cause`` (6), ``verdict`` (5), ``what`` and
``result`` (a few fixed values), plus the constant --label pairs.  No pid, tid or offset label.
"""
from __future__ import annotations

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from engramprof.analysis.verdicts import CAUSES, VERDICTS
from engramprof.export.probe import REQUEST_PATHS
from engramprof.export.window import BATCH_BUCKETS

NS = 1e-9
#: exported latency buckets: upper bounds 2^FIRST .. 2^LAST ns (~1 µs .. ~34 s), then +Inf
FIRST_BUCKET_LOG2, LAST_BUCKET_LOG2 = 10, 35
#: (field of the probe's read_stats, metric name, help, scale)
READ_COUNTERS = (
    ("reads", "engramprof_read_calls_total", "Reads: syscall reads (preadv2/preadv/pread64, read/readv), "
     "file-backed page faults, io_uring read requests or libaio read iocbs, per file and kind", 1),
    ("bytes", "engramprof_read_bytes_total", "Bytes returned by syscall reads", 1),
    ("eagain", "engramprof_read_eagain_total", "Syscall reads that returned EAGAIN (RWF_NOWAIT misses)", 1),
    ("misses", "engramprof_read_misses_total", "Reads that inserted at least one page into the page cache", 1),
    ("pages_added", "engramprof_read_pages_inserted_total", "Pages inserted into the page cache by the reading "
     "thread during its reads", 1),
    ("bio_count", "engramprof_read_bios_total", "Block I/Os (bios) queued by the reading thread during syscall reads",
     1),
    ("bio_ns", "engramprof_read_bio_seconds_total", "Queue -> complete time of the bios a syscall read waited for", NS),
    ("reclaim_ns", "engramprof_read_reclaim_seconds_total", "Direct and memcg reclaim time inside syscall reads", NS),
    ("offcpu_ns", "engramprof_read_offcpu_seconds_total", "Time the reading thread was switched out inside its reads "
     "(includes run-queue time)", NS),
    ("runq_ns", "engramprof_read_runqueue_seconds_total", "Of the off-CPU time inside reads, the time spent runnable, "
     "waiting for a CPU", NS),
)


def log2_histogram(counts, sum_seconds: float):
    """Cumulative (le, count) buckets of log2(ns) slots (slot i: [2^i, 2^(i+1)) ns)."""
    cum = counts.cumsum()
    buckets = [(f"{(1 << (i + 1)) / 1e9:.12g}", int(cum[i])) for i in range(FIRST_BUCKET_LOG2 - 1, LAST_BUCKET_LOG2)]
    buckets.append(("+Inf", int(cum[-1])))
    return buckets, sum_seconds


class ExporterCollector:
    """One collector for every engramprof_* family; ``state`` supplies the snapshots."""

    def __init__(self, state, labels: dict[str, str]):
        self.state = state
        self.label_names = list(labels)
        self.label_values = list(labels.values())

    def _f(self, cls, name, doc, extra=(), **kw):
        return cls(name.removesuffix("_total") if cls is CounterMetricFamily else name, doc,
                   labels=self.label_names + list(extra), **kw)

    def describe(self):
        return []  # collected on demand (no describe-time scrape of the maps)

    def collect(self):
        s = self.state
        lv = self.label_values
        snap = s.snapshot()
        at = snap["at"]
        stats = snap["stats"]
        fams = {name: self._f(CounterMetricFamily, name, doc, ("file", "kind")) for _, name, doc, _ in READ_COUNTERS}
        lat = self._f(HistogramMetricFamily, "engramprof_read_latency_seconds",
                      "Latency of reads: a syscall's entry to exit; a page fault's entry to its last in-fault event; "
                      "an io_uring request's submit to its completion; a libaio iocb's submit to its reap "
                      "(log2 buckets kept in the kernel)", ("file", "kind"))
        for (dev, ino, kind), row in sorted(stats.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
            if not s.wanted_file(dev, ino):
                continue
            labels = lv + [s.file_name(dev, ino), kind]
            for field, name, _doc, scale in READ_COUNTERS:
                fams[name].add_metric(labels, row[field] * scale, timestamp=at)
            if kind != "fault" or s.fault_latency:
                buckets, total = log2_histogram(row["latency_log2"], row["sum_ns"] * NS)
                lat.add_metric(labels, buckets, total, timestamp=at)
        yield from fams.values()
        yield lat
        bio = snap["bio"]
        h = self._f(HistogramMetricFamily, "engramprof_bio_latency_seconds",
                    "Queue -> complete of every bio the targets queued inside syscall reads (all files)")
        h.add_metric(lv, *log2_histogram(bio, snap["bio_seconds"]), timestamp=at)
        yield h
        yield from self._totals(s, snap["totals"], at)
        yield from self._skipped(snap.get("skipped"), at)
        yield from self._windows(s)
        yield from self._system(s)

    def _skipped(self, skipped: dict | None, at):
        """Runs of the probe's programs the kernel skipped, per hook (none: not counted here)."""
        if skipped is None:
            return
        fam = self._f(CounterMetricFamily, "engramprof_probe_skipped_runs_total",
                      "Runs of the probe's programs the kernel skipped because another BPF program was running on "
                      "that CPU (bpf_prog_info.recursion_misses), per hook: what they would have seen is not in the "
                      "other counters (a skipped block completion: its bio's time and slot)", ("hook",))
        for hook, n in sorted(skipped.items()):
            fam.add_metric(self.label_values + [hook], n, timestamp=at)
        yield fam

    def _totals(self, s, tot, at):
        lv = self.label_values
        lost = self._f(CounterMetricFamily, "engramprof_lost_events_total",
                       "Events the probe could not keep: a window sample record dropped (ring full), a read not "
                       "kept per file (the file map full; still in engramprof_probe_reads_total)", ("what",))
        lost.add_metric(lv + ["sample-ring-full"], tot["sample_lost"], timestamp=at)
        lost.add_metric(lv + ["file-map-full"], tot["files_overflow"], timestamp=at)
        yield lost
        untracked = self._f(CounterMetricFamily, "engramprof_bios_untracked_total",
                            "Bios queued inside syscall reads whose queue -> complete time is not counted: their "
                            "slot of the probe's in-flight bio table was held by another bio (in "
                            "engramprof_read_bios_total, not in engramprof_read_bio_seconds_total)")
        untracked.add_metric(lv, tot["bios_untracked"], timestamp=at)
        yield untracked
        reads = self._f(CounterMetricFamily, "engramprof_probe_reads_total",
                        "Every read the probe saw, by kind (files beyond the file map included)", ("kind",))
        reads.add_metric(lv + ["syscall"], tot["syscall_reads"], timestamp=at)
        reads.add_metric(lv + ["fault"], tot["faults"], timestamp=at)
        for kind in REQUEST_PATHS:  # a request path traced (the export probe's totals say)
            if f"reads_{kind}" in tot:
                reads.add_metric(lv + [kind], tot[f"reads_{kind}"], timestamp=at)
        yield reads
        smp = self._f(CounterMetricFamily, "engramprof_window_sampled_reads_total",
                      "Syscall reads recorded for the window analysis (result=sampled) or only aggregated because "
                      "the window's sample budget was spent (result=unsampled)", ("result",))
        smp.add_metric(lv + ["sampled"], tot["sampled"], timestamp=at)
        smp.add_metric(lv + ["unsampled"], tot["unsampled"], timestamp=at)
        yield smp
        live = s.live_targets()
        if live is None:  # --file alone: whichever process reads the files
            return
        g = self._f(GaugeMetricFamily, "engramprof_target_processes", "Target processes alive now")
        g.add_metric(lv, live)
        yield g
        g = self._f(GaugeMetricFamily, "engramprof_target_waiting",
                    "1 while no target process is alive (a --pid that exited, an empty cgroup): the exporter waits")
        g.add_metric(lv, 1 if live == 0 else 0)
        yield g

    def _windows(self, s):
        w = s.window_totals()
        lv = self.label_values
        c = self._f(CounterMetricFamily, "engramprof_batch_cause_seconds_total",
                    "Batch wall time split into causes by the window analysis (docs/model.md)", ("cause",))
        for cause in CAUSES:
            c.add_metric(lv + [cause], w.cause_seconds[cause])
        yield c
        h = self._f(HistogramMetricFamily, "engramprof_batch_seconds", "Wall time of the analysed batches")
        h.add_metric(lv, [(f"{b:g}", int(n)) for b, n in zip(BATCH_BUCKETS, w.batch_buckets)]
                     + [("+Inf", w.batch_count)], w.batch_sum)
        yield h
        g = self._f(GaugeMetricFamily, "engramprof_window_verdict",
                    "The last window's verdict: 1 for it, 0 for the others (all 0: no batches in it)", ("verdict",))
        for v in VERDICTS:
            g.add_metric(lv + [v], 1 if w.verdict == v else 0)
        yield g
        a = self._f(CounterMetricFamily, "engramprof_window_analyses_total",
                    "Window analyses by result (ok, no-batches, error)", ("result",))
        for r, n in w.analyses.items():
            a.add_metric(lv + [r], n)
        yield a
        g = self._f(GaugeMetricFamily, "engramprof_window_coverage_ratio",
                    "Share of the last window the analysis covered (below 1: the sample budget ran out)")
        g.add_metric(lv, w.coverage if w.coverage is not None else 0.0)
        yield g
        g = self._f(GaugeMetricFamily, "engramprof_window_batches", "Batches analysed in the last window")
        g.add_metric(lv, w.last_batches)
        yield g

    def _system(self, s):
        vm = s.vmstat()
        lv = self.label_values
        c = self._f(CounterMetricFamily, "engramprof_vmstat_file_pages_reclaimed_total",
                    "Page-cache pages evicted by reclaim, system-wide (/proc/vmstat pgsteal_file)")
        c.add_metric(lv, vm.get("pgsteal_file", 0))
        yield c
        c = self._f(CounterMetricFamily, "engramprof_vmstat_file_refaults_total",
                    "File pages read again soon after eviction, system-wide (/proc/vmstat workingset_refault_file)")
        c.add_metric(lv, vm.get("workingset_refault_file", 0))
        yield c
