"""The Engram-shaped workload: model steps that each read one batch of table rows.

A step looks up ``tokens`` token positions.  Token ids are drawn with Zipf popularity
(rank k has weight 1/k**zipf over a 129280-token vocabulary); for every position and each
of ``heads`` hash heads, the n-gram ending there (bigrams for even heads, trigrams for odd
ones) is hashed to a table row, separately per Engram layer.  A step is one batch of
2 jobs per layer (the weight rows and the scale rows of the same row ids), so a 2-layer
table gives 4 logical jobs of ``tokens * heads`` rows each: decode (a few tokens) is tens
of rows, prefill (thousands of tokens) tens of thousands.

The row plan depends only on (table shape, tokens, heads, zipf, seed), so
:func:`planned_reads` gives the exact (offset, size) reads of every batch without running.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import numpy.ma  # noqa: F401  (np.unique imports it on first use: its .pyc reads would be read() events
#                  of a traced run, beside the table's; imported here, before the run starts)

from engramprof.errors import UserError
from engramprof.lab import readers, table
from engramprof.markers import MarkerWriter
from engramprof.tables import safetensors as layout

VOCAB = 129_280
WARM_CHUNK = 4 << 20
WARM_PASSES = 2  # the second read of a page moves it to the active list (lab.workload.warm)
_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M2
    x = x ^ (x >> np.uint64(27))
    x = x * _M3
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class JobSpec:
    tensor: str
    offsets: np.ndarray  # int64 file offsets, one per requested row (duplicates kept)
    row_bytes: int


class Plan:
    """Generates the row requests of each step, deterministically from ``seed``."""

    def __init__(self, lay: layout.Layout, tokens: int, heads: int, zipf: float, seed: int,
                 shard: tuple[int, int] | None = None):
        if tokens < 1 or heads < 1:
            raise UserError("tokens and heads must be at least 1")
        if zipf < 0:
            raise UserError("zipf must be >= 0 (0 is uniform)")
        self.layers = table.engram_layers(lay)
        if not self.layers:
            raise UserError(f"{lay.path}: no Engram layers (layers.N.engram.embed.weight/scale)")
        self.tensors = [(lay.tensor(table.weight_name(L)), lay.tensor(table.scale_name(L)))
                        for L in self.layers]
        for w, s in self.tensors:
            if w.rows != s.rows or w.row_bytes <= 0 or s.row_bytes <= 0:
                raise UserError(f"{lay.path}: {w.name} and {s.name} do not have matching rows")
        self.tokens, self.heads = tokens, heads
        # shard (i, n): only rows [i * rows / n, (i + 1) * rows / n) of each tensor (a rank's own)
        self.shard = shard
        if shard is not None and (not 0 <= shard[0] < shard[1] or min(w.rows for w, _ in self.tensors) < shard[1]):
            raise UserError(f"{lay.path}: cannot split {min(w.rows for w, _ in self.tensors)} rows into {shard[1]} shards")
        cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1, dtype=np.float64) ** zipf)
        self._cdf = cdf / cdf[-1]
        self._rng = np.random.default_rng(seed)
        self._perm = self._rng.permutation(VOCAB).astype(np.uint64)  # rank -> token id
        self._salts = [np.uint64(1 + 0x1000 * L) for L in self.layers]

    def _token_ids(self, n: int) -> np.ndarray:
        ranks = np.searchsorted(self._cdf, self._rng.random(n), side="right")
        return self._perm[np.minimum(ranks, VOCAB - 1)]

    def next_batch(self) -> list[JobSpec]:
        t = self.tokens
        ids = self._token_ids(t + 2)
        bigram = ids[2:] * _M1 ^ ids[1:-1]
        trigram = (bigram * _M1) ^ ids[:-2]
        heads = np.arange(self.heads, dtype=np.uint64)
        grams = np.where(heads % np.uint64(2) == 0, bigram[:, None], trigram[:, None])
        specs = []
        for (w, s), salt in zip(self.tensors, self._salts):
            keys = _mix(grams ^ ((heads + salt) * _M2)[None, :]).ravel()
            if self.shard is None:
                rows = (keys % np.uint64(w.rows)).astype(np.int64)
            else:
                per = w.rows // self.shard[1]
                rows = self.shard[0] * per + (keys % np.uint64(per)).astype(np.int64)
            specs.append(JobSpec(w.name, w.start + rows * w.row_bytes, w.row_bytes))
            specs.append(JobSpec(s.name, s.start + rows * s.row_bytes, s.row_bytes))
        return specs

    def batches(self, steps: int) -> Iterator[list[JobSpec]]:
        for _ in range(steps):
            yield self.next_batch()


def batch_reads(specs: list[JobSpec]) -> list[tuple[int, int]]:
    """The exact (offset, size) row reads of one batch: each job's rows, de-duplicated."""
    out = []
    for spec in specs:
        out.extend((int(o), spec.row_bytes) for o in np.unique(spec.offsets))
    return out


