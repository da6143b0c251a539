"""The code view: from a slow read to the line of code (issue 24).

Joins the sampled Python stacks (samples/stacks, engramprof/sampling/stacks.py) to the read
events and the batches by thread and time, and answers three questions:

1. **who issues the reads** (:func:`read_sites`): each read event of a thread gets the function
   of that thread's nearest *busy* sample (by its frames: not an idle pool worker, not a
   wait), the sample's window overlapping the read (``inside``) or within :data:`NEAR_NS` of
   it (``near``); a worker with none borrows its pool's nearest (``pool``: another worker of
   the same process, running the same code).  The line is the one that function is seen in a
   call at most often (:func:`call_lines`), not where the nearest sample sat.  A pool
   worker's site is the function it runs; the code that submitted it is the site where, in
   the same round, a thread of the process waited on a future or submitted one.
   Sites are ranked by slow-read time, miss time, then read time.
2. **where each step waits** (:func:`step_waits`): the step thread (the thread other than a
   pool worker with the most samples inside batches outside a plain wait) and its share of
   step time per code site and state (engramprof/analysis/stack_frames.py: on-CPU with the
   GIL, native / GIL released, in a blocked read, waiting on a future, waiting on a lock,
   runnable waiting for the GIL).
3. **Python scheduling, observed** (:func:`python_scheduling`): the step thread's and the
   workers' GIL waits and the executor's submit / complete time inside batches, from the
   samples.

Stages are pure functions of DataFrames (:func:`code_view` runs them); docs/model.md ("The code
view") gives the join's error bounds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engramprof.analysis import stack_frames as sf
from engramprof.units import duration, pct

#: a read joins a busy sample of its thread at most this far from it
NEAR_NS = 1_000_000_000
#: a read's function: the most common among this many busy samples of its thread, centred on
#: the one nearest it (:func:`vote`)
VOTE_SAMPLES = 5
TOP_SITES = 8
TOP_WAITS = 8


# ---------------------------------------------------------------- stage 1: the samples, read

def prepare_samples(stacks: pd.DataFrame, calls: pd.DataFrame | None, offcpu: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (thread, round) with its window, placement, site, worker flag and state.

    A sample is placed at the end of its window (``at_ns``): py-spy reads the stacks at the end
    of its run, after its start-up (docs/model.md, "The code view")."""
    s = stacks.reset_index(drop=True)
    text = s["frames"].astype(object)
    # what the frames say, once per distinct stack (a few hundred, however many samples)
    per = {}
    for t in pd.unique(text):
        f = sf.parse(t)
        site = sf.site_of(f)
        per[t] = (site.frame is not None, site.key, _function(site), " < ".join(site.via), sf.is_worker(f),
                  sf.in_executor(f), sf.frame_state(f))
    cols = list(zip(*text.map(per))) if len(s) else [()] * 7
    user, key, function, via, worker, executor, fstate = (np.asarray(c, dtype=object) for c in cols)
    tids = s["tid"].to_numpy()
    end = s["ts_ns"].to_numpy(np.int64)
    start = end - s["window_ns"].to_numpy(np.int64)
    blocked = _in_blocked_read(tids, start, end, calls)
    spans = _offcpu_at(tids, start, end, offcpu)
    state = [fs or sf.run_state(g, a, b, o) for fs, g, a, b, o in
             zip(fstate, s["gil"].to_numpy(bool), s["active"].to_numpy(bool), blocked, spans)]
    return pd.DataFrame({
        "pid": s["pid"].to_numpy(), "tid": tids, "round": s["round"].to_numpy(),
        "name": s["thread_name"].astype(object).fillna("").to_numpy(), "start_ns": start, "end_ns": end,
        "at_ns": end, "gil": s["gil"].to_numpy(bool), "worker": worker.astype(bool), "user": user.astype(bool),
        "site": key, "function": function, "via": via, "state": np.asarray(state, dtype=object),
        "executor": executor.astype(bool),
    })


def _function(site: sf.Site) -> str:
    """A site without its line: ``PoolReader._run (lab/readers.py)`` (a submitter submits on one
    line and gathers on another of the same function)."""
    f = site.frame
    return site.key if f is None else f"{f.func} ({sf.short_file(f.file)})"


