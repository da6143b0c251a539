"""Reading a bundle for the analysis: only the columns it needs, text kept as categories,
part after part into preallocated arrays (no root needed)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engramprof import trace


def _part(n: int, t0: int, paths: list[str], rng) -> pd.DataFrame:
    df = pd.DataFrame({c: np.zeros(n, dtype=trace.CALL_SCHEMA.field(c).type.to_pandas_dtype())
                       for c in trace.CALL_SCHEMA.names})
    df["ts_ns"] = t0 + np.arange(n) * 1000
    df["dur_ns"] = rng.integers(1000, 5000, n)
    df["tid"] = rng.integers(100, 132, n)
    df["offset"] = rng.integers(0, 1 << 20, n) * 4096
    df["path"] = rng.choice(paths, n)
    df["syscall"], df["tensor"], df["row"] = "preadv2", rng.choice(["a", "b"], n), rng.integers(0, 99, n)
    df["bio_ns"] = rng.integers(0, 10_000, n)
    return df


def test_selected_columns_with_categories_equal_the_full_load(tmp_path):
    rng = np.random.default_rng(0)
    w = trace.TraceWriter(tmp_path / "t")
    # three parts with different path dictionaries
    for i, paths in enumerate((["/a"], ["/b", "/a"], ["/c"])):
        w.append_calls(_part(400, 10**9 + i * 10**6, paths, rng))
    w.close()
    full = trace.load(tmp_path / "t")
    part = trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True).calls
    assert list(part.columns) == [c for c in trace.EVENT_READ_COLUMNS if c in full.columns]
    assert "size" not in part.columns and "fd" not in part.columns
    for c in ("path", "tensor", "kind"):
        assert isinstance(part[c].dtype, pd.CategoricalDtype), c
        assert part[c].astype(object).tolist() == full[c].astype(object).tolist(), c
    for c in part.columns:
        if c in ("uring_path", "direct"):  # null for every kind but io_uring
            assert (part[c].isna().to_numpy() == full[c].isna().to_numpy()).all(), c
            assert part[c].dropna().astype(object).tolist() == full[c].dropna().astype(object).tolist(), c
        elif c not in ("path", "tensor", "kind"):
            np.testing.assert_array_equal(part[c].to_numpy(), full[c].to_numpy(), err_msg=c)
    # compact: int64 columns whose values fit are int32; entry times and big offsets are not
    assert part["dur_ns"].dtype == np.int32 and part["row"].dtype == np.int32
    assert part["ts_ns"].dtype == np.int64
    assert part["offset"].max() > 2**31 and part["offset"].dtype == np.int64
    # evidence columns: the narrowest type their values fit (bio_ns < 10,000 here: int16)
    assert part["bio_ns"].dtype == np.int16 and part["bio_ns"].max() > 127


def test_nulls_in_one_part_and_a_column_missing_from_another(tmp_path):
    # an evidence column the kernel could not measure is all-null in the parts written then;
    # a part from another writer may lack a column: both read as float with NaN, like load()
    rng = np.random.default_rng(1)
    w = trace.TraceWriter(tmp_path / "t")
    w.append_calls(_part(50, 10**9, ["/a"], rng))
    w.close()
    cd = tmp_path / "t" / "calls"
    nulls = _part(30, 2 * 10**9, ["/a"], rng)
    tab = pa.Table.from_pandas(nulls, preserve_index=False)
    tab = tab.set_column(tab.schema.get_field_index("bio_ns"), "bio_ns", pa.nulls(30, pa.int64()))
    tab = tab.drop_columns(["reclaim_ns"])
    pq.write_table(tab, cd / "part-000001.parquet")
    got = trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True).calls
    assert len(got) == 80
    assert got["bio_ns"].dtype == np.float64 and got["bio_ns"].isna().sum() == 30
    assert got["reclaim_ns"].isna().sum() == 30 and got["reclaim_ns"].iloc[:50].eq(0).all()
    assert got["dur_ns"].dtype == np.int32


def test_parts_read_side_by_side_equal_parts_read_one_after_another(tmp_path, monkeypatch):
    # the column types are planned from the parts' footers and the parts decoded on threads;
    # where a footer has no statistics (another writer) the parts are read one after another:
    # both give the frame of a full load, part boundaries and dictionaries included
    from engramprof.trace import reader

    rng = np.random.default_rng(2)
    for stats in (True, False):
        d = tmp_path / f"stats-{stats}"
        w = trace.TraceWriter(d)
        w.close()
        for i, paths in enumerate((["/a"], ["/b", "/a"], ["/c"], ["/a", "/d"])):
            tab = pa.Table.from_pandas(_part(300 + 50 * i, 10**9 + i * 10**6, paths, rng), preserve_index=False)
            pq.write_table(tab, d / "calls" / f"part-{i:06d}.parquet", write_statistics=stats)
        full = trace.load(d)
        planned = []
        monkeypatch.setattr(reader, "_read_parts_side_by_side",
                            lambda *a, _f=reader._read_parts_side_by_side: planned.append(1) or _f(*a))
        got = trace.load_bundle(d, columns=trace.EVENT_READ_COLUMNS, compact=True).calls
        monkeypatch.undo()
        assert bool(planned) is stats  # without statistics: nulls and int32 fits cannot be told
        assert len(got) == len(full) == 300 + 350 + 400 + 450
        for c in got.columns:
            if c in ("path", "tensor", "kind"):
                assert got[c].astype(object).tolist() == full[c].astype(object).tolist(), c
            else:
                np.testing.assert_array_equal(got[c].to_numpy(), full[c].to_numpy(), err_msg=c)
        assert (got["dur_ns"].dtype == np.int32) is stats  # narrowed only where statistics show it fits


def test_columns_of_one_value_are_filled_from_the_statistics_not_decoded(tmp_path, monkeypatch):
    # a column with one value in every part (min = max in every footer) is filled, not read;
    # a column constant within each part but not across them is read
    from engramprof.trace import reader

    rng = np.random.default_rng(3)
    w = trace.TraceWriter(tmp_path / "t")
    for i in range(3):
        df = _part(200, 10**9 + i * 10**6, ["/a"], rng)
        df["pid"], df["ret"], df["flags"] = 4242, 4096 + i, 8
        df["on_code"] = False  # a bool column of one value (no fault on the process's code)
        df["major"] = i == 1  # one value in each part, not across them
        w.append_calls(df)
    w.close()
    asked: list = []
    monkeypatch.setattr(reader, "_read_part", lambda p, cols, use_threads=True, _f=reader._read_part:
                        asked.append(list(cols)) or _f(p, cols, use_threads))
    got = trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True).calls
    monkeypatch.undo()
    full = trace.load(tmp_path / "t")
    # every part decoded a few columns at a time (reader.COLUMNS_AT_ONCE), each column once
    per_part = [c for a in asked for c in a]
    assert asked and all(len(a) <= reader.COLUMNS_AT_ONCE for a in asked)
    assert "pid" not in per_part and "flags" not in per_part and "on_code" not in per_part
    assert per_part.count("ret") == per_part.count("ts_ns") == 3
    for c in ("pid", "ret", "flags", "ts_ns", "offset", "on_code"):
        np.testing.assert_array_equal(got[c].to_numpy(), full[c].to_numpy(), err_msg=c)
    assert (got["pid"] == 4242).all() and got["flags"].dtype == np.int32
    assert got["on_code"].dtype == bool and got["on_code"].to_numpy().strides == (0,)
    major = trace.load_bundle(tmp_path / "t", columns=["ts_ns", "dur_ns", "pid", "tid", "major"], compact=True).calls
    np.testing.assert_array_equal(major["major"].to_numpy(), full["major"].to_numpy())
    assert major["major"].sum() == 200


def test_a_column_left_on_disk_reads_the_loaded_values_at_any_rows(tmp_path):
    # load_bundle(later=...): the column is not in the frame; values_at gives, at any table
    # rows, what the load would have held there (its narrowed type too), also when the load
    # sorted the rows (parts out of time order) and for one process's rows of the table
    rng = np.random.default_rng(4)
    w = trace.TraceWriter(tmp_path / "t")
    for i, t0 in enumerate((3 * 10**9, 10**9, 2 * 10**9)):  # parts out of time order: the load sorts
        df = _part(300 + 40 * i, t0, ["/a", "/b"], rng)
        df["pid"] = rng.choice([11, 22], len(df))
        df["row"] = rng.integers(0, 5000, len(df))
        w.append_calls(df)
    w.close()
    eager = trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True).calls
    tr = trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True, later=trace.LATER_COLUMNS)
    assert "row" in eager.columns and "row" not in tr.calls.columns and list(tr.later) == ["row"]
    col = tr.later["row"]
    assert col.order is not None  # the parts were out of order
    rows = rng.integers(0, len(eager), 400)
    got = col.values_at(rows)
    assert got.dtype == eager["row"].dtype == np.int32
    np.testing.assert_array_equal(got, eager["row"].to_numpy()[rows])
    mine = np.flatnonzero(eager["pid"].to_numpy() == 22)  # one process's table (analyse_each)
    sub = col.subset(mine)
    np.testing.assert_array_equal(sub.values_at(np.arange(len(mine))), eager["row"].to_numpy()[mine])
    # a column one value fills costs nothing loaded: it stays in the frame
    w = trace.TraceWriter(tmp_path / "c")
    df = _part(100, 10**9, ["/a"], rng)
    df["row"] = -1
    w.append_calls(df)
    w.close()
    c = trace.load_bundle(tmp_path / "c", columns=trace.EVENT_READ_COLUMNS, compact=True, later=trace.LATER_COLUMNS)
    assert "row" in c.calls.columns and not c.later


def test_the_analysis_names_the_same_slowest_rows_with_the_column_left_on_disk(tmp_path):
    # batch-tail's load leaves ``row`` on disk: the batch table (slowest_row of every batch,
    # every other column) is the same as with the column loaded, for each of two processes
    from engramprof.analysis import analyse

    rng = np.random.default_rng(5)
    w = trace.TraceWriter(tmp_path / "t")
    for i in range(2):
        df = _part(3000, 10**9 + i * 10**8, ["/a", "/b"], rng)
        df["pid"] = rng.choice([11, 22], len(df))
        # batches of 30 reads within 200 us, 2 ms apart
        df["ts_ns"] = (10**9 + i * 10**8 + np.arange(len(df)) // 30 * 2_000_000
                       + np.sort(rng.integers(0, 200_000, len(df)).reshape(-1, 30), axis=1).ravel())
        df["row"] = rng.integers(0, 100_000, len(df))
        w.append_calls(df)
    w.close()
    eager = analyse(trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True), gap_ms=0.5)
    later = analyse(trace.load_bundle(tmp_path / "t", columns=trace.EVENT_READ_COLUMNS, compact=True,
                                      later=trace.LATER_COLUMNS), gap_ms=0.5)
    assert len(eager.summary["processes"]) == 2 and len(eager.batches) > 10
    assert "slowest_row" in later.batches.columns and later.batches["slowest_row"].ge(0).all()
    pd.testing.assert_frame_equal(eager.batches, later.batches)
    assert eager.summary == later.summary