def planned_reads(table_path: str | os.PathLike, steps: int, tokens: int = 4, heads: int = 6,
                  zipf: float = 1.1, seed: int = 0) -> list[list[tuple[int, int]]]:
    """Per batch, the (offset, size) reads that ``run_workload`` with the same arguments makes."""
    plan = Plan(layout.load(table_path), tokens, heads, zipf, seed)
    return [batch_reads(b) for b in plan.batches(steps)]


def warm(path: str | os.PathLike) -> int:
    """Read the whole file twice, sequentially, with read(2), before any trace starts.
    POSIX_FADV_RANDOM avoids leaving readahead markers behind.  The second pass is what makes the
    table warm the way a served table is: a page read once sits on the kernel's inactive list and
    is the first to go when the host reclaims page cache (a tracer compiling its probes on a host
    full of once-read files: CI's warm io_uring run missed its table, evicted by kswapd, and was
    rightly called reclaim); read again, it is moved to the active list.  Returns the file's size."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for _ in range(WARM_PASSES):
            total = 0
            os.lseek(fd, 0, os.SEEK_SET)
            while chunk := os.read(fd, WARM_CHUNK):
                total += len(chunk)
        return total
    finally:
        os.close(fd)


def evict(path: str | os.PathLike) -> None:
    """Drop the file's pages from the page cache (written back first: dirty pages stay)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass
class _Tally:
    """What the steps of a run add up to."""

    totals: readers.ReadStats = field(default_factory=readers.ReadStats)
    batch_ns: list[int] = field(default_factory=list)
    rows: int = 0
    unique: int = 0  # rows read: summed over jobs, each job's rows de-duplicated
    distinct: set = field(default_factory=set)  # file offsets of every row read in the run
    reads: list = field(default_factory=list)  # per batch (offset, size) list, with record_reads
    hints: int = 0  # prefetch hint calls made (--prefetch)
    hinted_steps: int = 0  # steps whose rows were hinted


