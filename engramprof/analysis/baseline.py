"""The device's normal service per I/O size: the baseline that storage time is measured against
(docs/model.md, "The device baseline").

A miss waits for the device.  How long a healthy device takes depends on how much it reads: a
4 KiB read is served in tens of µs on an SSD, a 1 MiB readahead bio in a few ms.  So the normal
service is kept per size class (log2 of the bytes one I/O reads), and a miss is compared with
the normal service of its own size:

1. **the trace's own bios**, of every kind of read event (calls, page faults, io_uring,
   libaio): per event, queue -> complete per bio (``bio_ns / bio_count``) and bytes per bio
   (pages inserted x page size, or the bytes returned when the read bypassed the page cache);
   per class, the 90th percentile weighted by bios (``NORMAL_QUANTILE``: the upper edge of the
   device's own normal range, so its ordinary spread is not "slower than normal");
2. else **the device's own counters** over the window (``samples/disks``, /proc/diskstats):
   the time the device spent per completed read and the bytes per read, of the devices the
   trace's files live on (every device that read, when the files' device is not a block
   device);
3. else nothing: the caller falls back to its own rule.

A class without data takes the nearest measured class below it scaled by size (reads bigger
than any measured are bandwidth-bound), or the nearest one above it unscaled (smaller reads
are not faster than the latency floor).  Every normal is capped at :func:`ceiling_ns` of its
size: a device slower than ``LATENCY_CEILING_NS`` plus ``THROUGHPUT_FLOOR`` per byte is slow
whatever its own history says (a trace made entirely on a slow device has no healthy history).

``normal_ns_for(bytes)`` is the one function other analyses call (e.g. for O_DIRECT reads,
whose whole time is the device's).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: a miss I/O slower than this (plus its size at THROUGHPUT_FLOOR) is never normal service
LATENCY_CEILING_NS = 1_000_000.0
#: bytes per second below which a device is slow for a large read (a healthy SATA disk streams
#: more; NVMe, virtio and network block devices far more)
THROUGHPUT_FLOOR = 100e6
#: the quantile of the trace's own bio service (per size class, weighted by bios) taken as
#: normal: a healthy device's service is a distribution, and a miss in its upper tail is the
#: device as it normally is, not a slower device (against the median, a device whose reads
#: vary as a queue's do, exponentially, put half of every miss's time in storage)
NORMAL_QUANTILE = 0.9
#: the smallest and largest size classes (log2 bytes): 512 B .. 64 MiB
MIN_CLASS, MAX_CLASS = 9, 26
SECTOR = 512


def ceiling_ns(nbytes) -> np.ndarray:
    """The slowest service still taken as normal for a read of ``nbytes``."""
    return LATENCY_CEILING_NS + np.maximum(np.asarray(nbytes, dtype=np.float64), 0.0) / THROUGHPUT_FLOOR * 1e9


def queued_ns(beside_bytes) -> np.ndarray:
    """What a read may wait, on a healthy device, behind ``beside_bytes`` of the target's own
    reads in flight beside it: those bytes at THROUGHPUT_FLOOR.  A deep queue of the reader's
    own readahead windows (a pool of threads faulting 8 MiB windows) makes each read wait for
    the others; a device that streams them at its normal rate is not slow."""
    return np.maximum(np.nan_to_num(np.asarray(beside_bytes, dtype=np.float64)), 0.0) / THROUGHPUT_FLOOR * 1e9


def size_class(nbytes) -> np.ndarray:
    """log2 size class of a read of ``nbytes`` (rounded up: 4 KiB -> 12, 5 KiB -> 13)."""
    b = np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0)
    return np.clip(np.ceil(np.log2(b)), MIN_CLASS, MAX_CLASS).astype(np.int64)


@dataclass
class DeviceBaseline:
    """Normal service per size class: ``normal_ns[c - MIN_CLASS]`` (NaN: not measured)."""

    measured_ns: np.ndarray  # per class, the measured normal service (NaN: none)
    ios: np.ndarray  # per class, the I/Os it rests on
    source: str | None  # what it was measured from (None: nothing)
    devices: list = field(default_factory=list)  # the devices whose counters were used

    @property
    def known(self) -> bool:
        return bool(np.isfinite(self.measured_ns).any())

    def normal_ns_for(self, nbytes) -> np.ndarray:
        """The normal service of one read of ``nbytes`` (vectorised; NaN where nothing is known)."""
        b = np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0)
        c = size_class(b)
        if not self.known:
            return np.full(c.shape, np.nan)
        per_class = self._filled()
        return np.minimum(per_class[c - MIN_CLASS], ceiling_ns(b))

    def _filled(self) -> np.ndarray:
        """Every class: measured, else scaled from the nearest measured class below (by size),
        else the nearest one above (unscaled)."""
        m = self.measured_ns
        have = np.flatnonzero(np.isfinite(m))
        out = m.copy()
        for i in np.flatnonzero(~np.isfinite(m)):
            below = have[have < i]
            if len(below):
                j = below[-1]
                out[i] = m[j] * 2.0 ** (i - j)
            else:
                out[i] = m[have[0]]
        return out

    def as_json(self) -> dict:
        rows = [{"bytes": 1 << (i + MIN_CLASS), "normal_us": round(float(v) / 1e3, 1), "ios": int(n),
                 "ceiling_us": round(float(ceiling_ns(1 << (i + MIN_CLASS))) / 1e3, 1)}
                for i, (v, n) in enumerate(zip(self.measured_ns, self.ios)) if np.isfinite(v)]
        return {"source": self.source, "classes": rows, "devices": self.devices,
                "latency_ceiling_us": LATENCY_CEILING_NS / 1e3, "throughput_floor_mb_s": THROUGHPUT_FLOOR / 1e6}


def _empty() -> DeviceBaseline:
    n = MAX_CLASS - MIN_CLASS + 1
    return DeviceBaseline(np.full(n, np.nan), np.zeros(n, dtype=np.int64), None)


def weighted_quantile_by_class(cls: np.ndarray, value: np.ndarray, weight: np.ndarray,
                               q: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Per class (MIN_CLASS..MAX_CLASS), the ``weight``-weighted ``q`` quantile of ``value``
    (the smallest value with at least ``q`` of the weight at or below it) and the total weight."""
    n = MAX_CLASS - MIN_CLASS + 1
    med, tot = np.full(n, np.nan), np.zeros(n, dtype=np.int64)
    for c in np.unique(cls):
        sel = cls == c
        v, w = value[sel], weight[sel]
        o = np.argsort(v, kind="stable")
        cw = np.cumsum(w[o])
        k = int(np.searchsorted(cw, cw[-1] * q))
        med[c - MIN_CLASS] = float(v[o][min(k, len(o) - 1)])
        tot[c - MIN_CLASS] = int(cw[-1])
    return med, tot