def _slept(calls: pd.DataFrame) -> np.ndarray:
    """Per read event: it slept in the kernel (off a CPU, not waiting for one); all False
    without the off-CPU columns."""
    if not {"offcpu_ns", "runq_ns"} <= set(calls.columns):
        return np.zeros(len(calls), dtype=bool)
    return (calls["offcpu_ns"].fillna(0) - calls["runq_ns"].fillna(0)).to_numpy() > 0


def _in_blocked_read(tids: np.ndarray, start: np.ndarray, end: np.ndarray, calls: pd.DataFrame | None) -> np.ndarray:
    """Per sample: a read event of its thread that slept in the kernel overlaps its window."""
    out = np.zeros(len(tids), dtype=bool)
    if calls is None or not len(calls):
        return out
    slept = calls[_slept(calls)]
    for tid, g in slept.groupby("tid", sort=False):
        idx = np.flatnonzero(tids == tid)
        if not len(idx):
            continue
        order = np.argsort(g["ts_ns"].to_numpy())
        rs = g["ts_ns"].to_numpy(np.int64)[order]
        re_max = np.maximum.accumulate(rs + g["dur_ns"].to_numpy(np.int64)[order])
        k = np.searchsorted(rs, end[idx], side="right") - 1
        out[idx] = (k >= 0) & (re_max[np.maximum(k, 0)] >= start[idx])
    return out


def _offcpu_at(tids: np.ndarray, start: np.ndarray, end: np.ndarray, offcpu: pd.DataFrame | None) -> list:
    """Per sample: (length ns, preempted) of the last off-CPU span of its thread that overlaps
    its window, (0, False) when none does (on a CPU throughout, or asleep across the whole
    window: a sleep that began before the recording); all None without off-CPU spans."""
    if offcpu is None or not len(offcpu):
        return [None] * len(tids)
    out: list = [(0, False)] * len(tids)
    for tid, g in offcpu.groupby("tid", sort=False):
        idx = np.flatnonzero(tids == tid)
        if not len(idx):
            continue
        g = g.sort_values("start_ns")
        st, en = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        pre = g["preempted"].to_numpy(bool)
        k = np.searchsorted(st, end[idx], side="right") - 1
        hit = (k >= 0) & (en[np.maximum(k, 0)] >= start[idx])
        for i, kk, h in zip(idx, k, hit):
            if h:
                out[i] = (int(en[kk] - st[kk]), bool(pre[kk]))
    return out


def python_threads(stacks: pd.DataFrame | None) -> dict[int, list[int]]:
    """Per process, the threads seen in the interpreter (a Python thread, whatever it runs)."""
    if stacks is None or not len(stacks):
        return {}
    return {int(p): sorted(int(t) for t in g.unique()) for p, g in stacks.groupby("pid")["tid"]}


def submitters(samples: pd.DataFrame) -> dict[tuple[int, int], str]:
    """(pid, round) -> the site of a thread (not a worker) that waited on a future or submitted
    one in that round, else in the nearest round that had one: the code behind the pool's work
    (a pool's submitting code changes rarely; a round catches the submitter between its
    submits and waits only now and then)."""
    m = samples[~samples["worker"] & ((samples["state"] == sf.FUTURE) | samples["executor"])]
    m = m.sort_values("state", key=lambda c: c != sf.FUTURE, kind="stable").drop_duplicates(["pid", "round"])
    out: dict[tuple[int, int], str] = {}
    for pid, g in m.groupby("pid"):
        g = g.sort_values("round")
        have, sites = g["round"].to_numpy(np.int64), g["function"].to_numpy()
        rounds = np.unique(samples.loc[samples["pid"] == pid, "round"].to_numpy(np.int64))
        k = np.clip(np.searchsorted(have, rounds), 0, len(have) - 1)
        prev = np.clip(k - 1, 0, len(have) - 1)
        pick = np.where(np.abs(have[prev] - rounds) < np.abs(have[k] - rounds), prev, k)
        out.update({(int(pid), int(r)): sites[i] for r, i in zip(rounds, pick)})
    return out


# ---------------------------------------------------------------- stage 2: reads -> sites

