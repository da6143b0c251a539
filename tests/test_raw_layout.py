"""Raw table files (.bin) described by a layout file: tensor and row of an offset (no root)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from engramprof.tables import safetensors as layout
from engramprof.tables import raw as raw_layout
from engramprof.errors import UserError
from tests.tracing import engramprof

LAYOUT = """
# vLLM-style Engram shards: rows <start>..<end> of the table, and their scales
[[file]]
match = 'engram_v(?P<start>\\d+)_(?P<end>\\d+)_r(?P<shard>\\d+)\\.weight\\.bin$'
tensor = "engram.weight"
row_bytes = 512
first_row = "{start}"

[[file]]
match = 'engram_v(?P<start>\\d+)_(?P<end>\\d+)_r(?P<shard>\\d+)\\.scale\\.bin$'
tensor = "engram.scale"
row_bytes = 4
first_row = "{start}"

# PLE: <layer>.<param>.bin, one table per layer
[[file]]
match = '/(?P<layer>\\d+)\\.(?P<param>\\w+)\\.bin$'
tensor = "ple.{layer}.{param}"
row_bytes = 256

# sglang: ple_table_<dims>_<dtype>_<bytes>B.bin, after a 4096-byte header
[[file]]
match = 'ple_table_(?P<dims>\\d+)_(?P<dtype>\\w+?)_(?P<bytes>\\d+)B\\.bin$'
tensor = "ple_table"
row_bytes = 1024
first_byte = 4096
"""


@pytest.fixture
def tables(tmp_path):
    spec = tmp_path / "layout.toml"
    spec.write_text(LAYOUT)
    files = {
        "engram_v1000_1999_r1.weight.bin": 1000 * 512,
        "engram_v1000_1999_r1.scale.bin": 1000 * 4,
        "7.embed.bin": 64 * 256,
        "ple_table_512_fp16_1024B.bin": 4096 + 32 * 1024,
        "other.bin": 4096,
    }
    for name, size in files.items():
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)
    raw_layout.use(spec)
    yield tmp_path, spec
    raw_layout.use(None)


def test_the_three_shapes_map_offsets_to_tensor_and_row(tables):
    d, _ = tables
    names, rows = layout.map_offsets(d / "engram_v1000_1999_r1.weight.bin", np.array([0, 511, 512, 999 * 512]))
    assert list(names) == ["engram.weight"] * 4 and list(rows) == [1000, 1000, 1001, 1999]
    names, rows = layout.map_offsets(d / "engram_v1000_1999_r1.scale.bin", np.array([8]))
    assert (names[0], rows[0]) == ("engram.scale", 1002)
    names, rows = layout.map_offsets(d / "7.embed.bin", np.array([256 * 3 + 5, 64 * 256]))
    assert list(names) == ["ple.7.embed", ""] and list(rows) == [3, -1]  # past the end: no row
    names, rows = layout.map_offsets(d / "ple_table_512_fp16_1024B.bin", np.array([100, 4096, 4096 + 2048]))
    assert list(names) == ["", "ple_table", "ple_table"] and list(rows) == [-1, 0, 2]  # header bytes: no row
    with pytest.raises(UserError, match="not a valid safetensors"):  # a file no entry matches
        layout.load(d / "other.bin")


def test_without_the_layout_file_a_raw_file_is_not_a_table(tables):
    d, _ = tables
    raw_layout.use(None)
    with pytest.raises(UserError):
        layout.load(d / "7.embed.bin")


@pytest.mark.parametrize("text, why", [
    ("[[file]]\nmatch = '('\ntensor = 't'\nrow_bytes = 4\n", "not a regular expression"),
    ("[[file]]\nmatch = 'x'\ntensor = 't'\n", "row_bytes is required"),
    ("[[file]]\nmatch = 'x'\ntensor = 't'\nrow_bytes = 0\n", "row_bytes must be an integer >= 1"),
    ("[[file]]\nmatch = 'x'\ntensor = 't'\nrow_bytes = 4\nrowbytes = 4\n", "unknown key"),
    ("nothing = 1\n", r"at least one \[\[file\]\]"),
    ("[[file\n", "not a TOML layout file"),
])
def test_bad_layout_files_are_one_line(tmp_path, text, why):
    p = tmp_path / "l.toml"
    p.write_text(text)
    with pytest.raises(UserError, match=why) as ei:
        raw_layout.read(p)
    assert "\n" not in str(ei.value)


def test_residency_tensors_uses_the_layout_file(tables):
    d, spec = tables
    r = subprocess.run(engramprof("residency", d / "7.embed.bin", "--tensors", "--layout", spec, "--json"),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "ple.7.embed" in json.dumps(out)