def run_workload(
    table_path: str | os.PathLike,
    reader: str = "pool",
    *,
    steps: int | None = None,
    duration: float | None = None,
    tokens: int = 4,
    heads: int = 6,
    gap_ms: float = 0.0,
    zipf: float = 1.1,
    seed: int = 0,
    markers: str | os.PathLike | None = None,
    cache: str | None = None,  # "warm" | "cold" | None
    start_delay: float = 0.0,
    threads: int = 32,
    stop: threading.Event | None = None,
    record_reads: bool = False,
    on_ready: Callable[[], None] | None = None,
    preadv: readers.Preadv | None = None,
    start_event: threading.Event | None = None,
    random: bool = True,
    prefetch: str | None = None,
    prefetch_lead: int = 1,
    shard: tuple[int, int] | None = None,
    marker_extra: dict | None = None,
    marker_flush_s: float = 1.0,
    keep_batch_ns: bool = False,
    keep_distinct: bool = False,
) -> dict:
    """Run steps until ``steps`` batches, ``duration`` seconds or ``stop`` is set.

    Default: 200 steps when neither ``steps`` nor ``duration`` is given.  Returns the
    summary dict (``steps, rows, unique_rows, calls, eagain, fallback_rows, batch_ms{p50,p99,
    mean,max}, reader, pid, table, ...``); with ``record_reads`` also ``reads``: per batch the
    (offset, size) list of :func:`batch_reads`.  ``random=False``: no POSIX_FADV_RANDOM /
    MADV_RANDOM (readahead on); ``prefetch="willneed"``: before reading step i the reader hints
    the rows of step i + ``prefetch_lead`` with WILLNEED (0: its own rows, just before reading
    them; steps before the lead are not hinted).  ``shard`` (i, n): only the i-th of n equal row
    ranges of each tensor; ``marker_extra``: keys added to every marker (a rank's ``pid``,
    ``rank``); ``marker_flush_s`` 0: one write(2) per marker line (several processes appending
    to one file); ``keep_batch_ns``: also ``batch_ns``, every batch's time; ``keep_distinct``:
    also ``distinct_offsets``, the sorted file offsets of the distinct rows read (a rank's, for
    its parent's distinct rows over every rank: engramprof/lab/ranks.py).
    """
    if steps is None and duration is None:
        steps = 200
    if (steps is not None and steps < 0) or (duration is not None and duration < 0) or gap_ms < 0 \
            or start_delay < 0:
        raise UserError("steps, duration, gap_ms and start_delay must be >= 0")
    if cache not in (None, "warm", "cold"):
        raise ValueError(f"cache must be 'warm', 'cold' or None, not {cache!r}")
    path = os.path.realpath(table_path)
    plan = Plan(layout.load(path), tokens, heads, zipf, seed, shard=shard)
    stop = stop or threading.Event()
    try:
        rdr = readers.make_reader(reader, threads, preadv=preadv)
    except ValueError as exc:  # also ReaderUnavailable: io_uring disabled, no liburing
        raise UserError(str(exc), getattr(exc, "code", 2)) from None
    writer = MarkerWriter(markers, flush_s=marker_flush_s) if markers is not None else None
    if prefetch not in (None, "willneed") or prefetch_lead < 0:
        raise UserError(f"prefetch must be 'willneed' with a lead >= 0, not {prefetch!r} / {prefetch_lead}")
    rdr.random = random
    fd = readers.open_table(path, random=random)
    try:
        if cache == "warm":
            warm(path)
        elif cache == "cold":
            evict(path)
        # the mmap readers map the table here, not inside a step (warm: every page mapped too);
        # the O_DIRECT readers open their O_DIRECT fd (a filesystem without O_DIRECT: one line)
        try:
            rdr.prepare(fd, populate=cache == "warm")
        except readers.ReaderUnavailable as exc:
            raise UserError(str(exc), exc.code) from None
        if on_ready:
            on_ready()
        if start_delay:  # ends early when start_event (or stop) is set
            (start_event if start_event is not None else stop).wait(start_delay)
        t0 = time.monotonic()
        tally = _run_steps(plan, rdr, fd, writer, reader, stop, steps,
                           t0 + duration if duration is not None else None, gap_ms, record_reads,
                           prefetch_lead=prefetch_lead if prefetch else None, marker_extra=marker_extra)
        elapsed = time.monotonic() - t0
    finally:
        os.close(fd)
        rdr.close()
        if writer is not None:
            writer.close()
    result = _summary(tally, reader=reader, pid=os.getpid(), table=path, tokens=tokens, heads=heads,
                      jobs_per_step=2 * len(plan.layers), cache=cache, elapsed_s=round(elapsed, 3), random=random)
    if prefetch:
        result["prefetch"] = {"advice": prefetch, "lead": prefetch_lead, "hints": tally.hints,
                              "hinted_steps": tally.hinted_steps}
    if record_reads:
        result["reads"] = tally.reads
    if keep_batch_ns:
        result["batch_ns"] = tally.batch_ns
    if keep_distinct:
        result["distinct_offsets"] = sorted(tally.distinct)
    return result


