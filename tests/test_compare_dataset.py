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


# ------------------------------------------------- compare --ranks ROOT: a fleet directory read directly --

from pathlib import Path  # noqa: E402

from tests.test_compare import run  # noqa: E402

STEPS = 30


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """host=01/rank=0,1 and host=b/rank=2,3 (rank 3 cold in every other step), a bundle each,
    their markers inside the bundles; listed on disk in an order that is not the ranks'."""
    d = tmp_path_factory.mktemp("fleet")
    rng = np.random.default_rng(3)
    for host, rank, name in (("b", 3, "t-a"), ("01", 1, "t-z"), ("b", 2, "t-b"), ("01", 0, "t-y")):
        cold = (np.arange(STEPS) % 2 == 0) if rank == 3 else np.zeros(STEPS, bool)
        make_rank(d / f"host={host}" / f"rank={rank}" / name, cold, rng, STEPS)
    return d


def _doc(p):
    import json

    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_fleet_directory_is_read_as_its_bundles_ordered_by_rank(fleet):
    doc = _doc(run("--ranks", fleet, "--json", "--resamples", "0"))
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert [r["host"] for r in doc["ranks"]] == ["01", "01", "b", "b"]  # partition keys as text: 01 stays 01
    assert [Path(r["trace"]).name for r in doc["ranks"]] == ["t-y", "t-z", "t-b", "t-a"]
    assert doc["hosts"] == ["01", "b"]
    assert doc["gating_rank"] == 3 and doc["steps"] == STEPS
    # the same bundles given one by one (with their markers) give the same answer
    paths = [r["trace"] for r in doc["ranks"]]
    marks = [a for p in paths for a in ("--markers", Path(p) / "markers.jsonl")]
    one_by_one = _doc(run("--ranks", *paths, *marks, "--json", "--resamples", "0"))
    key = ("rank", "gated_steps", "excess_ms", "top_cause")
    assert [{k: r[k] for k in key} for r in one_by_one["ranks"]] == [{k: r[k] for k in key} for r in doc["ranks"]]
    # the console form names the host of each rank when there are several
    p = run("--ranks", fleet, "--resamples", "0")
    assert p.returncode == 0 and "host b" in p.stdout and " 01 " in p.stdout, p.stdout


def test_fleet_directory_mixes_with_bundle_paths(fleet, tmp_path):
    extra = make_rank(tmp_path / "rank=7", np.zeros(STEPS, bool), np.random.default_rng(4), STEPS)
    doc = _doc(run("--ranks", fleet / "host=b", extra, "--json", "--resamples", "0"))
    assert [r["rank"] for r in doc["ranks"]] == [2, 3, 7]
    assert doc["gating_rank"] == 3
    # host=b is the root given: its bundles' host is then the one meta.json records
    assert all(r["host"] for r in doc["ranks"])


def test_fleet_directories_as_before_and_after(fleet):
    import json

    p = run("--before", fleet / "host=01", "--after", fleet / "host=b", "--json", "--resamples", "50")
    assert p.returncode == 3, p.stderr  # rank 3's cold half: more than half the after side's time unshared
    doc = json.loads(p.stdout)
    assert [Path(t).name for t in doc["before"]["traces"]] == ["t-y", "t-z"]
    assert [Path(t).name for t in doc["after"]["traces"]] == ["t-b", "t-a"]
    assert doc["before"]["batches"] == doc["after"]["batches"] == 2 * STEPS


def _bad(*args) -> str:
    p = run(*args)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p.stderr


def test_fleet_directory_bad_input(fleet, tmp_path):
    import shutil

    empty = tmp_path / "empty" / "host=a" / "rank=0"
    empty.mkdir(parents=True)
    assert "no bundle below it" in _bad("--ranks", tmp_path / "empty")
    dup = tmp_path / "dup"
    shutil.copytree(fleet, dup)
    shutil.copytree(dup / "host=b" / "rank=2" / "t-b", dup / "host=b" / "rank=2" / "t-c")
    err = _bad("--ranks", dup)
    assert "t-b and " in err and "t-c both claim host b, rank 2" in err, err
    norank = tmp_path / "norank"
    shutil.copytree(fleet / "host=b" / "rank=2" / "t-b", norank / "host=b" / "t-b")
    shutil.copytree(fleet / "host=b" / "rank=3" / "t-a", norank / "host=b" / "rank=3" / "t-a")
    assert "no rank=K directory above it" in _bad("--ranks", norank)
    notint = tmp_path / "notint"
    shutil.copytree(fleet / "host=b" / "rank=2" / "t-b", notint / "rank=two" / "t-b")
    assert "rank=two is not an integer" in _bad("--ranks", notint, fleet)
    assert "--markers pairs with bundle paths" in _bad("--ranks", fleet, "--markers",
                                                       fleet / "host=b" / "rank=2" / "t-b" / "markers.jsonl")
    assert "given twice" in _bad("--ranks", fleet, fleet / "host=b" / "rank=2" / "t-b")
