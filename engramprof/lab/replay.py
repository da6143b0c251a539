"""Component A/B: replay a trace's recorded row reads through reader strategies.

The replay reads the trace's real files at the trace's real offsets and sizes, shaped like
the trace's batches (one job per (file, tensor, row size), as a table reader issues them),
through each reader strategy of :mod:`engramprof.lab.readers` ("arms"), and reports batch
time, context switches, CPU and fallbacks per arm.

Method (the field report's corrected harness, not its first, invalid one):

- Residency is classified with mincore (:func:`engramprof.host.residency.classify_rows`), never by
  reading: a read-based classifier warms the very pages it classifies.
- Every arm gets its own sample of rows with the requested resident/cold mix.  The rows of
  each file are split into page-disjoint partitions (stripes of pages, randomly interleaved),
  one per arm (plus a shared "hot" partition when evicting), so one arm's cold reads cannot
  warm another arm's cold rows; without eviction each arm also never reuses a page it has
  already read as "cold".  Hot (resident) rows may be shared between arms when the trace has
  too few of them: reading a resident page does not change its residency.
- Files are opened with POSIX_FADV_RANDOM (no readahead), so a cold read brings in only the
  pages it asks for.
- Immediately before each timed batch the arm's rows are re-classified (mincore) and the
  observed mix is reported next to the requested one: residency can still change between
  that check and the read (the residual race).
- Each arm reads into its own destination buffers; there is no user-space row cache.
- After each timed batch (never before: it would warm the arm's rows) the same rows are read
  again with a plain blocking preadv loop and compared byte for byte; any mismatch fails the
  run.
- Cold mixes need cold rows.  Rows already cold are used first; evicting more
  (``posix_fadvise(POSIX_FADV_DONTNEED)`` on the pages of the rows selected as cold, just
  before each timed batch) happens only with ``allow_evict=True``: on a production host that
  drops those pages of the production table from the page cache (the arm reads them back).
- The ``mmap`` and ``mmap-pool`` arms gather the same rows through a read-only mapping of each
  file (the lab readers: ``numpy.memmap``, ``MADV_RANDOM``, one fancy index per job), mapped
  once before the timed batches.  ``POSIX_FADV_DONTNEED`` skips mapped pages, so before an
  eviction the cold rows' pages are unmapped from every mmap arm's mapping
  (``madvise(MADV_DONTNEED)``: page-table entries only, the page cache is untouched).
- The ``io_uring`` arm is the lab's ``uring`` reader (the ``liburing`` package: one
  ``IORING_OP_READV`` per row, one submit per step, buffered); ``direct`` (and ``aio``) read with
  O_DIRECT, so the page cache is bypassed whatever the rows' residency: each row is read as its
  aligned covering extent and sliced out (the rows not aligned to the file's O_DIRECT alignment
  are counted and named in a note).  An O_DIRECT read neither adds nor drops cached pages, so
  the per-arm residency control is the same as for every arm.
- Rounds: every arm reads every selected batch once per round, the arms interleaved batch by
  batch, their order rotated every round.  Each arm's figure is the median over rounds of its
  round medians with a distribution-free 95% interval, the speedup the median of the rounds'
  paired ratios with its interval, and what that interval supports is said in words
  (:mod:`engramprof.lab.replay_stats`).
"""
from __future__ import annotations

import gc
import os
import resource
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engramprof.analysis import batches as seg
from engramprof.analysis.events import code_faults
from engramprof.errors import UserError
from engramprof.host import residency
from engramprof.lab import direct_io, readers, replay_stats
from engramprof.lab.readers import Job
from engramprof.tables import safetensors as layout
from engramprof.target import identity
from engramprof.trace import load_bundle

DEFAULT_STRATEGIES = ("pool", "nowait", "serial")
DEFAULT_ROUNDS = 10  # the order-statistic interval is then the 2nd to the 9th of 10 (97.9%)
ARM_READER = {"io_uring": "uring"}  # replay's arm name -> the lab reader's name (otherwise the same)
ARM_ALIASES = {"uring": "io_uring"}  # the lab's name for the io_uring reader is accepted too
STRATEGIES = tuple(ARM_ALIASES.get(r, r) for r in readers.READERS)
MMAP_ARMS = ("mmap", "mmap-pool")  # engramprof.lab.readers.MMAP_READERS: gathers through a mapping
SENTINEL = 0x5A
MAX_STRIPE_PAGES = 256  # 1 MiB stripes at most

RACE_NOTE = (
    "residual race: residency can change between the mincore check just before an arm's timed "
    "batch and its reads (other processes, reclaim); 'observed cold' is the mix at that check"
)


# --------------------------------------------------------------------------- batches


@dataclass
class JobKey:
    path: str
    tensor: str
    size: int

    def label(self) -> str:
        t = self.tensor or "(no tensor)"
        return f"{os.path.basename(self.path)}:{t}:{self.size}B"


@dataclass
class Population:
    """The distinct rows of one job key in the trace, and what we know about them."""

    key: JobKey
    offsets: np.ndarray  # sorted unique int64
    frac: np.ndarray | None = None  # resident fraction at planning time
    part: np.ndarray | None = None  # partition per row (-1: on a page shared between partitions)
    first_page: np.ndarray | None = None
    npages: np.ndarray | None = None


@dataclass
class Shape:
    """One batch to replay: rows per job key (distinct rows, as in the trace batch)."""

    index: int
    counts: list[tuple[int, int]]  # (population index, distinct rows)

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.counts)