class _Ahead:
    """The plan's batches generated ahead of the reader (for prefetch hints with a lead)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.queue: list[list[JobSpec]] = []

    def at(self, k: int) -> list[JobSpec]:
        """The batch ``k`` steps after the next one to read (0: the next one)."""
        while len(self.queue) <= k:
            self.queue.append(self.plan.next_batch())
        return self.queue[k]

    def next_batch(self) -> list[JobSpec]:
        self.at(0)
        return self.queue.pop(0)


def _run_steps(plan: Plan, rdr, fd: int, writer: MarkerWriter | None, reader: str, stop: threading.Event,
               steps: int | None, deadline: float | None, gap_ms: float, record_reads: bool,
               prefetch_lead: int | None = None, marker_extra: dict | None = None) -> _Tally:
    """The step loop: one batch per step, a marker each, ``gap_ms`` between steps; with
    ``prefetch_lead``, the WILLNEED hints of the batch that many steps ahead before each batch."""
    tally = _Tally()
    if prefetch_lead is not None:
        plan = _Ahead(plan)
    while not stop.is_set():
        if steps is not None and len(tally.batch_ns) >= steps:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        if tally.batch_ns and gap_ms:
            if stop.wait(gap_ms / 1000):
                break
        if prefetch_lead is not None and (steps is None or len(tally.batch_ns) + prefetch_lead < steps):
            for s in plan.at(prefetch_lead):  # not timed: the hint belongs to an earlier step
                tally.hints += rdr.hint(fd, s.offsets, s.row_bytes)
            tally.hinted_steps += 1
        specs = plan.next_batch()
        jobs = [readers.Job(fd, s.offsets, s.row_bytes, np.empty((len(s.offsets), s.row_bytes), dtype=np.uint8))
                for s in specs]
        n = sum(len(s.offsets) for s in specs)
        start = time.monotonic_ns()
        stats = rdr.read_batch(jobs)
        end = time.monotonic_ns()
        if writer is not None:
            writer.write(start, end, rows=n, reader=reader, step=len(tally.batch_ns), **(marker_extra or {}))
        tally.batch_ns.append(end - start)
        tally.totals.add(stats)
        tally.rows += n
        if record_reads:
            tally.reads.append(batch_reads(specs))
            tally.unique += len(tally.reads[-1])
        else:
            tally.unique += sum(len(np.unique(s.offsets)) for s in specs)
        for s in specs:  # after the timed batch: the run's distinct rows (not a per-job sum)
            tally.distinct.update(s.offsets.tolist())
    return tally


def _summary(tally: _Tally, **about) -> dict:
    """The run's summary dict: counts, batch-time percentiles, then ``about`` (reader, pid, ...)."""
    ms = np.array(tally.batch_ns, dtype=np.float64) / 1e6
    pct = (lambda q: round(float(np.percentile(ms, q)), 4)) if len(ms) else (lambda q: None)
    return {
        "steps": len(tally.batch_ns),
        "rows": tally.rows,
        "unique_rows": tally.unique,
        "distinct_rows": len(tally.distinct),
        "calls": tally.totals.calls,
        "eagain": tally.totals.eagain,
        "fallback_rows": tally.totals.fallback_rows,
        "nowait_unsupported": tally.totals.nowait_unsupported,
        "batch_ms": {"p50": pct(50), "p99": pct(99),
                     "mean": round(float(ms.mean()), 4) if len(ms) else None,
                     "max": round(float(ms.max()), 4) if len(ms) else None},
        **about,
    }
