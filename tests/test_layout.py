"""layout: safetensors header validation, offset -> (tensor, row), DataFrame annotation."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pandas as pd
import pytest

from engramprof.tables import safetensors as layout
from engramprof.errors import UserError


def write_st(path, tensors: dict, data: bytes | None = None, pad: bool = True, raw_header=None) -> None:
    """A hand-written safetensors file (independent of engramprof.lab.table)."""
    raw = raw_header if raw_header is not None else json.dumps(tensors).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    if data is None:
        end = max((v["data_offsets"][1] for k, v in tensors.items() if k != "__metadata__"), default=0)
        data = bytes(range(256)) * (end // 256 + 1)
        data = data[:end]
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


TENSORS = {
    "__metadata__": {"format": "pt"},
    "b.f32": {"dtype": "F32", "shape": [10, 4], "data_offsets": [16, 176]},  # 16-byte rows
    "a.vec": {"dtype": "I16", "shape": [8], "data_offsets": [0, 16]},  # 2-byte "rows"
    "c.empty": {"dtype": "F16", "shape": [0, 3], "data_offsets": [176, 176]},
    "d.u8": {"dtype": "U8", "shape": [5, 3], "data_offsets": [176, 191]},
}


@pytest.fixture
def st(tmp_path):
    p = tmp_path / "m.safetensors"
    write_st(p, TENSORS)
    return p


def test_load_parses_and_sorts(st):
    lay = layout.load(st)
    hdr = int.from_bytes(st.read_bytes()[:8], "little")
    assert lay.data_start == 8 + hdr and lay.metadata == {"format": "pt"}
    assert [t.name for t in lay.tensors] == ["a.vec", "b.f32", "c.empty", "d.u8"]
    b = lay.tensor("b.f32")
    assert (b.start, b.end, b.row_bytes, b.shape, b.rows) == (8 + hdr + 16, 8 + hdr + 176, 16, (10, 4), 10)
    assert lay.tensor("a.vec").row_bytes == 2
    with pytest.raises(UserError, match="no tensor named"):
        lay.tensor("nope")


def test_map_offsets_boundaries(st):
    lay = layout.load(st)
    d0 = lay.data_start
    offs = np.array([-1, 0, d0 - 1, d0, d0 + 15, d0 + 16, d0 + 16 + 5 * 16 + 3, d0 + 175,
                     d0 + 176, d0 + 190, d0 + 191, 10**12])
    names, rows = layout.map_offsets(st, offs)
    assert list(names) == ["", "", "", "a.vec", "a.vec", "b.f32", "b.f32", "b.f32",
                           "d.u8", "d.u8", "", ""]
    assert list(rows) == [-1, -1, -1, 0, 7, 0, 5, 9, 0, 4, -1, -1]
    assert rows.dtype == np.int64
    n, r = lay.map_offsets(np.array([], dtype=np.int64))
    assert n.shape == r.shape == (0,)


def test_map_offsets_matches_a_python_loop(st):
    lay = layout.load(st)
    offs = np.arange(-5, lay.size + 5, dtype=np.int64)
    names, rows = lay.map_offsets(offs)
    for o, n, r in zip(offs.tolist(), names, rows.tolist()):
        hit = [t for t in lay.tensors if t.start <= o < t.end]
        assert n == (hit[0].name if hit else "")
        assert r == ((o - hit[0].start) // hit[0].row_bytes if hit else -1)


def test_cache_is_reused_and_invalidated(st):
    a = layout.load(st)
    assert layout.load(st) is a
    t = dict(TENSORS)
    t["b.f32"] = {"dtype": "F32", "shape": [40], "data_offsets": [16, 176]}
    write_st(st, t)
    os.utime(st, ns=(time.time_ns(), time.time_ns() + 10**9))
    b = layout.load(st)
    assert b is not a and b.tensor("b.f32").row_bytes == 4


@pytest.mark.parametrize("name,make", [
    ("empty", lambda p: p.write_bytes(b"")),
    ("tiny", lambda p: p.write_bytes(b"\x01\x00")),
    ("huge length", lambda p: p.write_bytes((10**12).to_bytes(8, "little") + b"{}")),
    ("length past eof", lambda p: p.write_bytes((64).to_bytes(8, "little") + b"{}      ")),
    ("not json", lambda p: write_st(p, {}, raw_header=b"{not json")),
    ("not utf8", lambda p: write_st(p, {}, raw_header=b'{"\xff": 1}')),
    ("array", lambda p: write_st(p, {}, raw_header=b"[1, 2]")),
    ("bad dtype", lambda p: write_st(p, {"x": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})),
    ("bad shape", lambda p: write_st(p, {"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})),
    ("bool shape", lambda p: write_st(p, {"x": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}})),
    ("wrong size", lambda p: write_st(p, {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})),
    ("reversed", lambda p: write_st(p, {"x": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}}, data=b"1234")),
    ("past eof", lambda p: write_st(p, {"x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, data=b"1234")),
    ("overlap", lambda p: write_st(p, {"x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                                       "y": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]}})),
    ("duplicate key", lambda p: write_st(p, {}, raw_header=b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                                                        b'"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}')),
    ("bad metadata", lambda p: write_st(p, {"__metadata__": {"a": 1}})),
    ("entry not object", lambda p: write_st(p, {"x": [1]}, data=b"")),
])
def test_corrupt_files_are_user_errors(tmp_path, name, make):
    p = tmp_path / "bad.safetensors"
    make(p)
    with pytest.raises(UserError, match="not a valid safetensors file"):
        layout.load(p)
    with pytest.raises(UserError):  # the cached negative answer is an error too
        layout.load(p)


def test_non_regular_files_and_missing(tmp_path):
    with pytest.raises(UserError, match="not a regular file"):
        layout.load(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        layout.load(fifo)  # must not hang
    with pytest.raises(UserError, match="No such file"):
        layout.load(tmp_path / "missing")


def test_annotate_fills_only_safetensors_rows(st, tmp_path):
    other = tmp_path / "plain.bin"
    other.write_bytes(b"x" * 100)
    d0 = layout.load(st).data_start
    df = pd.DataFrame({
        "path": [str(st), str(other), str(st), "", str(tmp_path / "gone"), str(st)],
        "offset": [d0 + 16 + 32, 50, 3, 0, 0, d0 + 180],
        "size": [16] * 6,
    })
    out = layout.annotate(df)
    assert out is df
    assert list(df["tensor"]) == ["b.f32", "", "", "", "", "d.u8"]
    assert list(df["row"]) == [2, -1, -1, -1, -1, 1]
    assert df["row"].dtype == np.int64


def test_annotate_keeps_existing_values_for_other_files(st, tmp_path):
    other = tmp_path / "plain.bin"
    other.write_bytes(b"x" * 100)
    df = pd.DataFrame({"path": [str(other), str(st)], "offset": [1, layout.load(st).data_start],
                       "tensor": ["kept", "old"], "row": [7, 7]})
    layout.annotate(df)
    assert list(df["tensor"]) == ["kept", "a.vec"] and list(df["row"]) == [7, 0]


def test_annotate_empty_frame():
    df = layout.annotate(pd.DataFrame({"path": pd.Series([], dtype=str), "offset": pd.Series([], dtype="int64")}))
    assert list(df.columns) == ["path", "offset", "tensor", "row"] and df["row"].dtype == np.int64


def test_annotate_is_vectorised_on_many_rows(st):
    lay = layout.load(st)
    offs = np.random.default_rng(0).integers(lay.data_start, lay.size, 200_000)
    df = pd.DataFrame({"path": str(st), "offset": offs})
    t0 = time.perf_counter()
    layout.annotate(df)
    assert time.perf_counter() - t0 < 2.0  # a per-row Python loop would not fit comfortably
    names, rows = lay.map_offsets(offs)
    assert (df["tensor"].to_numpy() == names).all() and (df["row"].to_numpy() == rows).all()