def _row_table(trace, markers: str | os.PathLike | None, gap_ms: float | None,
               rows_per_batch: int | None, notes: list[str]) -> pd.DataFrame:
    """One line per distinct row per batch: batch, path, tensor, offset, size (trace order)."""
    calls = trace.calls
    keep = (calls["offset"] >= 0) & (calls["size"] > 0) & calls["path"].astype(str).ne("")
    code = code_faults(calls)  # page faults on the process's own code are not table rows
    if code is not None:
        keep &= ~code
    df = calls.loc[keep].copy()
    if df.empty:
        raise UserError(f"{trace.path}: the trace has no positional row reads (offset >= 0, size > 0, "
                        "known path) to replay")
    ts = df["ts_ns"].to_numpy(np.int64)
    end_ns = ts + np.maximum(df["dur_ns"].to_numpy(np.int64), 0)

    if rows_per_batch:
        df["batch"] = 0  # re-batched below from the distinct rows in trace order
        notes.append(f"batches: the trace's distinct rows in trace order, {rows_per_batch} rows each "
                     "(--rows-per-batch)")
    elif markers is not None:
        mk, bad = seg.read_markers(markers)
        b = seg.from_markers(ts, end_ns, mk, getattr(trace, "meta", None), bad)
        df["batch"] = b.call_batch
        notes.extend(b.notes)
        df = df[df["batch"] >= 0]
        notes.append("batches: from the application's markers")
        if df.empty:
            raise UserError("no trace call falls inside a marker interval (markers from another run?)")
    else:
        # as batch-tail does: inferred batches the recording's start/end may have cut are left out
        offcpu = trace.samples("offcpu") if hasattr(trace, "samples") else None
        tids = (np.unique(df["tid"].to_numpy()) if {"tid", "pid"} <= set(df.columns) and df["pid"].nunique() > 1
                else None)
        b = seg.drop_truncated(seg.infer(ts, end_ns, gap_ms, seg.RunnableSpans.of(offcpu, tids)),
                               getattr(trace, "meta", None))
        df["batch"] = b.call_batch
        notes.extend(b.notes)
        df = df[df["batch"] >= 0]
        if b.gap_ns:
            notes.append(f"batches: {b.n} inferred, split at read-stream gaps over {b.gap_ns / 1e6:.3g} ms "
                         f"({b.gap_source})")
    if "tensor" not in df.columns:
        df["tensor"] = ""
    df["tensor"] = df["tensor"].fillna("").astype(str)
    # the tensor a row belongs to: the trace's column, else the safetensors header
    for path, pos in df.groupby("path", sort=False).indices.items():
        sub = df["tensor"].iloc[pos]
        if (sub == "").all():
            try:
                names, _ = layout.load(path).map_offsets(df["offset"].iloc[pos].to_numpy(np.int64))
            except UserError:
                continue
            df.iloc[pos, df.columns.get_loc("tensor")] = names
    rows = df.drop_duplicates(["batch", "path", "offset", "size"])[["batch", "path", "tensor", "offset", "size"]]
    if rows_per_batch:
        rows = rows.drop_duplicates(["path", "offset", "size"]).reset_index(drop=True)
        rows["batch"] = np.arange(len(rows)) // rows_per_batch
    return rows.reset_index(drop=True)


# --------------------------------------------------------------------------- files


@dataclass
class ReplayFile:
    path: str
    size: int
    fd_read: int  # POSIX_FADV_RANDOM fd the arms and the reference read through
    fd_probe: int  # fd residency queries use

    def close(self) -> None:
        for fd in (self.fd_read, self.fd_probe):
            try:
                os.close(fd)
            except OSError:
                pass


def _open_files(rows: pd.DataFrame) -> dict[str, ReplayFile]:
    """Open every file of the trace; one UserError naming every file that moved, shrank or
    cannot be read."""
    ends = (rows["offset"] + rows["size"]).groupby(rows["path"]).max()
    problems, files = [], {}
    for path, need in ends.items():
        try:
            f = residency.open_file(path, allow_empty=True)
        except UserError as exc:
            msg = str(exc)
            if "no such file" in msg:
                msg = f"{path}: no longer exists (moved or deleted since the trace)"
            problems.append(msg)
            continue
        if f.size < need:
            problems.append(f"{path}: shrank since the trace ({f.size:,} bytes now, the trace read up to byte {need:,})")
            f.close()
            continue
        try:
            fd = readers.open_table(path)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            f.close()
            continue
        if os.fstat(fd).st_ino != f.st.st_ino:
            os.close(fd)
            f.close()
            problems.append(f"{path}: replaced while being opened")
            continue
        files[path] = ReplayFile(path, f.size, fd, f.fd)
    if problems:
        for rf in files.values():
            rf.close()
        raise UserError("cannot replay: " + "; ".join(problems))
    return files


# --------------------------------------------------------------------------- planning


