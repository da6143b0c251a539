"""The trace format: one list of columns, the format version, older bundles (no root needed)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engramprof import trace
from engramprof.bpf import structs as layout
from engramprof.errors import UserError
from engramprof.trace.schema import kind_column
from tests.tracing import engramprof


def _calls(n: int = 5) -> pd.DataFrame:
    df = pd.DataFrame({c: np.zeros(n, dtype=trace.CALL_SCHEMA.field(c).type.to_pandas_dtype()) for c in trace.CALL_SCHEMA.names})
    df["ts_ns"] = 1_000 + np.arange(n) * 10
    df["dur_ns"] = 500
    df["path"], df["syscall"], df["tensor"], df["row"] = "/t", "preadv2", "", -1
    return df


def test_record_struct_and_call_schema_are_one_list():
    rec = layout.struct_dtype("call_record")
    trace.check_record_columns(rec)  # the shipped header agrees
    fields = [f for f in rec.names if not f.startswith("__")]
    optional = {f.name for f in trace.OPTIONAL_FIELDS}  # format 5: the file identity and direct, decoded apart
    assert sorted([f for f in fields if f not in optional] + list(trace.ENRICHED_COLUMNS)) == \
        sorted(trace.CALL_SCHEMA.names)
    assert {"dev", "ino", "direct"} <= set(fields)


def test_record_check_fails_on_drift():
    rec = layout.struct_dtype("call_record")
    extra = np.dtype(rec.descr + [("new_evidence_ns", "<u8")])
    with pytest.raises(RuntimeError, match="new_evidence_ns"):
        trace.check_record_columns(extra)
    lacking = np.dtype([(n, rec.fields[n][0]) for n in rec.names if n != "bio_ns"])
    with pytest.raises(RuntimeError, match="bio_ns"):
        trace.check_record_columns(lacking)


def test_sample_read_contract_is_in_the_sample_schemas():
    for name, cols in trace.SAMPLE_READ_COLUMNS.items():
        assert set(cols) <= set(trace.sample_schema(name).names), name


def test_written_bundle_has_kind_and_version(tmp_path):
    w = trace.TraceWriter(tmp_path / "t")
    w.append_calls(_calls())
    w.close()
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["format_version"] == trace.FORMAT_VERSION == 6
    part = pq.read_table(next((tmp_path / "t" / "calls").glob("part-*.parquet")))
    assert part.schema.names == trace.EVENT_SCHEMA.names
    calls = trace.load(tmp_path / "t")
    assert calls["kind"].tolist() == ["syscall"] * 5
    assert isinstance(calls["kind"].dtype, pd.CategoricalDtype)
    assert calls["path"].dtype == object


def test_kind_given_as_codes_or_names(tmp_path):
    df = _calls(3)
    df["kind"] = [0, 1, 0]
    w = trace.TraceWriter(tmp_path / "t")
    w.append_calls(df)
    df["kind"] = ["fault", "syscall", "fault"]
    w.append_calls(df)
    w.close()
    kinds = trace.load(tmp_path / "t")["kind"].astype(str).tolist()
    assert sorted(kinds) == sorted(["syscall", "fault", "syscall", "fault", "syscall", "fault"])


def _format_1_bundle(path):
    """A bundle as format 1 wrote it: no kind column, format_version 1."""
    w = trace.TraceWriter(path, meta={"format_version": 1})
    t = pa.Table.from_pandas(_calls(4), schema=trace.CALL_SCHEMA, preserve_index=False)
    w._write(t, w._next_part("calls", path / "calls"))
    w.close()


def test_format_1_bundle_loads_with_kind_syscall(tmp_path):
    _format_1_bundle(tmp_path / "old")
    assert "kind" not in pq.read_table(next((tmp_path / "old" / "calls").glob("*.parquet"))).schema.names
    calls = trace.load(tmp_path / "old")
    assert calls["kind"].tolist() == ["syscall"] * 4
    assert list(calls.columns[:9]) == trace.CONTRACT_COLUMNS


def _format_2_bundle(path):
    """A bundle as format 2 wrote it: kind, but no fault columns."""
    w = trace.TraceWriter(path, meta={"format_version": 2})
    t = pa.Table.from_pandas(_calls(3), schema=trace.CALL_SCHEMA, preserve_index=False)
    t = t.append_column("kind", kind_column("syscall", 3))
    w._write(t, w._next_part("calls", path / "calls"))
    w.close()


def test_format_2_bundle_loads_with_fault_columns_at_their_defaults(tmp_path):
    _format_2_bundle(tmp_path / "v2")
    assert "major" not in pq.read_table(next((tmp_path / "v2" / "calls").glob("*.parquet"))).schema.names
    calls = trace.load(tmp_path / "v2")
    assert calls["major"].tolist() == [False] * 3 and calls["major"].dtype == bool
    assert calls["mapped_pages"].tolist() == [0] * 3
    assert calls["address"].isna().all()
    part = trace.load_bundle(tmp_path / "v2", columns=["ts_ns", "dur_ns", "major"]).calls
    assert "major" in part.columns and "address" not in part.columns
    _format_1_bundle(tmp_path / "v1")
    assert trace.load(tmp_path / "v1")["major"].tolist() == [False] * 4


def test_fault_columns_round_trip_and_default_for_syscalls(tmp_path):
    """Format 3: fault rows keep major / mapped_pages / address; a producer that leaves the
    columns out (syscall rows) gets false / 0 / null."""
    df = _calls(3)
    df["kind"] = ["fault"] * 3
    df["major"] = [True, False, True]
    df["mapped_pages"] = np.array([16, 1, 0], dtype=np.int32)
    df["address"] = [0x7F0000001000, None, 0x7F0000003000]
    w = trace.TraceWriter(tmp_path / "t")
    w.append_calls(df)
    w.append_calls(_calls(2))
    w.close()
    part = pq.read_table(sorted((tmp_path / "t" / "calls").glob("*.parquet"))[0])
    assert part.schema.names == trace.EVENT_SCHEMA.names
    calls = trace.load(tmp_path / "t")
    faults = calls[calls["kind"] == "fault"]
    assert faults["major"].tolist() == [True, False, True]
    assert faults["mapped_pages"].tolist() == [16, 1, 0]
    assert faults["address"].iloc[0] == 0x7F0000001000 and np.isnan(faults["address"].iloc[1])
    sysc = calls[calls["kind"] == "syscall"]
    assert sysc["major"].tolist() == [False, False] and sysc["mapped_pages"].tolist() == [0, 0]
    assert sysc["address"].isna().all()


def test_format_3_bundle_loads_with_uring_columns_null(tmp_path):
    """Format 4 adds uring_path / io_tid / direct; an older bundle (and a kind without them) reads them null."""
    _format_2_bundle(tmp_path / "v2")
    calls = trace.load(tmp_path / "v2")
    assert calls["uring_path"].isna().all() and calls["io_tid"].isna().all() and calls["direct"].isna().all()
    part = trace.load_bundle(tmp_path / "v2", columns=trace.EVENT_READ_COLUMNS, compact=True).calls
    assert part["uring_path"].isna().all() and part["direct"].isna().all()


def test_uring_columns_round_trip_and_null_for_other_kinds(tmp_path):
    df = _calls(3)
    df["kind"] = ["io_uring"] * 3
    df["uring_path"] = ["inline", "async", "punted"]
    df["io_tid"] = np.array([7, 7, 9], dtype=np.int32)
    df["direct"] = [False, False, True]
    w = trace.TraceWriter(tmp_path / "t")
    w.append_calls(df)
    w.append_calls(_calls(2))
    w.close()
    calls = trace.load(tmp_path / "t")
    ur = calls[calls["kind"] == "io_uring"]
    assert ur["uring_path"].tolist() == ["inline", "async", "punted"] and ur["io_tid"].tolist() == [7, 7, 9]
    assert ur["direct"].tolist() == [False, False, True]
    sysc = calls[calls["kind"] == "syscall"]
    assert sysc["uring_path"].isna().all() and sysc["io_tid"].isna().all() and sysc["direct"].isna().all()


def test_fault_record_struct_is_parsed():
    rec = layout.struct_dtype("fault_record")
    assert rec.itemsize % 8 == 0
    assert {"ts_ns", "dur_ns", "address", "index", "ino", "dev", "mapped_pages", "flags"} <= set(rec.names)


def test_bare_parquet_without_kind(tmp_path):
    p = tmp_path / "calls.parquet"
    _calls(2).to_parquet(p)
    assert trace.load(p)["kind"].tolist() == ["syscall", "syscall"]


def test_newer_format_is_refused_naming_both_versions(tmp_path):
    w = trace.TraceWriter(tmp_path / "new", meta={"format_version": trace.FORMAT_VERSION + 1})
    w.append_calls(_calls())
    w.close()
    with pytest.raises(UserError) as e:
        trace.load(tmp_path / "new")
    msg = str(e.value)
    assert "\n" not in msg
    assert f"version {trace.FORMAT_VERSION + 1}" in msg and f"version {trace.FORMAT_VERSION})" in msg
    r = subprocess.run(engramprof("batch-tail", str(tmp_path / "new")), capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "newer" in r.stderr


def test_garbage_format_version_is_a_user_error(tmp_path):
    w = trace.TraceWriter(tmp_path / "bad", meta={"format_version": "two"})
    w.close()
    with pytest.raises(UserError, match="format version"):
        trace.load(tmp_path / "bad")


def test_table_builders_match_their_schemas():
    t = trace.fd_latency_table({3: np.array([0, 2, 0, 1])}, lambda fd: f"/fd{fd}")
    assert t.schema == trace.table_schema("latency_log2_by_fd")
    assert t.to_pylist() == [{"fd_slot": 3, "path": "/fd3", "log2_slot": 1, "ns_lower": 2, "count": 2},
                             {"fd_slot": 3, "path": "/fd3", "log2_slot": 3, "ns_lower": 8, "count": 1}]
    assert trace.fd_latency_table({}, str).num_rows == 0
    b = trace.bio_latency_table(np.array([0, 0, 5]))
    assert b.to_pylist() == [{"log2_slot": 2, "ns_lower": 4, "count": 5}]
    k = trace.kswapd_events_table(np.array([5, 6]), np.array([0, 0]), np.array([True, False]))
    assert k.schema == trace.sample_schema("kswapd_events") and k["event"].to_pylist() == ["wake", "sleep"]
