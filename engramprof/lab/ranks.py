"""``lab run --workers N``: N rank processes forked from one parent, like a tensor-parallel server.

Each rank is a child of the ``lab run`` process (``os.fork``: its pid is new, its parent is the
lab's pid, so ``--pid PARENT --children`` traces them all).  Rank r reads its own table
(``RankPlan.table``) or, by default, its own shard of the shared one (rows [r n / N, (r + 1)
n / N) of every tensor), with its own reader and cache preparation if told so, and writes its
batch markers into the one markers file with its ``pid`` and ``rank`` (one ``write(2)`` per
line, O_APPEND: the ranks' lines never interleave).  A rank may join cgroups (their
``cgroup.procs``) before it does anything else: ``lab scenario --faulty-rank`` puts only the
faulty rank into the fault's group.

The parent waits until every rank is set up (table warmed / evicted, pool started), prints
``lab: pid P``, one ``lab: rank R pid X`` per rank and ``lab: ready``; SIGUSR1 and SIGTERM /
SIGINT are passed on to the ranks.  Its summary: the workload counts summed, batch times over
every rank's batches, and ``ranks``, each rank's own summary.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from engramprof.errors import UserError
from engramprof.host.signals import events_on_signals
from engramprof.lab import workload

MAX_WORKERS = 64
SUMMED = ("steps", "rows", "unique_rows", "distinct_rows", "calls", "eagain", "fallback_rows")  # distinct: a union


@dataclass
class RankPlan:
    rank: int
    table: str
    shard: tuple[int, int] | None  # (index, count) of the shared table, None: the whole table
    reader: str
    cache: str | None
    join: list[str] = field(default_factory=list)  # cgroup.procs files to join first


def parse_rank_options(workers: int, values, what: str, check=None) -> dict[int, str]:
    """``R:VALUE`` options (``--rank-table 1:/t.safetensors``) into {rank: value}."""
    out: dict[int, str] = {}
    for v in values or ():
        r, sep, val = str(v).partition(":")
        if not sep or not r.strip().isdigit() or not val:
            raise UserError(f"{what} takes RANK:VALUE (e.g. 1:{'/path' if 'table' in what else 'x'}), got {v!r}")
        rank = int(r)
        if rank >= workers:
            raise UserError(f"{what} {v}: rank {rank} does not exist (--workers {workers}: ranks 0-{workers - 1})")
        if check is not None:
            check(val)
        out[rank] = val
    return out


def plans(workers: int, table: str, reader: str, cache: str | None, tables: dict[int, str],
          readers_: dict[int, str], caches: dict[int, str], joins: dict[int, list[str]]) -> list[RankPlan]:
    return [RankPlan(rank=r, table=tables.get(r, table), shard=None if r in tables else (r, workers),
                     reader=readers_.get(r, reader), cache=caches.get(r, cache), join=joins.get(r, []))
            for r in range(workers)]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}


def signals_to_events(stop: threading.Event, go: threading.Event) -> threading.Thread:
    """A rank's signals: SIGTERM / SIGINT set ``stop`` (and ``go``), SIGUSR1 sets ``go``, from a
    thread of their own (sigwait; the signals are blocked in the calling thread and every thread
    it starts later).  A Python signal handler calling Event.set() can deadlock: it runs in the
    main thread, which may be inside that Event's wait() holding its lock (the ranks wait on it
    between steps).  sigwait is sound only where no thread has the signals unblocked: a rank,
    forked with them blocked and with no thread but the forking one (its numpy threads start
    later, blocked too).  The parent has numpy's threads from before it could block anything
    (the kernel gives them its signals, whose Python handler then waits for the main thread):
    it uses commands/signals.events_on_signals, the wakeup pipe."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

    def wait_loop():
        while True:
            sig = signal.sigwait(SIGNALS)
            if sig != signal.SIGUSR1:
                stop.set()
            go.set()

    t = threading.Thread(target=wait_loop, name="engramprof-rank-signals", daemon=True)
    t.start()
    return t


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank_main(p: RankPlan, ready_w: int, result_w: int, stop: threading.Event, go: threading.Event,
               run_kwargs: dict, parent: int) -> int:
    """In the forked rank: join its cgroups, run the workload, send the summary."""
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above
        return 1
    stop, go = threading.Event(), threading.Event()  # fresh: no lock state copied from the parent
    signals_to_events(stop, go)
    try:
        for procs in p.join:  # before any read (the fault's groups charge / throttle from here)
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        result = workload.run_workload(
            p.table, p.reader, cache=p.cache, shard=p.shard, stop=stop, start_event=go,
            marker_extra={"pid": os.getpid(), "rank": p.rank}, marker_flush_s=0.0, keep_batch_ns=True, keep_distinct=True,
            on_ready=lambda: os.write(ready_w, b"r"), **run_kwargs)
        result["rank"] = p.rank
        result["shard"] = list(p.shard) if p.shard else None
        code = 0
    except UserError as exc:
        result, code = {"rank": p.rank, "error": str(exc)}, 2
    except OSError as exc:
        result, code = {"rank": p.rank, "error": f"{exc.filename or p.table}: {exc.strerror}"}, 1
    data = json.dumps(result).encode()
    while data:
        n = os.write(result_w, data)
        data = data[n:]
    return code


