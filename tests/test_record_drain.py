"""engramprof/record/decode.py's drain step shared by the off-CPU, eviction and page-cache
recorders (drain_into, LostRecords): the window applied or explicitly not, each decoder's
table to its sample, a ``*_lost`` row only when the kernel's count grew.  No root needed."""
from __future__ import annotations

import time

import numpy as np

from engramprof.record.decode import LostRecords, WindowStart, drain_into


class Sink:
    def __init__(self):
        self.added: list[tuple[str, object]] = []

    def add_samples(self, name, table):
        self.added.append((name, table))


class Probe:
    def __init__(self):
        self.lost = 0

    def lost_records(self):
        return self.lost


RECS = np.array([(5,), (10,), (20,)], dtype=[("ts_ns", np.uint64)])


def _ts(recs):
    return recs["ts_ns"].tolist()


def test_a_window_drops_and_counts_what_began_before_it():
    sink, probe, w = Sink(), Probe(), WindowStart(10)
    drain_into(sink, probe, RECS, (("a", _ts),), LostRecords("a_lost"), window=w)
    assert sink.added == [("a", [10, 20])]
    assert w.partial_at_start == 1


def test_no_window_keeps_the_records_from_before_it():
    # the eviction recorder: an eviction before the window explains a miss inside it
    sink = Sink()
    drain_into(sink, Probe(), RECS, (("a", _ts), ("b", lambda r: None)), LostRecords("a_lost"), window=None)
    assert sink.added == [("a", [5, 10, 20])]  # "b" decoded to nothing: no table


def test_lost_rows_only_when_the_count_grew_spanning_since_the_last_check():
    sink, probe = Sink(), Probe()
    t0 = time.monotonic_ns()
    lost = LostRecords("x_lost", checked_ns=t0)
    drain_into(sink, probe, None, (("x", _ts),), lost, window=None)  # not drained, nothing lost
    assert sink.added == [] and lost.intervals == 0 and lost.checked_ns >= t0
    t1 = lost.checked_ns
    probe.lost = 7
    drain_into(sink, probe, None, (("x", _ts),), lost, window=None)
    (name, table), = sink.added
    assert name == "x_lost" and lost.intervals == 1 and lost.seen == 7
    row = table.to_pylist()[0]
    assert row["start_ns"] == t1 and row["end_ns"] == lost.checked_ns and row["lost"] == 7
    drain_into(sink, probe, RECS[:0], (("x", lambda r: None),), lost, window=WindowStart(0))
    assert len(sink.added) == 1  # unchanged count: no second row
    probe.lost = 9
    drain_into(sink, probe, None, (), lost, window=None)
    assert sink.added[-1][1].to_pylist()[0]["lost"] == 2 and lost.intervals == 2



def test_recorder_totals_keep_the_last_reading_once_closed_or_unreadable():
    from engramprof.record.decode import ProbeTotals

    class Live:
        bpf = object()
        n = 0

        def totals(self):
            self.n += 1
            if self.n > 1:
                raise OSError("map gone")
            return {"spans": 4}

    class Recorder(ProbeTotals):
        def __init__(self):
            self.probe = Live()
            self._totals = {}

    r = Recorder()
    assert r.totals() == {"spans": 4}
    assert r.totals() == {"spans": 4} and r.probe.n == 2  # unreadable now: the reading before
    r.probe.bpf = None
    assert r.totals() == {"spans": 4} and r.probe.n == 2
    r.probe = None
    t = r.totals()
    t["spans"] = 0  # a copy: the recorder's reading stays
    assert r.totals() == {"spans": 4}
