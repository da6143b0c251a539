"""Many bundles laid out as host=.../rank=.../<bundle> read as one dataset by DuckDB and by
pyarrow.dataset (docs/commands/compare.md, "Many bundles as one dataset").  No root."""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_compare import make_rank


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("bundles")
    rng = np.random.default_rng(0)
    sizes = {}
    for h, host in enumerate(("a", "b")):
        for r in range(2):
            n = 10 + 5 * (2 * h + r)
            make_rank(d / f"host={host}" / f"rank={2 * h + r}" / "trace", np.zeros(n, bool), rng, n)
            sizes[(host, 2 * h + r)] = n * 32
    # a writer's leftover temporary (a dot file) must be ignored by both engines
    (d / "host=a" / "rank=0" / "trace" / "calls" / ".part-000009.parquet.1.2.tmp").write_bytes(b"garbage")
    return d, sizes


def test_duckdb_reads_every_bundle_as_one_table(root):
    duckdb = pytest.importorskip("duckdb")
    d, sizes = root
    con = duckdb.connect()
    rows = con.execute(f"SELECT host, rank, count(*) FROM read_parquet('{d}/*/*/*/calls/*.parquet', "
                       "hive_partitioning = true, union_by_name = true) GROUP BY ALL ORDER BY ALL").fetchall()
    assert {(h, int(r)): n for h, r, n in rows} == sizes
    from engramprof.compare.dataset import duckdb_query

    df = duckdb_query(d, "SELECT host, count(*) AS n, median(dur_ns) AS p50 FROM calls GROUP BY host ORDER BY host")
    assert df["n"].tolist() == [sizes[("a", 0)] + sizes[("a", 1)], sizes[("b", 2)] + sizes[("b", 3)]]


def test_pyarrow_dataset_reads_every_bundle_with_partition_columns(root):
    from engramprof.compare.dataset import count_calls, open_dataset

    d, sizes = root
    t = open_dataset(d).to_table(columns=["host", "rank", "dur_ns"])
    got = t.group_by(["host", "rank"]).aggregate([("dur_ns", "count")]).to_pylist()
    assert {(g["host"], int(g["rank"])): g["dur_ns_count"] for g in got} == sizes
    assert count_calls(d / "host=b" / "rank=3" / "trace") == sizes[("b", 3)]


def test_compare_reads_a_hive_layout(root):
    from engramprof.compare import run_ranks

    d, _ = root
    traces = sorted(d.glob("host=*/rank=*/trace"))
    doc, _ = run_ranks(traces)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert doc["steps"] == 10  # the shortest rank's steps are the ones every rank has