def bytes_per_bio(pages_added: np.ndarray, bio_count: np.ndarray, ret: np.ndarray | None) -> np.ndarray:
    """Bytes one bio of an event read: the pages it inserted, or (nothing inserted: the page
    cache was bypassed) the bytes it returned, over its bios."""
    pages = np.nan_to_num(np.asarray(pages_added, dtype=np.float64))
    nbytes = pages * PAGE_SIZE
    if ret is not None:
        r = np.nan_to_num(np.asarray(ret, dtype=np.float64))
        nbytes = np.where(pages > 0, nbytes, np.maximum(r, 0.0))
    n = np.maximum(np.nan_to_num(np.asarray(bio_count, dtype=np.float64)), 1.0)
    return nbytes / n


def _positive(col: pd.Series) -> np.ndarray:
    """Per row, the value is > 0 (a missing one is not): on a plain integer column without a
    float copy of it."""
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "iu":
        return col.to_numpy() > 0
    return np.nan_to_num(col.to_numpy(dtype=np.float64, na_value=np.nan)) > 0


def _floats_at(col: pd.Series, rows: np.ndarray, nan: bool = False) -> np.ndarray:
    """float64 values of ``rows`` (``nan``: missing values stay NaN, else 0)."""
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "iu":
        return col.to_numpy()[rows].astype(np.float64)
    v = col.to_numpy(dtype=np.float64, na_value=np.nan)[rows]
    return v if nan else np.nan_to_num(v)


def from_events(calls: pd.DataFrame) -> DeviceBaseline:
    """The baseline from the trace's own bios (every read event that queued a timed bio)."""
    out = _empty()
    if not {"bio_count", "bio_ns", "pages_added"} <= set(calls.columns) or calls.empty:
        return out
    # the rows with timed bios first (a few of millions), then only those converted to floats
    ok = (_positive(calls["bio_count"]) & _positive(calls["bio_ns"]))
    if not ok.any():
        return out
    rows = np.flatnonzero(ok)
    n = _floats_at(calls["bio_count"], rows)
    t = _floats_at(calls["bio_ns"], rows)
    ret = _floats_at(calls["ret"], rows, nan=True) if "ret" in calls.columns else None
    per_bio_bytes = bytes_per_bio(_floats_at(calls["pages_added"], rows, nan=True), n, ret)
    keep = per_bio_bytes > 0
    if not keep.any():
        return out
    normal, tot = weighted_quantile_by_class(size_class(per_bio_bytes[keep]), (t / n)[keep], n[keep].astype(np.int64),
                                             NORMAL_QUANTILE)
    return DeviceBaseline(normal, tot, f"the trace's own bios (queue -> complete per bio, p{NORMAL_QUANTILE * 100:.0f} "
                                       "per size)")