class _Rank:
    def __init__(self, plan: RankPlan, pid: int, ready_r: int, result_r: int):
        self.plan, self.pid, self.ready_r = plan, pid, ready_r
        self.chunks: list[bytes] = []
        self.status: int | None = None
        self._reader = threading.Thread(target=self._read, args=(result_r,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, 1 << 16):
                self.chunks.append(chunk)
        finally:
            os.close(fd)

    def result(self) -> dict:
        self._reader.join(10)
        try:
            return json.loads(b"".join(self.chunks))
        except ValueError:
            return {"rank": self.plan.rank, "error": f"rank {self.plan.rank} (pid {self.pid}) exited "
                                                     f"with status {self.status} and no summary"}


def run_ranks(rank_plans: list[RankPlan], stop: threading.Event, go: threading.Event, run_kwargs: dict) -> dict:
    """Fork the ranks, pass signals on, wait for all; the combined summary."""
    ranks: list[_Rank] = []
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # each rank starts with them blocked
    # the parent's signals, whichever of its threads the kernel gives them to (numpy's too)
    undo_events = events_on_signals(stop, go)
    if stop.is_set():
        go.set()
    parent = os.getpid()
    try:
        for p in rank_plans:
            ready_r, ready_w = os.pipe()
            result_r, result_w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the rank
                code = 1
                try:
                    wakeup = signal.set_wakeup_fd(-1)  # the parent's pipe: its reader waits for every writer
                    if wakeup >= 0:
                        os.close(wakeup)
                    os.close(ready_r)
                    os.close(result_r)
                    for other in ranks:
                        os.close(other.ready_r)
                    code = _rank_main(p, ready_w, result_w, stop, go, run_kwargs, parent)
                finally:
                    os._exit(code)
            os.close(ready_w)
            os.close(result_w)
            ranks.append(_Rank(p, pid, ready_r, result_r))
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # the parent's main thread takes them again
        _wait_ready(ranks)
        _say(f"lab: pid {os.getpid()}")
        for r in ranks:
            _say(f"lab: rank {r.plan.rank} pid {r.pid}")
        _say("lab: ready")
        _supervise(ranks, stop, go)
    except BaseException:
        for r in ranks:
            if r.status is None:
                _signal(r.pid, signal.SIGKILL)
                _reap(r, block=True)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        undo_events()
    results = [r.result() for r in ranks]
    errors = [x["error"] for x in results if "error" in x]
    if errors:
        raise UserError(f"rank {results.index(next(x for x in results if 'error' in x))}: {errors[0]}")
    return combine(results)


def _wait_ready(ranks: list[_Rank]) -> None:
    for r in ranks:
        try:
            got = os.read(r.ready_r, 1)
        finally:
            os.close(r.ready_r)
        if not got:  # the rank exited before it was set up: its error comes with its summary
            _reap(r, block=True)
            res = r.result()
            for other in ranks:
                if other.status is None:
                    _signal(other.pid, signal.SIGTERM)
                    _reap(other, block=True)
            raise UserError(f"rank {r.plan.rank}: {res.get('error', 'exited before it was ready')}")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(r: _Rank, block: bool = False) -> bool:
    if r.status is not None:
        return True
    try:
        pid, status = os.waitpid(r.pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        r.status = -1
        return True
    if pid == 0:
        return False
    r.status = os.waitstatus_to_exitcode(status)
    return True


def _supervise(ranks: list[_Rank], stop: threading.Event, go: threading.Event) -> None:
    went = stopped = False
    while not all(_reap(r) for r in ranks):
        if go.is_set() and not went:
            went = True
            for r in ranks:
                _signal(r.pid, signal.SIGUSR1)
        if stop.is_set() and not stopped:
            stopped = True
            for r in ranks:
                _signal(r.pid, signal.SIGTERM)
        stop.wait(0.02)


def distinct_over_ranks(results: list[dict]) -> int:
    """Distinct rows read by any rank: the union of the ranks' ``distinct_offsets`` per table
    file (taken out of each summary).  Not a sum of the ranks' ``distinct_rows``: ranks that
    share a table read disjoint shards of it, but a ``--rank-table`` naming that table (or two
    naming one file) reads rows another rank reads too.  A summary without offsets counts its
    own ``distinct_rows``."""
    by_table: dict[object, set[int]] = {}
    alone = 0
    for x in results:
        offsets = x.pop("distinct_offsets", None)
        if offsets is None:
            alone += int(x.get("distinct_rows") or 0)
            continue
        by_table.setdefault(_file_identity(x.get("table")), set()).update(offsets)
    return alone + sum(len(s) for s in by_table.values())


def _file_identity(path) -> object:
    """(device, inode) of a table (two names of one file are one table), else its path."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return path
    return st.st_dev, st.st_ino


def combine(results: list[dict]) -> dict:
    """The parent's summary: counts summed (distinct rows over the union of the ranks' rows),
    batch times over every rank's batches, ``ranks``."""
    ms = np.concatenate([np.asarray(x.pop("batch_ns", []), dtype=np.float64) for x in results]) / 1e6 \
        if results else np.array([])
    pct = (lambda q: round(float(np.percentile(ms, q)), 4)) if len(ms) else (lambda q: None)
    distinct = distinct_over_ranks(results)
    out = {k: distinct if k == "distinct_rows" else sum(int(x.get(k) or 0) for x in results) for k in SUMMED}
    out["nowait_unsupported"] = any(x.get("nowait_unsupported") for x in results)
    out["batch_ms"] = {"p50": pct(50), "p99": pct(99), "mean": round(float(ms.mean()), 4) if len(ms) else None,
                       "max": round(float(ms.max()), 4) if len(ms) else None}
    readers_ = sorted({x.get("reader") for x in results if x.get("reader")})
    out["reader"] = readers_[0] if len(readers_) == 1 else ",".join(readers_)
    out["pid"] = os.getpid()
    for k in ("table", "tokens", "heads", "jobs_per_step", "cache", "random"):  # the ranks' own, if one
        vals = {json.dumps(x.get(k)) for x in results}
        out[k] = results[0].get(k) if len(vals) == 1 and results else None
    out["elapsed_s"] = max((x.get("elapsed_s") or 0 for x in results), default=None)
    out["workers"] = len(results)
    out["ranks"] = results
    return out
