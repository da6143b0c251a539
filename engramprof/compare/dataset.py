"""Many bundles as one dataset: DuckDB or pyarrow.dataset over a hive-partitioned directory.

Bundles from many hosts and days laid out as ``ROOT/host=H/rank=R/<bundle>/`` are read as one
table by the engines people already run; every Parquet part under ``calls/`` is a complete file
(the writer renames parts into place; dot-temporaries are ignored by both engines)::

    -- DuckDB
    SELECT host, rank, count(*) AS calls, median(dur_ns) / 1e3 AS p50_us
    FROM read_parquet('ROOT/*/*/*/calls/*.parquet', hive_partitioning = true, union_by_name = true)
    GROUP BY ALL;

    # pyarrow.dataset
    ds = open_dataset(ROOT)          # host and rank as columns, from the directory names
    ds.to_table(columns=["host", "rank", "dur_ns"], filter=pc.field("rank") == "3")

``compare`` itself uses :func:`check_calls` (row counts from the Parquet footers, without
reading a column) and reads each bundle with only the analysis's columns, one at a time.
"""
from __future__ import annotations

from pathlib import Path

from engramprof.errors import UserError


def calls_glob(root: str | Path, depth: int = 3) -> str:
    """The DuckDB glob of every calls part ``depth`` directories below ``root``
    (host=/rank=/bundle: 3)."""
    return str(Path(root)) + "/*" * depth + "/calls/*.parquet"


def open_dataset(root: str | Path):
    """A pyarrow dataset of every bundle's calls/ parts under ``root``, with the hive
    partition columns of the directory names (``host=``, ``rank=``, ...)."""
    import pyarrow.dataset as ds

    root = Path(root)
    files = sorted(str(p) for p in root.rglob("calls/part-*.parquet"))
    if not files:
        raise UserError(f"{root}: no bundle's calls/ parts below it")
    part = ds.partitioning(flavor="hive")
    return ds.dataset(files, format="parquet", partitioning=part, partition_base_dir=str(root))


def duckdb_query(root: str | Path, sql: str, depth: int = 3):
    """Run ``sql`` with ``calls`` bound to every calls part under ``root`` (hive
    partitioning); DuckDB is the dev extra."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute(f"CREATE VIEW calls AS SELECT * FROM read_parquet('{calls_glob(root, depth)}', "
                    "hive_partitioning = true, union_by_name = true)")
        return con.execute(sql).fetchdf()
    finally:
        con.close()


def count_calls(trace: str | Path) -> int:
    """Rows in a bundle's calls/ parts, from their footers (pyarrow.dataset: no column read)."""
    import pyarrow.dataset as ds

    d = Path(trace) / "calls"
    files = sorted(str(p) for p in d.glob("part-*.parquet")) if d.is_dir() else []
    if not files:
        return 0
    try:
        return int(ds.dataset(files, format="parquet").count_rows())
    except Exception:  # a part cut short: load_bundle skips it with a note; count what reads
        from engramprof.trace.reader import complete_parts

        return int(sum(h.metadata.num_rows for h in complete_parts(d)))


def check_calls(traces: list[Path], markers: list) -> None:
    """A bundle with no read event and no markers cannot be compared (one line, exit 2)."""
    for t, m in zip(traces, markers):
        if Path(t).is_dir() and m is None and not (Path(t) / "markers.jsonl").is_file() and count_calls(t) == 0:
            raise UserError(f"{t}: the trace holds no read event (and no markers)")