def from_disk_counters(disks: pd.DataFrame | None, devs=None, window: tuple[int, int] | None = None) -> DeviceBaseline:
    """The baseline from the devices' own counters (samples/disks): time per completed read at
    the mean read size, over ``window`` (CLOCK_MONOTONIC ns), of the devices ``devs``
    (userspace dev_t; every device that read when none of them is in the samples)."""
    out = _empty()
    if disks is None or disks.empty or not {"dev", "reads", "read_sectors", "read_ticks_ms"} <= set(disks.columns):
        return out
    mine = _devices_in_window(disks, devs, window)
    g = mine.groupby("dev").agg(reads=("reads", "sum"), sectors=("read_sectors", "sum"), ticks=("read_ticks_ms", "sum"),
                                name=("name", "last") if "name" in mine.columns else ("dev", "last"))
    g = g[(g["reads"] > 0) & (g["ticks"] > 0)]
    if g.empty:
        return out
    reads = g["reads"].to_numpy(np.float64)
    size = g["sectors"].to_numpy(np.float64) * SECTOR / reads
    service = g["ticks"].to_numpy(np.float64) * 1e6 / reads
    med, tot = weighted_quantile_by_class(size_class(size), service, reads.astype(np.int64))
    names = [{"dev": f"{os.major(int(k))}:{os.minor(int(k))}", "name": str(r["name"]), "reads": int(r["reads"]),
              "bytes_per_read": int(r["sectors"] * SECTOR / r["reads"]),
              "service_us_per_read": round(float(r["ticks"]) * 1e3 / float(r["reads"]), 1)} for k, r in g.iterrows()]
    return DeviceBaseline(med, tot, "the device's own counters (/proc/diskstats: time per completed read at "
                                    "its mean size)", names)


def sample_rows_over(samples: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The rows of a sampled series (counters as deltas over the interval ending at ``ts_ns``)
    that cover ``window`` (CLOCK_MONOTONIC ns): the rounds inside it, plus the one after it."""
    ts = samples["ts_ns"].to_numpy(np.int64)
    later = ts[ts > window[1]]
    end = later.min() if len(later) else window[1]
    return samples[(ts > window[0]) & (ts <= end)]


def _devices_in_window(disks: pd.DataFrame, devs, window: tuple[int, int] | None) -> pd.DataFrame:
    """The rows of samples/disks over ``window`` (CLOCK_MONOTONIC ns) of the devices ``devs``
    (userspace dev_t), or of every device when none of them read in it."""
    d = disks if window is None or "ts_ns" not in disks.columns else sample_rows_over(disks, window)
    want = {int(x) for x in (devs if devs is not None else []) if x is not None and not pd.isna(x)}
    mine = d[d["dev"].isin(want)] if want else d.iloc[0:0]
    if mine["reads"].fillna(0).sum() <= 0:
        mine = d
    return mine


#: the write counters of samples/disks (traces before them have none)
WRITE_COLUMNS = ("writes", "write_sectors", "flushes")


def device_traffic(disks: pd.DataFrame | None, devs=None, window: tuple[int, int] | None = None) -> dict | None:
    """What the devices the trace's files live on served over the window besides, as they
    count it (samples/disks): reads, writes and cache flushes, per device and in all.  A read
    queued behind writeback or a flush waits for them: a device slower than its normal service
    while it wrote is not the same story as a slow device.  None: no write counters (an older
    trace, no samples).  ``devs``: the devices, or a function returning them (called only when
    there are counters to select from)."""
    if disks is None or disks.empty or not {"dev", "reads", "read_sectors", *WRITE_COLUMNS} <= set(disks.columns):
        return None
    mine = _devices_in_window(disks, devs() if callable(devs) else devs, window)
    if mine.empty:
        return None
    g = mine.groupby("dev").agg(name=("name", "last") if "name" in mine.columns else ("dev", "last"),
                                reads=("reads", "sum"), read_sectors=("read_sectors", "sum"),
                                writes=("writes", "sum"), write_sectors=("write_sectors", "sum"),
                                flushes=("flushes", "sum"))
    per = [{"dev": f"{os.major(int(k))}:{os.minor(int(k))}", "name": str(r["name"]), "reads": int(r["reads"]),
            "read_bytes": int(r["read_sectors"]) * SECTOR, "writes": int(r["writes"]),
            "write_bytes": int(r["write_sectors"]) * SECTOR, "flushes": int(r["flushes"])} for k, r in g.iterrows()]
    total = {k: sum(d[k] for d in per) for k in ("reads", "read_bytes", "writes", "write_bytes", "flushes")}
    seconds = (window[1] - window[0]) / 1e9 if window is not None else None
    return {**total, "seconds": seconds, "devices": per}


def writing_devices(traffic: dict) -> str:
    """The names of the devices of :func:`device_traffic` that wrote or flushed ("vda, nvme0n1")."""
    return ", ".join(d["name"] for d in traffic.get("devices", []) if d.get("writes") or d.get("flushes"))


def device_baseline(calls: pd.DataFrame, disks: pd.DataFrame | None = None,
                    window: tuple[int, int] | None = None) -> DeviceBaseline:
    """The device's normal service per size class: the trace's own bios, else the devices'
    counters, else nothing (``known`` false)."""
    own = from_events(calls)
    if own.known:
        return own
    devs = calls["dev"].dropna().unique() if "dev" in calls.columns else None
    return from_disk_counters(disks, devs, window)