def _nearest(sample_t: np.ndarray, read_lo: np.ndarray, read_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each read [lo, hi]: the index of the nearest sample time (sorted ``sample_t``) and its
    distance (0 inside)."""
    k = np.searchsorted(sample_t, read_lo)
    before = np.clip(k - 1, 0, len(sample_t) - 1)
    after = np.clip(k, 0, len(sample_t) - 1)
    d_before = np.where(sample_t[before] <= read_lo, read_lo - sample_t[before], np.iinfo(np.int64).max)
    d_after = np.maximum(sample_t[after] - read_hi, 0)
    d_after = np.where(sample_t[after] >= read_lo, d_after, np.iinfo(np.int64).max)
    pick = np.where(d_after <= d_before, after, before)
    return pick, np.minimum(d_after, d_before)


def call_lines(busy: pd.DataFrame, calls: bool = True) -> dict[tuple[int, str], str]:
    """(pid, function) -> the site (its line) where that function's busy samples sat most often
    without the GIL -- inside a call that released it (a read) or re-taking the GIL after one --
    else most often at all (a function that reads holding the GIL).  A sample holding the GIL
    is executing bytecode between calls: its line is where the interpreter was, not a call.
    ``calls=False`` (page faults: taken with or without the GIL, by the code running): the line
    seen most often at all."""
    if not len(busy):
        return {}
    d = busy.assign(called=~busy["gil"] if calls else True)
    n = d.groupby(["pid", "function", "called", "site"], sort=False).size().reset_index(name="n")
    n = n.sort_values(["pid", "function", "called", "n", "site"], ascending=[True, True, False, False, True])
    top = n.drop_duplicates(["pid", "function"])
    return {(int(p), f): site for p, f, site in zip(top["pid"], top["function"], top["site"])}


def vote(t: np.ndarray, function: np.ndarray, k: int = VOTE_SAMPLES) -> np.ndarray:
    """Per sample (``t`` sorted): the position of the sample a read nearest it takes its site
    from -- the function most common among the ``k`` samples centred on it (a tie keeps its own
    function, else the tied function seen nearest); that function's sample nearest to it.

    One sample is where its thread was at one instant of a window of 10-50 ms, and a read far
    from every sample (a step loop sampled every 200 ms) takes a sample from another moment: a
    loop that passes through code that reads nothing between its reads (building a step's ids)
    had its reads named after that code whenever it was the nearest sample.  Such code is seen
    in few samples in a row, the code that reads in most.  The samples around are counted
    however far apart they are: a thread that waits between steps has its busy samples seconds
    apart (docs/model.md, "The code view")."""
    n = len(t)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    half = k // 2
    _, fn = np.unique(np.asarray(function, dtype=object).astype(str), return_inverse=True)
    pos = np.arange(n)[:, None] + np.arange(-half, half + 1)[None, :]  # (n, k) around each sample
    valid = (pos >= 0) & (pos < n)
    pos = np.clip(pos, 0, n - 1)
    dist = np.abs(t[pos] - t[:, None])
    f = fn[pos]
    votes = ((f[:, :, None] == f[:, None, :]) & valid[:, None, :]).sum(axis=2)  # per candidate: its function's votes
    votes = np.where(valid, votes, -1)
    best = votes.max(axis=1)
    own = votes[:, half] == best
    # among the winning function's samples (a tie: the one seen nearest), the nearest
    rank = np.where(votes == best[:, None], dist, np.iinfo(np.int64).max)
    chosen = pos[np.arange(n), rank.argmin(axis=1)]
    return np.where(own, np.arange(n), chosen)


def join_reads(samples: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Per read event: ``site``, ``submitter``, ``join`` (inside | near | pool | none), ``exact``.

    The function and call path come from the busy samples (of the read's thread, else of its
    pool) nearest the read: the most common function among the :data:`VOTE_SAMPLES` centred on
    the nearest (:func:`vote`); the line from :func:`call_lines` -- the line that function is
    seen in a call at most often -- unless the read slept in the kernel across the nearest
    sample's whole window (``exact``: the stack was read during that read; it keeps that
    sample's own line).  A page fault takes the line its function is seen at most often,
    whatever the GIL."""
    # busy: not waiting by its frames, and in the user's code (a stack of library frames only --
    # a thread starting, or a stack py-spy read torn -- names no site)
    busy = samples[~samples["state"].isin(sf.WAITING) & samples["user"]].sort_values("at_ns", kind="stable")
    busy = busy.assign(_k=np.arange(len(busy)))
    subs = submitters(samples)
    n = len(calls)
    picked = np.full(n, -1, dtype=np.int64)  # position in busy
    sub = np.full(n, None, dtype=object)
    how = np.full(n, "none", dtype=object)
    exact = np.zeros(n, dtype=bool)
    tid = calls["tid"].to_numpy()
    lo = calls["ts_ns"].to_numpy(np.int64)
    hi = lo + calls["dur_ns"].to_numpy(np.int64)
    slept = _slept(calls)

    def assign(rows: np.ndarray, pool: pd.DataFrame, own_thread: bool, near_ns: int = NEAR_NS) -> None:
        if not len(rows) or not len(pool):
            return
        t = pool["at_ns"].to_numpy(np.int64)
        pick, dist = _nearest(t, lo[rows], hi[rows])
        ok = dist <= near_ns
        rows, pick = rows[ok], pick[ok]
        begin = pool["start_ns"].to_numpy(np.int64)
        # exact: the read slept in the kernel across its nearest sample's whole window (a sample
        # of its own thread: another worker's stack says nothing of this read's moment)
        own = slept[rows] & (lo[rows] <= begin[pick]) & (hi[rows] >= t[pick]) & own_thread
        exact[rows] = own
        pick = np.where(own, pick, vote(t, pool["function"].to_numpy())[pick])
        picked[rows] = pool["_k"].to_numpy()[pick]
        # inside: the read overlaps the sample's window
        inside = (hi[rows] >= begin[pick]) & (lo[rows] <= t[pick])
        how[rows] = np.where(inside, "inside", "near") if own_thread else "pool"
        keys = list(zip(pool["pid"].to_numpy()[pick].tolist(), pool["round"].to_numpy()[pick].tolist()))
        worker = pool["worker"].to_numpy()[pick]
        sub[rows] = [subs.get(k) if w else None for k, w in zip(keys, worker)]

    by_tid = {t: g for t, g in busy.groupby("tid", sort=False)}
    for t in np.unique(tid):
        rows = np.flatnonzero(tid == t)
        assign(rows, by_tid.get(t, busy.iloc[0:0]), own_thread=True)
    workers = busy[busy["worker"]]
    left = np.flatnonzero(how == "none") if len(workers) else np.array([], dtype=np.int64)
    if len(left):  # a worker never seen busy: its pool's busy samples (the same code, other threads)
        seen_worker = set(samples.loc[samples["worker"], "tid"].tolist())
        left = left[np.isin(tid[left], list(seen_worker))]
        assign(left, workers, own_thread=False, near_ns=np.iinfo(np.int64).max)
    site = np.full(n, None, dtype=object)
    got = np.flatnonzero(picked >= 0)
    if len(got):
        k = picked[got]
        own = busy["site"].to_numpy()[k]
        # per busy sample (hundreds), then per read by index
        keys = list(zip(busy["pid"].to_numpy().tolist(), busy["function"].to_numpy(), busy["site"].to_numpy()))
        line, seen = (np.asarray([m.get((p, f), o) for p, f, o in keys], dtype=object)
                      for m in (call_lines(busy), call_lines(busy, calls=False)))
        fault = (calls["kind"] == "fault").to_numpy()[got] if "kind" in calls.columns else np.zeros(len(got), bool)
        site[got] = np.where(exact[got], own, np.where(fault, seen[k], line[k]))
    return pd.DataFrame({"site": site, "submitter": sub, "join": how, "exact": exact}, index=calls.index)


def read_sites(calls: pd.DataFrame, joined: pd.DataFrame, slow_ms: float, top: int = TOP_SITES,
               native: pd.Series | None = None) -> list[dict]:
    """Code sites ranked by slow-read time, miss time, then read time, each with its ``share`` of
    the reads; ``native``: each read's native frames (:func:`native_frames`), the site's most
    common native path."""
    dur = calls["dur_ns"].to_numpy(np.int64)
    slow = dur >= slow_ms * 1e6
    miss = (calls["pages_added"].fillna(0).to_numpy() > 0) if "pages_added" in calls.columns else np.zeros(len(calls), bool)
    df = pd.DataFrame({"site": joined["site"].fillna("(no sample)").to_numpy(),
                       "submitter": joined["submitter"].fillna("").to_numpy(), "dur": dur, "slow": slow, "miss": miss,
                       "inside": (joined["join"] == "inside").to_numpy(), "near": (joined["join"] == "near").to_numpy(),
                       "pool": (joined["join"] == "pool").to_numpy()})
    df["slow_dur"] = np.where(slow, dur, 0)
    df["miss_dur"] = np.where(miss, dur, 0)
    g = df.groupby(["site", "submitter"], sort=False).agg(
        reads=("dur", "size"), read_ns=("dur", "sum"), slow_reads=("slow", "sum"), slow_ns=("slow_dur", "sum"),
        misses=("miss", "sum"), miss_ns=("miss_dur", "sum"), inside=("inside", "sum"), near=("near", "sum"),
        pool=("pool", "sum")).reset_index()
    g = g.sort_values(["slow_ns", "miss_ns", "read_ns"], ascending=False).head(top)
    paths: dict = {}
    if native is not None and native.notna().any():
        has = native.notna().to_numpy()
        nd = pd.DataFrame({"site": df["site"].to_numpy()[has], "submitter": df["submitter"].to_numpy()[has],
                           "path": [native_path(t) for t in native.to_numpy()[has]]})
        for (site, sub), p in nd.groupby(["site", "submitter"])["path"]:
            c = p.value_counts()
            paths[(site, sub)] = {"path": c.index[0], "stacks": int(c.iloc[0]), "of": int(len(p))}
    return [{"site": r.site, "submitted_from": r.submitter or None, "reads": int(r.reads),
             "share": round(int(r.reads) / len(df), 4), "native": paths.get((r.site, r.submitter)),
             "read_ms": round(r.read_ns / 1e6, 3), "slow_reads": int(r.slow_reads), "slow_ms": round(r.slow_ns / 1e6, 3),
             "misses": int(r.misses), "miss_ms": round(r.miss_ns / 1e6, 3),
             "joined": {"inside": int(r.inside), "near": int(r.near), "pool": int(r.pool)}}
            for r in g.itertuples(index=False)]


# ---------------------------------------------------------------- stage 2b: native frames

#: native frames of a path shown (innermost first, from the first frame outside the C library)
NATIVE_PATH_FRAMES = 5
_LIBC = ("libc.so", "libc-", "libpthread", "ld-linux")


def native_frames(native: pd.DataFrame | None, calls: pd.DataFrame) -> pd.Series:
    """Per read event: the frames text of its own native stack (samples/native_stacks: the probe
    copied the stack at that call, so (pid, tid, ts_ns) is exact), else None."""
    out = pd.Series([None] * len(calls), index=calls.index, dtype=object)
    if native is None or not len(native) or not len(calls):
        return out
    key = ["pid", "tid", "ts_ns"]
    right = native[key + ["frames"]].astype({k: "int64" for k in key}).drop_duplicates(key)
    got = calls[key].astype("int64").merge(right, on=key, how="left")["frames"].to_numpy(dtype=object)  # keeps order
    out[:] = [g if isinstance(g, str) and g else None for g in got]
    return out


def native_path(text: str, frames: int = NATIVE_PATH_FRAMES) -> str:
    """``f1 < f2 < ...``: the functions from the first one outside the C library (the code that
    made the call) outward."""
    fs = [ln.split("\t") for ln in text.split("\n") if ln]
    k = next((i for i, f in enumerate(fs) if len(f) > 1 and not any(x in f[1] for x in _LIBC)), 0)
    return " < ".join(f[0] for f in fs[k:k + frames])


def native_sites(calls: pd.DataFrame, native: pd.Series, slow_ms: float, top: int = TOP_SITES) -> list[dict]:
    """Native call paths of the reads that have a stack, ranked by slow-read time then read time."""
    has = native.notna().to_numpy()
    if not has.any():
        return []
    dur = calls["dur_ns"].to_numpy(np.int64)[has]
    df = pd.DataFrame({"path": [native_path(t) for t in native.to_numpy()[has]], "dur": dur,
                       "slow": np.where(dur >= slow_ms * 1e6, dur, 0)})
    g = df.groupby("path").agg(stacks=("dur", "size"), read_ns=("dur", "sum"), slow_ns=("slow", "sum")).reset_index()
    g = g.sort_values(["slow_ns", "read_ns"], ascending=False).head(top)
    return [{"path": r.path, "function": r.path.split(" < ")[0], "stacks": int(r.stacks),
             "share": round(r.stacks / int(has.sum()), 3), "read_ms": round(r.read_ns / 1e6, 3)}
            for r in g.itertuples(index=False)]


# ---------------------------------------------------------------- stage 3: the step's waits

def in_batches(t: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per time: the index of the batch holding it, -1 if none (batches sorted, disjoint)."""
    k = np.searchsorted(start, t, side="right") - 1
    ok = (k >= 0) & (t <= end[np.maximum(k, 0)])
    return np.where(ok, k, -1)


def step_thread(samples: pd.DataFrame) -> int | None:
    """The thread (not a pool worker) with the most samples inside batches outside a plain
    wait: the one that runs the step (it submits, gathers, reads or computes)."""
    m = samples[(samples["batch"] >= 0) & ~samples["worker"] & ~samples["state"].isin([sf.WAIT, sf.BLOCKED])]
    if not len(m):
        return None
    return int(m["tid"].value_counts().index[0])


def step_waits(samples: pd.DataFrame, tid: int, step_ns: float, top: int = TOP_WAITS) -> list[dict]:
    """The step thread's share of step time per (code site, state), largest first."""
    m = samples[(samples["tid"] == tid) & (samples["batch"] >= 0)]
    if not len(m):
        return []
    g = m.groupby(["site", "state"], sort=False)
    n = g.size().sort_values(ascending=False)
    via = g["via"].agg(lambda v: v.mode().iloc[0])  # the machinery the site was in, most often
    return [{"site": site, "state": state, "via": via[(site, state)] or None, "samples": int(k),
             "share": round(k / len(m), 3), "ms": round(k / len(m) * step_ns / 1e6, 3)}
            for (site, state), k in n.head(top).items()]


def python_scheduling(samples: pd.DataFrame, tid: int | None, step_ns: float, interval_ns: float) -> dict:
    """GIL waits (step thread: its share of step time; workers: samples x interval) and the
    executor's submit / complete time, inside batches."""
    inb = samples[samples["batch"] >= 0]
    mine = inb[inb["tid"] == tid] if tid is not None else inb.iloc[0:0]
    step_share = float((mine["state"] == sf.GIL_WAIT).mean()) if len(mine) else None
    workers = inb[inb["worker"]]
    rounds = inb["round"].nunique()
    return {
        "step_thread_gil_wait_share": None if step_share is None else round(step_share, 3),
        "step_thread_gil_wait_ms": None if step_share is None else round(step_share * step_ns / 1e6, 3),
        "workers_gil_wait_ms": round(int((workers["state"] == sf.GIL_WAIT).sum()) * interval_ns / 1e6, 3),
        "executor_ms": round(int(inb["executor"].sum()) * interval_ns / 1e6, 3),
        "rounds_in_batches": int(rounds),
        "gil_held_share": round(float(inb.groupby("round")["gil"].any().mean()), 3) if rounds else None,
    }


def scheduling_residual(sched: dict, share: dict | None, step_ns: float) -> dict:
    """The cause split's python-scheduling time against what the samples saw of it: the step
    thread's GIL waits and the executor's submit / complete; the rest is named the residual
    (waits on the pool's wake-ups and its workers' own time, other threads' work)."""
    if not share or share.get("python-scheduling") is None:
        return {}
    split_ms = float(share["python-scheduling"]) * step_ns / 1e6
    seen = (sched.get("step_thread_gil_wait_ms") or 0.0) + (sched.get("executor_ms") or 0.0)
    return {"split_ms": round(split_ms, 3), "seen_gil_and_executor_ms": round(seen, 3),
            "residual_ms": round(max(split_ms - seen, 0.0), 3)}


# ---------------------------------------------------------------- the whole view

def code_view(stacks: pd.DataFrame | None, calls: pd.DataFrame, batches: pd.DataFrame | None,
              slow_ms: float, pid: int | None = None, meta: dict | None = None,
              offcpu: pd.DataFrame | None = None, share: dict | None = None,
              native: pd.DataFrame | None = None) -> dict:
    """The ``code_view`` JSON of a trace: ``read_sites``, ``step_thread``, ``step_waits``,
    ``python_scheduling``, ``python_threads``, ``fix``; ``note`` alone when there are no stacks.
    ``share``: the cause split (batch-tail's ``share``), to set the samples against."""
    sampled = (meta or {}).get("stacks")
    if pid is None and native is not None and len(native) and (stacks is None or not len(stacks)):
        pid = int(calls["pid"].mode().iloc[0]) if "pid" in calls.columns and len(calls) else int(native["pid"].iloc[0])
    ncalls = calls[calls["pid"] == pid] if pid is not None and "pid" in calls.columns else calls
    nat = native_frames(native, ncalls)
    nsites = native_sites(ncalls, nat, slow_ms)
    if stacks is None or not len(stacks):
        why = "no Python stacks in this trace"
        if isinstance(sampled, dict) and sampled.get("not_sampled"):
            why += " (" + "; ".join(sampled["not_sampled"].values()) + ")"
        elif sampled is None and meta is not None and "stacks" in meta:
            why += " (recorded with --stack-hz 0, or py-spy missing)"
        return {"note": why, "native_read_sites": nsites} if nsites else {"note": why}
    if pid is None:
        pid = int(calls["pid"].mode().iloc[0]) if "pid" in calls.columns and len(calls) else int(stacks["pid"].iloc[0])
    stacks = stacks[stacks["pid"] == pid]
    calls = calls[calls["pid"] == pid] if "pid" in calls.columns else calls
    if not len(stacks):
        why = ((sampled or {}).get("not_sampled") or {}) if isinstance(sampled, dict) else {}
        reason = why.get(pid, why.get(str(pid)))  # meta.json keys are strings
        out = {"note": f"no Python stacks of pid {pid}" + (f" ({reason})" if reason else ""), "python_threads": {}}
        return out | ({"native_read_sites": nsites} if nsites else {})
    samples = prepare_samples(stacks, calls, offcpu)
    start = batches["start_ns"].to_numpy(np.int64) if batches is not None and len(batches) else np.zeros(0, np.int64)
    end = batches["end_ns"].to_numpy(np.int64) if batches is not None and len(batches) else np.zeros(0, np.int64)
    order = np.argsort(start)
    start, end = start[order], end[order]
    samples["batch"] = in_batches(samples["at_ns"].to_numpy(), start, end) if len(start) else -1
    round_ts = samples.groupby("round")["end_ns"].max().sort_values().to_numpy()
    interval = float(np.median(np.diff(round_ts))) if len(round_ts) > 1 else float("nan")
    window = float(samples["end_ns"].sub(samples["start_ns"]).median())
    joined = join_reads(samples, calls) if len(calls) else pd.DataFrame(columns=["site", "submitter", "join", "exact"])
    sites = read_sites(calls, joined, slow_ms, native=nat.reindex(calls.index)) if len(calls) else []
    tid = step_thread(samples)
    step_ns = float((end - start).sum())
    waits = step_waits(samples, tid, step_ns) if tid is not None else []
    sched = python_scheduling(samples, tid, step_ns, interval)
    name = samples.loc[samples["tid"] == tid, "name"].iloc[0] if tid is not None else None
    view = {
        "pid": pid,
        "stacks": {"rounds": int(samples["round"].nunique()), "samples": int(len(samples)),
                   "interval_ms": round(interval / 1e6, 2) if np.isfinite(interval) else None,
                   "window_ms_p50": round(window / 1e6, 2), "gil_from": "py-spy",
                   "states_from": "py-spy and the off-CPU spans" if offcpu is not None and len(offcpu) else "py-spy"},
        "python_threads": python_threads(stacks),
        "join": {k: int((joined["join"] == k).sum()) for k in ("inside", "near", "pool", "none")} | {
            "reads": int(len(joined)), "exact": int(joined["exact"].sum()), "near_ms": NEAR_NS / 1e6},
        "read_sites": sites,
        "native_read_sites": nsites,
        "step_thread": None if tid is None else {"tid": tid, "name": name, "batches": int(len(start)),
                                                 "samples": int(((samples["tid"] == tid) & (samples["batch"] >= 0)).sum())},
        "step_waits": waits,
        "python_scheduling": sched,
    }
    view["fix"] = code_fix(view, calls, start, end)
    view["python_scheduling"].update(scheduling_residual(sched, share, step_ns))
    step_p50 = float(np.median(end - start)) if len(start) else 0.0
    if len(start) and window > step_p50:
        view["note"] = (f"the batches (p50 {duration(step_p50 / 1e6)}) are shorter than a stack sample's window "
                        f"(p50 {duration(window / 1e6)}): a sample near a batch's edge may belong to the time "
                        "between batches, so the step's split is blurred (docs/model.md, \"The code view\")")
    return view


def code_fix(view: dict, calls: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> str | None:
    """The fix, naming the code site where the step waits (and where the reads are issued)."""
    waits = view.get("step_waits") or []
    if not waits:
        return None
    w = waits[0]
    st = view["step_thread"]
    where = f"the step thread ({st['name'] or st['tid']}) spends {pct(w['share'])} of step time {w['state']} at {w['site']}"
    site = (view.get("read_sites") or [{}])[0]
    n_steps = max(1, len(start))
    inb = in_batches(calls["ts_ns"].to_numpy(np.int64), start, end) >= 0 if len(start) and len(calls) else np.zeros(len(calls), bool)
    reads_per_step = int(inb.sum()) / n_steps
    miss = float((calls.loc[inb, "pages_added"].fillna(0) > 0).mean()) if "pages_added" in calls.columns and inb.any() else None
    reads = f"; its reads are issued at {site['site']} ({pct(site['share'])} of them)" if site.get("site") else ""
    if site.get("submitted_from"):
        reads += f" on pool workers submitted from {site['submitted_from']}"
    if w["state"] == sf.FUTURE:
        cached = miss is not None and miss < 0.05
        then = ("the rows were cached (" + pct(miss) + " of reads missed): read them inline with RWF_NOWAIT first, "
                "the pool only for the misses" if cached else
                "make the pool's reads cheaper (misses: " + (pct(miss) if miss is not None else "unknown") + ") or fewer")
        return f"{where} ({reads_per_step:,.0f} reads a step){reads}; {then}"
    if w["state"] == sf.GIL_WAIT:
        return (f"{where}: another Python thread holds the GIL then; move the competing Python work off the "
                f"step's path or release the GIL in it{reads}")
    if w["state"] in (sf.CPU, sf.NATIVE):
        return f"{where}{reads}; that code is the step's cost: make it cheaper (time per step {duration(float((end - start).mean()) / 1e6)})"
    if w["state"] == sf.READ:
        return f"{where}{reads}; the reads block in the kernel: see the read path's cause above"
    return f"{where}{reads}"


def json_keys(trace, batches: pd.DataFrame | None, slow_ms: float, summary: dict | None = None) -> dict:
    """``code_view`` for diagnose --json and batch-tail --json: the view of the slowest process
    (the only one, usually); a note when the trace has no stacks."""
    try:
        stacks = trace.samples("stacks")
        offcpu = trace.samples("offcpu") if stacks is not None and len(stacks) else None
        native = trace.samples("native_stacks")
    except Exception as exc:  # an unreadable series: the other keys still stand
        return {"code_view": {"note": f"Python stacks not read ({type(exc).__name__})"}}
    pid = (summary or {}).get("slowest_process")
    b = batches
    if b is not None and pid is not None and "pid" in b.columns:
        b = b[b["pid"] == pid]
    return {"code_view": code_view(stacks, trace.calls, b, slow_ms, pid=pid, meta=getattr(trace, "meta", None),
                                   offcpu=offcpu, share=(summary or {}).get("share"), native=native)}