def _pages(offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first = offsets // residency.PAGE_SIZE
    last = (offsets + sizes - 1) // residency.PAGE_SIZE
    return first, last - first + 1


def _flat_pages(first: np.ndarray, npages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return residency._pages_of_rows(first, npages)


def _assign_partitions(pops: list[Population], weights: np.ndarray, rng: np.random.Generator) -> None:
    """Split each file's rows into page-disjoint partitions with the given weights.

    Per job key: pages are grouped into stripes (at most 1 MiB, at least one page, about 64
    stripes per partition over the key's extent), stripes are dealt to partitions in random
    order with exact proportions.  Rows on a page that ends up holding rows of two partitions
    (a row straddling stripes, tensors sharing a page) get -1 and are never used as cold."""
    nparts = len(weights)
    cum = np.cumsum(weights) / weights.sum()
    by_path: dict[str, list[Population]] = {}
    for p in pops:
        p.first_page, p.npages = _pages(p.offsets, np.full(len(p.offsets), p.key.size, dtype=np.int64))
        span = int(p.first_page[-1] + p.npages[-1] - p.first_page[0]) if len(p.offsets) else 1
        stripe = int(np.clip(span // (64 * nparts), 1, MAX_STRIPE_PAGES))
        sid = p.first_page // stripe
        uniq, inv = np.unique(sid, return_inverse=True)
        order = rng.permutation(len(uniq))
        slot = np.searchsorted(cum, (np.arange(len(uniq)) + 0.5) / len(uniq), side="right")
        part_of_stripe = np.empty(len(uniq), dtype=np.int64)
        part_of_stripe[order] = np.minimum(slot, nparts - 1)
        p.part = part_of_stripe[inv]
        by_path.setdefault(p.key.path, []).append(p)
    for plist in by_path.values():
        pages, parts = [], []
        for i, p in enumerate(plist):
            fp, starts = _flat_pages(p.first_page, p.npages)
            pages.append(fp)
            parts.append(np.repeat(p.part, p.npages))
        allp, allpart = np.concatenate(pages), np.concatenate(parts)
        pairs = np.unique(np.stack([allp, allpart], axis=1), axis=0)
        pg, cnt = np.unique(pairs[:, 0], return_counts=True)
        contested = pg[cnt > 1]
        if not len(contested):
            continue
        for p in plist:
            fp, starts = _flat_pages(p.first_page, p.npages)
            bad = np.add.reduceat(np.isin(fp, contested).astype(np.int64), starts) > 0
            p.part = np.where(bad, -1, p.part)


@dataclass
class PlannedBatch:
    arm: str
    round: int
    shape: int
    jobs: list[tuple[int, np.ndarray, np.ndarray]]  # (population index, offsets, is_cold per row)
    evict: bool = False


class _Shortage(Exception):
    pass


def _cold_quota(n: np.ndarray, cold_frac: float, cold_avail: np.ndarray, hot_avail: np.ndarray):
    """Cold rows per job so that the batch has ``round(cold_frac * rows)`` cold rows, each job
    as close to ``cold_frac`` as its candidates allow.  Returns the quota array, or "cold" /
    "resident" naming what is short."""
    total = int(round(cold_frac * n.sum()))
    lo = np.maximum(0, n - np.minimum(n, hot_avail))  # rows that cannot be resident
    hi = np.minimum(n, cold_avail)
    if lo.sum() > total or (lo > hi).any():
        return "resident" if (lo > hi).any() or lo.sum() > total else "cold"
    if hi.sum() < total:
        return "cold"
    cur = np.clip(np.round(cold_frac * n).astype(np.int64), lo, hi)
    diff = total - int(cur.sum())
    if diff:
        room = (hi - cur) if diff > 0 else (cur - lo)  # how far each job can move
        share = np.minimum(room, np.floor(abs(diff) * room / room.sum()).astype(np.int64))
        cur += np.sign(diff) * share
        diff -= int(np.sign(diff) * share.sum())
        for j in np.argsort(-(room - share), kind="stable"):  # the remainder, one row at a time
            if diff == 0:
                break
            if (diff > 0 and cur[j] < hi[j]) or (diff < 0 and cur[j] > lo[j]):
                cur[j] += np.sign(diff)
                diff -= int(np.sign(diff))
    return cur


def plan(pops: list[Population], shapes: list[Shape], arms: list[str], cold_frac: float, rounds: int,
         allow_evict: bool, rng: np.random.Generator, notes: list[str]) -> list[PlannedBatch]:
    """Choose, for every timed batch of every arm, which rows it reads (see the module doc)."""
    evict = allow_evict and cold_frac > 0
    na = len(arms)
    hot_part = na  # the shared hot partition (only when evicting)
    if evict and cold_frac < 1:
        # each arm reuses its own cold share (re-evicted every batch); the hot share is common
        weights = np.array([cold_frac] * na + [1 - cold_frac])
    else:
        weights = np.ones(na)
    _assign_partitions(pops, weights, rng)
    # per file, pages already planned to be read as cold (no-evict only)
    used: dict[str, np.ndarray] = {}
    shared_hot = spread = False
    out: list[PlannedBatch] = []
    for r in range(rounds):
        k = r % na
        order = arms[k:] + arms[:k]  # rotate the arm order every round
        for sh in shapes:
            for ai_name in order:
                ai = arms.index(ai_name)
                jobs = []
                # candidates per job: cold rows of this arm's share (page-disjoint from the
                # other arms'), resident rows of its share, and all resident rows
                cands = []
                for pi, n in sh.counts:
                    p = pops[pi]
                    hot = p.frac >= 1.0
                    if cold_frac <= 0:
                        cold_c = np.zeros(0, dtype=np.int64)
                    elif evict:
                        cold_c = np.flatnonzero(p.part == ai)
                    else:
                        cold_c = np.flatnonzero((p.part == ai) & (p.frac <= 0.0))
                        u = used.get(p.key.path)
                        if u is not None and len(cold_c):
                            fp, starts = _flat_pages(p.first_page[cold_c], p.npages[cold_c])
                            seen = np.add.reduceat(np.isin(fp, u).astype(np.int64), starts) > 0
                            cold_c = cold_c[~seen]
                    if evict:
                        hot_own = hot_all = np.flatnonzero(hot & (p.part == hot_part))
                    else:
                        hot_own, hot_all = np.flatnonzero(hot & (p.part == ai)), np.flatnonzero(hot)
                    cands.append((cold_c, hot_own, hot_all))
                quota = _cold_quota(np.array([n for _, n in sh.counts]), cold_frac,
                                    np.array([len(c[0]) for c in cands]), np.array([len(c[2]) for c in cands]))
                if isinstance(quota, str):
                    nn = np.array([n for _, n in sh.counts])
                    most = int(np.minimum(nn, [len(c[0]) for c in cands]).sum())
                    least = int(np.maximum(0, nn - np.array([len(c[2]) for c in cands])).sum())
                    labels = ", ".join(f"{pops[pi].key.label()}: {n:,} rows, {len(c[0]):,} cold / {len(c[2]):,} "
                                       "resident candidates" for (pi, n), c in zip(sh.counts, cands))
                    raise _Shortage(f"{quota} rows: arm {ai_name}, batch {sh.index} (round {r + 1}): "
                                    f"{int(round(cold_frac * sh.rows)):,} of its {sh.rows:,} rows should be cold, "
                                    f"but its page-disjoint share has cold rows for at most {most:,} and resident "
                                    f"rows for at least {least:,} of them to be cold ({labels})")
                for (pi, n), (cold_c, hot_own, hot_all), n_cold in zip(sh.counts, cands, quota.tolist()):
                    p = pops[pi]
                    n_hot = n - n_cold
                    if n_cold != int(round(cold_frac * n)):
                        spread = True
                    cold_sel = rng.choice(cold_c, n_cold, replace=False) if n_cold else np.zeros(0, np.int64)
                    if n_cold and not evict:  # these pages will be cached once read: never "cold" again
                        fp, _ = _flat_pages(p.first_page[cold_sel], p.npages[cold_sel])
                        prev = used.get(p.key.path)
                        used[p.key.path] = np.unique(fp) if prev is None else np.union1d(prev, fp)
                    hot_c = hot_own
                    if len(hot_own) < n_hot:
                        hot_c = hot_all
                        shared_hot = True
                    hot_sel = rng.choice(hot_c, n_hot, replace=False) if n_hot else np.zeros(0, np.int64)
                    sel = np.concatenate([hot_sel, cold_sel])
                    is_cold = np.concatenate([np.zeros(len(hot_sel), bool), np.ones(len(cold_sel), bool)])
                    perm = rng.permutation(len(sel))  # hot and cold interleaved, as in a real batch
                    jobs.append((pi, p.offsets[sel[perm]], is_cold[perm]))
                out.append(PlannedBatch(ai_name, r, sh.index, jobs, evict))
    if spread:
        notes.append(f"cold rows: some jobs have too few cold (or resident) rows for a {cold_frac:g} mix each, so "
                     "the batch's cold rows were spread over the jobs that have them (the batch mix is as asked)")
    if shared_hot:
        notes.append("resident rows: the trace has too few resident rows for page-disjoint per-arm samples, "
                     "so arms draw their resident rows from all of them (reading a resident page does not "
                     "change its residency)")
    return out


# --------------------------------------------------------------------------- running


def _evict_rows(fd: int, offsets: np.ndarray, size: int) -> int:
    """DONTNEED the pages of the given rows (merged into runs); returns pages advised."""
    if not len(offsets):
        return 0
    first, npages = _pages(offsets, np.full(len(offsets), size, dtype=np.int64))
    pages, _ = _flat_pages(first, npages)
    pages = np.unique(pages)
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    ps = residency.PAGE_SIZE
    for run in np.split(pages, breaks):
        os.posix_fadvise(fd, int(run[0]) * ps, len(run) * ps, os.POSIX_FADV_DONTNEED)
    return len(pages)


def _reference_read(fd: int, offsets: np.ndarray, size: int, out: np.ndarray) -> None:
    """Plain blocking full-read loop, independent of the readers under test."""
    for i, off in enumerate(offsets.tolist()):
        view = memoryview(out[i])
        done = 0
        while done < size:
            n = os.preadv(fd, [view[done:]], off + done)
            if n <= 0:
                raise UserError(f"reference read hit end of file at offset {off + done} (file changed during the replay?)", 1)
            done += n


@dataclass
class ArmResult:
    name: str
    batch_ns: list[int] = field(default_factory=list)
    rows: int = 0
    nvcsw: int = 0
    nivcsw: int = 0
    utime: float = 0.0
    stime: float = 0.0
    calls: int = 0
    eagain: int = 0
    fallback_rows: int = 0
    nowait_unsupported: bool = False
    mismatched_rows: int = 0
    cold_requested: int = 0
    cold_observed: int = 0  # rows fully non-resident at the pre-batch check
    resident_observed: int = 0
    race_rows: int = 0  # rows planned hot found not resident, or planned cold found resident
    evicted_pages: int = 0
    majflt: int = 0  # page faults inside the timed batches (getrusage: the whole process)
    minflt: int = 0
    unmapped_pages: int = 0  # pages of cold rows unmapped from the mmap arms' mappings before eviction
    round_ns: dict[int, list[int]] = field(default_factory=dict)  # round -> its batch times, in order
    round_rows: dict[int, int] = field(default_factory=dict)
    round_cold: dict[int, int] = field(default_factory=dict)  # rows cold at the pre-batch check
    direct_align: dict[str, int] = field(default_factory=dict)  # O_DIRECT arms: path -> alignment
    unaligned_rows: int = 0  # O_DIRECT arms: rows whose start or end is not aligned
    direct_bytes: int = 0  # O_DIRECT arms: bytes of the aligned extents read
    direct_requested: int = 0  # O_DIRECT arms: bytes of the rows themselves

    def round_medians_ms(self) -> list[float]:
        """The arm's figure of each round (the median of its batch times), rounds in order."""
        return [float(np.median(self.round_ns[r])) / 1e6 for r in sorted(self.round_ns)]

    def o_direct(self) -> dict | None:
        """O_DIRECT arms: the alignment, the rows read by a wider aligned extent, the bytes."""
        if not self.direct_align:
            return None
        return {"alignment": sorted(set(self.direct_align.values())), "unaligned_rows": self.unaligned_rows,
                "bytes_read": self.direct_bytes, "bytes_requested": self.direct_requested}

    def to_dict(self) -> dict:
        ms = np.array(self.batch_ns, dtype=np.float64) / 1e6
        q = (lambda x: round(float(np.percentile(ms, x)), 3)) if len(ms) else (lambda x: None)
        nb = max(len(ms), 1)
        return {
            "batch_ms": {"p50": q(50), "p90": q(90), "p10": q(10),
                         "min": round(float(ms.min()), 3) if len(ms) else None,
                         "max": round(float(ms.max()), 3) if len(ms) else None},
            "batches": len(ms),
            "rows": self.rows,
            "ctx_voluntary": self.nvcsw,
            "ctx_involuntary": self.nivcsw,
            "cpu_user_s": round(self.utime, 4),
            "cpu_sys_s": round(self.stime, 4),
            "per_batch": {"ctx_voluntary": round(self.nvcsw / nb, 1), "ctx_involuntary": round(self.nivcsw / nb, 1),
                          "cpu_user_ms": round(1e3 * self.utime / nb, 3), "cpu_sys_ms": round(1e3 * self.stime / nb, 3)},
            "calls": self.calls,
            "eagain": self.eagain,
            "fallback_rows": self.fallback_rows,
            "nowait_unsupported": self.nowait_unsupported,
            "mismatched_rows": self.mismatched_rows,
            "cold_frac_observed": round(self.cold_observed / self.rows, 4) if self.rows else None,
            "resident_frac_observed": round(self.resident_observed / self.rows, 4) if self.rows else None,
            "race_rows": self.race_rows,
            "evicted_pages": self.evicted_pages,
            "faults_major": self.majflt,
            "faults_minor": self.minflt,
            "unmapped_pages": self.unmapped_pages,
            "rounds_ms": replay_stats.median_interval(self.round_medians_ms()).to_dict(),
        }


def _warmup(reader, threads: int) -> None:
    """Start a pool reader's threads on an anonymous memfd (never on the user's files).

    Only the blocking pool is warmed this way (the process-wide executor that the pool and
    nowait arms share): a NOWAIT read of a memfd may be refused, and the nowait reader would
    then remember "unsupported" for the real files."""
    fd = os.memfd_create("engramprof-replay-warmup", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"\0" * 65536)
        n = max(64, 4 * threads)
        offs = (np.arange(n, dtype=np.int64) * 64) % 65536
        reader.read_batch([Job(fd, offs, 64, np.empty((n, 64), dtype=np.uint8))])
    finally:
        os.close(fd)


def replay(
    trace_path: str | os.PathLike,
    strategies: list[str] | tuple[str, ...] = DEFAULT_STRATEGIES,
    *,
    cold_frac: float = 0.0,
    rounds: int = DEFAULT_ROUNDS,
    rows_per_batch: int | None = None,
    allow_evict: bool = False,
    threads: int = 32,
    max_batches: int = 8,
    markers: str | os.PathLike | None = None,
    gap_ms: float | None = None,
    seed: int = 0,
    preadv=None,
    progress=None,
    allow_changed: bool = False,
) -> dict:
    """Run the component A/B; returns the result dict (``mismatches`` > 0 means failure).

    ``preadv`` is passed to every reader (forced-path tests); the reference read always uses
    ``os.preadv``.  ``progress(msg)`` is called between batches if given.  A file that changed
    since the trace (its recorded identity, tables/files.parquet) is refused (UserError, exit 2)
    unless ``allow_changed``.
    """
    strategies = list(dict.fromkeys(ARM_ALIASES.get(s, s) for s in strategies))
    bad = [s for s in strategies if s not in STRATEGIES]
    if not strategies or bad:
        raise UserError(f"reader strategies: unknown {', '.join(bad) or '(none given)'}; "
                        f"choose from {', '.join(STRATEGIES)}")
    if not 0.0 <= cold_frac <= 1.0:
        raise UserError("cold_frac (the fraction of rows read cold) must be between 0 and 1")
    if rounds < 1 or max_batches < 1 or threads < 1:
        raise UserError("rounds, max_batches and threads must be at least 1")
    if rows_per_batch is not None and rows_per_batch < 1:
        raise UserError("rows_per_batch must be at least 1")
    notes: list[str] = []
    trace = load_bundle(trace_path)
    notes.extend(trace.notes)
    rows = _row_table(trace, markers, gap_ms, rows_per_batch, notes)

    notes.extend(identity.verify(trace, sorted(set(rows["path"])), allow_changed))
    files = _open_files(rows)
    try:
        return _run(trace_path, rows, files, strategies, cold_frac, rounds, allow_evict, threads,
                    max_batches, seed, preadv, progress, notes)
    finally:
        for f in files.values():
            f.close()


def _run(trace_path, rows, files, strategies, cold_frac, rounds, allow_evict, threads, max_batches,
         seed, preadv, progress, notes) -> dict:
    rng = np.random.default_rng(seed)
    pops, key_index = _populations(rows, files)
    shapes = _batch_shapes(rows, key_index, max_batches, notes)
    planned = _plan_or_explain(pops, shapes, strategies, cold_frac, rounds, allow_evict, rng, notes)
    evicting = bool(planned) and planned[0].evict
    if cold_frac > 0 and evicting:
        _write_back_dirty(files, notes)
    notes.append("files read with POSIX_FADV_RANDOM (no readahead): a cold read brings in only its own pages")
    notes.append(RACE_NOTE)
    notes.append("component benchmark of the reader alone on this host now: not a model or endpoint result")
    results = _run_arms(planned, pops, shapes, files, strategies, threads, preadv, progress)
    _arm_notes(results, evicting, cold_frac, notes)
    orders: dict[int, list[str]] = {}
    for pb in planned:
        if pb.arm not in orders.setdefault(pb.round, []):
            orders[pb.round].append(pb.arm)
    return _result(trace_path, strategies, cold_frac, rounds, threads, allow_evict, shapes, pops, results,
                   [orders[r] for r in sorted(orders)], notes)


def _populations(rows: pd.DataFrame, files: dict[str, ReplayFile]) -> tuple[list[Population], dict[tuple, int]]:
    """The distinct rows per job key (path, tensor, size), classified by mincore (not read);
    and the index of each key's population."""
    keys = rows[["path", "tensor", "size"]].drop_duplicates().reset_index(drop=True)
    pops: list[Population] = []
    key_index: dict[tuple, int] = {}
    for path, tensor, size in keys.itertuples(index=False):
        m = (rows["path"] == path) & (rows["tensor"] == tensor) & (rows["size"] == size)
        offs = np.unique(rows.loc[m, "offset"].to_numpy(np.int64))
        key_index[(path, tensor, int(size))] = len(pops)
        pops.append(Population(JobKey(path, tensor, int(size)), offs))
    for p in pops:
        p.frac = residency.classify_rows(files[p.key.path].fd_probe, p.offsets,
                                         np.full(len(p.offsets), p.key.size), method="mincore")
    return pops, key_index


def _batch_shapes(rows: pd.DataFrame, key_index: dict[tuple, int], max_batches: int,
                  notes: list[str]) -> list[Shape]:
    """Distinct rows per job key in each trace batch, jobs in trace order; at most
    ``max_batches`` of them, evenly spaced."""
    all_shapes = []
    for b, grp in rows.groupby("batch", sort=True):
        counts: dict[int, int] = {}
        for path, tensor, size in grp[["path", "tensor", "size"]].itertuples(index=False):
            pi = key_index[(path, tensor, int(size))]
            counts[pi] = counts.get(pi, 0) + 1
        all_shapes.append(Shape(int(b), list(counts.items())))
    if len(all_shapes) <= max_batches:
        return all_shapes
    pick = np.unique(np.linspace(0, len(all_shapes) - 1, max_batches).round().astype(int))
    notes.append(f"replaying {len(pick)} of the trace's {len(all_shapes)} batches, evenly spaced (--batches)")
    return [all_shapes[i] for i in pick]


def _plan_or_explain(pops, shapes, strategies, cold_frac, rounds, allow_evict, rng, notes) -> list[PlannedBatch]:
    """:func:`plan`, with a shortage of cold or resident rows turned into a UserError that
    says what the trace has now and what would help."""
    try:
        return plan(pops, shapes, strategies, cold_frac, rounds, allow_evict, rng, notes)
    except _Shortage as exc:
        if str(exc).startswith("cold"):
            hint = ("; allow eviction (allow_evict) to evict the pages of the rows selected as cold just before "
                    "each timed batch (drops those pages of the data file from the page cache: on a production "
                    "host only if you mean it), or lower the cold fraction, the rounds or the batches")
        else:
            hint = ("; warm the file first (read it once, e.g. `cat FILE > /dev/null`) or raise the cold "
                    "fraction; replay never warms rows itself")
        total_resident = sum(int((p.frac >= 1).sum()) for p in pops)
        total_cold = sum(int((p.frac <= 0).sum()) for p in pops)
        total_rows = sum(len(p.offsets) for p in pops)
        raise UserError(f"{exc} (of the trace's {total_rows:,} distinct rows {total_resident:,} are resident "
                        f"and {total_cold:,} cold now){hint}") from None


def _write_back_dirty(files: dict[str, ReplayFile], notes: list[str]) -> None:
    """Dirty pages cannot be evicted: write them back before the first eviction."""
    for rf in files.values():
        dirty = residency.cachestat(rf.fd_probe).nr_dirty if residency.cachestat_available(rf.fd_probe) else 1
        if dirty:
            os.fdatasync(rf.fd_read)
            notes.append(f"{rf.path}: written back (fdatasync) first: dirty pages cannot be evicted")
    notes.append("--allow-evict: before each timed batch the pages of the rows selected as cold were evicted "
                 "(POSIX_FADV_DONTNEED) from the page cache; the arms read them back")


def _run_arms(planned, pops, shapes, files, strategies, threads, preadv, progress) -> dict[str, ArmResult]:
    """Every planned batch through its arm's reader, timed; returns the result per arm."""
    # destination buffers: one set per arm (separate destinations, reused across its batches:
    # a batch uses the leading rows), and one for the reference read
    most: dict[int, int] = {}
    for sh in shapes:
        for pi, n in sh.counts:
            most[pi] = max(most.get(pi, 0), n)
    bufs = {a: {pi: np.empty((n, pops[pi].key.size), dtype=np.uint8) for pi, n in most.items()}
            for a in strategies + ["reference"]}
    results = {a: ArmResult(a) for a in strategies}
    rdrs = _make_readers(strategies, threads, preadv, files, results)
    mapped = [r for r in rdrs.values() if isinstance(r, readers.MmapReader)]
    # holds the shared executor and starts its threads before any timed batch
    rdrs_warm = readers.make_reader("pool", threads)
    # the garbage made so far (trace, plan) is not the readers': collect it once and keep the
    # collector off those objects, so GC pauses inside timed batches come from the readers
    gc.collect()
    gc.freeze()
    try:
        _warmup(rdrs_warm, threads)
        for i, pb in enumerate(planned):
            ms = _timed_batch(pb, results[pb.arm], rdrs[pb.arm], pops, files, bufs, mapped)
            if progress:
                progress(f"{i + 1}/{len(planned)} {pb.arm} batch {pb.shape} round {pb.round + 1}: {ms:.2f} ms")
    finally:
        for rdr in rdrs.values():
            rdr.close()
        rdrs_warm.close()
        gc.unfreeze()
    return results


def _make_readers(strategies: list[str], threads: int, preadv, files: dict[str, ReplayFile],
                  results: dict[str, ArmResult]) -> dict:
    """One reader per arm, each prepared on every file before any timed batch: the mmap arms
    map the files (a long-running reader's mapping), the O_DIRECT arms open their O_DIRECT fds
    (and the arm's result learns each file's alignment).  A reader that cannot run here (io_uring
    refused, a filesystem without O_DIRECT) is one line (UserError), every reader closed."""
    rdrs: dict = {}
    try:
        for a in strategies:
            rdr = rdrs[a] = readers.make_reader(ARM_READER.get(a, a), threads, preadv=preadv)
            for rf in files.values():
                if isinstance(rdr, readers.MmapReader) or a in readers.DIRECT_READERS:
                    rdr.prepare(rf.fd_read)
                if a in readers.DIRECT_READERS:
                    dfd, align = direct_io.open_direct(rf.fd_read, a)
                    os.close(dfd)
                    results[a].direct_align[rf.path] = align
    except readers.ReaderUnavailable as exc:
        for rdr in rdrs.values():
            rdr.close()
        raise UserError(f"arm {a}: {exc}", exc.code) from None
    return rdrs


def _timed_batch(pb: PlannedBatch, res: ArmResult, reader, pops: list[Population],
                 files: dict[str, ReplayFile], bufs: dict, mapped: list | None = None) -> float:
    """One planned batch: evict its cold rows (if planned), check the residency it starts
    from, time the read, verify it byte for byte.  Adds to ``res``; returns the batch ms.

    ``mapped``: the mmap arms' readers.  A page mapped by a process is not dropped by
    POSIX_FADV_DONTNEED, and an mmap arm's mapping holds the pages it gathered (and, by
    fault-around, cached neighbours of other arms' rows), so the cold rows' pages are unmapped
    from every such mapping (MADV_DONTNEED: page-table entries only) before the eviction."""
    jobs = []
    for pi, offs, is_cold in pb.jobs:
        p = pops[pi]
        out = bufs[pb.arm][pi][:len(offs)]
        rf = files[p.key.path]
        if pb.evict and is_cold.any():
            for m in mapped or ():
                res.unmapped_pages += m.unmap(rf.fd_read, offs[is_cold], p.key.size)
            res.evicted_pages += _evict_rows(rf.fd_read, offs[is_cold], p.key.size)
        out.fill(SENTINEL)  # fault the buffer in (untimed) and mark rows not written
        jobs.append(readers.Job(rf.fd_read, offs, p.key.size, out))
    _observe_start(pb, res, pops, files)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter_ns()
    stats = reader.read_batch(jobs)
    t1 = time.perf_counter_ns()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    res.batch_ns.append(t1 - t0)
    res.round_ns.setdefault(pb.round, []).append(t1 - t0)
    res.rows += sum(len(j.offsets) for j in jobs)
    res.round_rows[pb.round] = res.round_rows.get(pb.round, 0) + sum(len(j.offsets) for j in jobs)
    if res.direct_align:
        _count_extents(res, jobs, files)
    res.nvcsw += ru1.ru_nvcsw - ru0.ru_nvcsw
    res.nivcsw += ru1.ru_nivcsw - ru0.ru_nivcsw
    res.utime += ru1.ru_utime - ru0.ru_utime
    res.stime += ru1.ru_stime - ru0.ru_stime
    res.majflt += ru1.ru_majflt - ru0.ru_majflt
    res.minflt += ru1.ru_minflt - ru0.ru_minflt
    res.calls += stats.calls
    res.eagain += stats.eagain
    res.fallback_rows += stats.fallback_rows
    res.nowait_unsupported |= stats.nowait_unsupported
    # byte-for-byte check against a reference read made after the timed arm
    for (pi, _, _), job in zip(pb.jobs, jobs):
        ref = bufs["reference"][pi][:len(job.offsets)]
        _reference_read(job.fd, job.offsets, job.row_bytes, ref)
        res.mismatched_rows += int((ref != job.out).any(axis=1).sum())
    return (t1 - t0) / 1e6


def _count_extents(res: ArmResult, jobs: list[Job], files: dict[str, ReplayFile]) -> None:
    """O_DIRECT arms: rows not aligned to their file's alignment, and the bytes of the aligned
    covering extents they were read by (the reader reads each distinct row's extent)."""
    align = {files[p].fd_read: a for p, a in res.direct_align.items()}
    for job in jobs:
        a = align[job.fd]
        offs = np.unique(job.offsets)
        res.unaligned_rows += int(((offs % a != 0) | ((offs + job.row_bytes) % a != 0)).sum())
        res.direct_bytes += direct_io.Extents(offs, job.row_bytes, a).total
        res.direct_requested += len(offs) * job.row_bytes


def _observe_start(pb: PlannedBatch, res: ArmResult, pops: list[Population], files: dict[str, ReplayFile]) -> None:
    """The residency the arm actually starts from (mincore, no read), against the plan."""
    for pi, offs, is_cold in pb.jobs:
        p = pops[pi]
        fr = residency.classify_rows(files[p.key.path].fd_probe, offs, np.full(len(offs), p.key.size),
                                     method="mincore")
        res.cold_requested += int(is_cold.sum())
        res.cold_observed += int((fr <= 0).sum())
        res.round_cold[pb.round] = res.round_cold.get(pb.round, 0) + int((fr <= 0).sum())
        res.resident_observed += int((fr >= 1).sum())
        res.race_rows += int(((fr < 1) & ~is_cold).sum() + ((fr > 0) & is_cold).sum())


def _arm_notes(results: dict[str, ArmResult], evicting: bool, cold_frac: float, notes: list[str]) -> None:
    """What may make an arm's figures not what was asked for."""
    if "pool" not in results:
        notes.append("no pool arm: speedups are relative to the pool and so are not given")
    if "io_uring" in results:
        notes.append("io_uring: the lab's uring reader (liburing package): one IORING_OP_READV per row into the "
                     "ring's buffers, every row of the batch in one submit on one persistent ring, buffered reads")
    for a, r in results.items():
        od = r.o_direct()
        if od is None:
            continue
        al = "/".join(f"{x:,}" for x in od["alignment"])
        notes.append(f"{a}: O_DIRECT bypasses the page cache: every row is read from the device whatever its "
                     "residency" + (" (the mix's resident rows too: this arm reads them from the device, the "
                                    "other arms from the cache)" if cold_frac < 1 else ""))
        if od["unaligned_rows"]:
            notes.append(f"{a}: {od['unaligned_rows']:,} of {r.rows:,} row reads are not aligned to the file's O_DIRECT "
                         f"alignment ({al} B): each was read as its aligned covering extent and the row sliced "
                         f"out ({od['bytes_read']:,} bytes read for {od['bytes_requested']:,} requested)")
    mm = [a for a in results if a in MMAP_ARMS]
    if mm:
        notes.append(f"{', '.join(mm)}: rows gathered through a read-only numpy.memmap of each file (MADV_RANDOM, "
                     "mapped once before the timed batches, as a long-running reader keeps it): a cold row is a "
                     "major page fault; a resident row this arm (or fault-around) already mapped makes no fault; "
                     "faults_major / faults_minor count the process's faults inside the timed batches"
                     + ("; before each eviction the cold rows' pages were unmapped from the mappings "
                        "(madvise MADV_DONTNEED), since POSIX_FADV_DONTNEED skips mapped pages" if evicting else ""))
    for a, r in results.items():
        if r.nowait_unsupported:
            notes.append(f"{a}: RWF_NOWAIT is not supported for these files (filesystem or kernel): the whole "
                         "batch fell back to the pool, so this arm measured the fallback path")
        if r.cold_requested and r.cold_observed < 0.8 * r.cold_requested:
            why = (" (POSIX_FADV_DONTNEED drops only whole folios inside the advised range: pages cached as "
                   "large folios, e.g. after the file was written or read sequentially, survive per-row eviction; "
                   "evict the whole file once and let random reads bring the rows back)") if evicting else ""
            notes.append(f"WARNING {a}: only {r.cold_observed:,} rows were cold at the start of their batches, "
                         f"{r.cold_requested:,} were requested cold: this arm did not measure the requested mix{why}")
        if r.rows and r.race_rows:
            notes.append(f"{a}: {r.race_rows:,} of {r.rows:,} rows were not in the requested state at the "
                         "pre-batch check (residency changed after classification)")


def _speedups(strategies: list[str], results: dict[str, ArmResult]) -> tuple[dict, dict]:
    """Per arm: the speedup over the pool (median of the rounds' paired ratios) and its
    interval with the claim it supports (:mod:`.replay_stats`)."""
    if "pool" not in results:
        return {a: None for a in strategies}, {}
    pool = results["pool"].round_medians_ms()
    speedup, ci = {}, {}
    for a in strategies:
        iv = replay_stats.paired_speedup(pool, results[a].round_medians_ms()).rounded(3)  # as printed
        speedup[a] = round(iv.estimate, 2) if iv.n else None
        if a != "pool" and iv.n:
            claim, statement = replay_stats.speedup_claim(a, iv)
            ci[a] = dict(iv.to_dict(), claim=claim, statement=statement)
    return speedup, ci


def _rounds(strategies: list[str], results: dict[str, ArmResult], orders: list[list[str]]) -> list[dict]:
    """Every round: its arm order, each arm's batch times, median and cold mix, the paired ratios."""
    out = []
    for r, order in enumerate(orders):
        med = {a: round(float(np.median(results[a].round_ns[r])) / 1e6, 4) for a in strategies}
        rows = {a: results[a].round_rows.get(r, 0) for a in strategies}
        out.append({
            "round": r + 1,
            "order": order,
            "batch_ms": {a: [round(ns / 1e6, 4) for ns in results[a].round_ns[r]] for a in strategies},
            "median_ms": med,
            "cold_frac_observed": {a: round(results[a].round_cold.get(r, 0) / rows[a], 4) if rows[a] else None
                                   for a in strategies},
            "speedup": ({a: round(med["pool"] / med[a], 3) if med[a] else None for a in strategies}
                        if "pool" in med else {}),
        })
    return out


def _result(trace_path, strategies, cold_frac, rounds, threads, allow_evict, shapes, pops, results, orders,
            notes) -> dict:
    arms = {a: results[a].to_dict() for a in strategies}
    for a in strategies:
        od = results[a].o_direct()
        if od is not None:
            arms[a]["o_direct"] = od
    speedup, speedup_ci = _speedups(strategies, results)
    shape_rows = [sh.rows for sh in shapes]
    return {
        "trace": str(trace_path),
        "strategies": strategies,
        "cold_frac": cold_frac,
        "rounds": rounds,
        "threads": threads,
        "batches": len(shapes),
        "rows_per_batch": {"min": min(shape_rows), "max": max(shape_rows), "median": int(np.median(shape_rows))},
        "jobs_per_batch": {"min": min(len(s.counts) for s in shapes), "max": max(len(s.counts) for s in shapes)},
        "jobs": [{"key": p.key.label(), "path": p.key.path, "tensor": p.key.tensor, "row_bytes": p.key.size,
                  "distinct_rows": len(p.offsets), "resident_now": int((p.frac >= 1).sum()),
                  "cold_now": int((p.frac <= 0).sum())} for p in pops],
        "arms": arms,
        "speedup": speedup,
        "speedup_ci": speedup_ci,
        "confidence": replay_stats.CONFIDENCE,
        "per_round": _rounds(strategies, results, orders),
        "mismatches": sum(r.mismatched_rows for r in results.values()),
        "rows_verified": sum(r.rows for r in results.values()),
        "allow_evict": bool(allow_evict),
        "notes": notes,
    }
