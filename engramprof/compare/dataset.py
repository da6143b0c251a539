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

``compare`` reads such a directory directly (``compare --ranks ROOT``, ``--before ROOT``):
:func:`expand` finds its bundles as one pyarrow dataset with hive partitioning, each bundle's
``host`` / ``rank`` from its fragments' partition expressions.  It uses :func:`check_calls` (row
counts from the Parquet footers, without reading a column) and reads each bundle with only the
analysis's columns, one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engramprof.errors import UserError
from engramprof.trace.reader import complete_parts

#: a bundle is a directory holding this file
BUNDLE_META = "meta.json"


def calls_glob(root: str | Path, depth: int = 3) -> str:
    """The DuckDB glob of every calls part ``depth`` directories below ``root``
    (host=/rank=/bundle: 3)."""
    return str(Path(root)) + "/*" * depth + "/calls/*.parquet"


def _calls_parts(root: Path) -> list[str]:
    """Every bundle's complete-named calls parts below ``root`` (the writer's dot-temporaries
    and anything under a dot directory are not parts)."""
    return sorted(str(p) for p in root.rglob("calls/part-*.parquet")
                  if not any(x.startswith(".") for x in p.relative_to(root).parts))


def open_dataset(root: str | Path, *, text_keys: bool = False):
    """A pyarrow dataset of every bundle's calls/ parts under ``root``, with the hive
    partition columns of the directory names (``host=``, ``rank=``, ...).  ``text_keys``: every
    partition column as a string (a host named ``01`` stays ``01``), else their types inferred."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    root = Path(root)
    files = _calls_parts(root)
    if not files:
        raise UserError(f"{root}: no bundle's calls/ parts below it")
    part = ds.partitioning(flavor="hive")
    dset = ds.dataset(files, format="parquet", partitioning=part, partition_base_dir=str(root))
    if text_keys and dset.partitioning is not None:
        names = dset.partitioning.schema.names
        part = ds.partitioning(pa.schema([(n, pa.string()) for n in names]), flavor="hive")
        dset = ds.dataset(files, format="parquet", partitioning=part, partition_base_dir=str(root))
    return dset


@dataclass
class FleetBundle:
    """One bundle found below a fleet directory, with its partition keys (``host=``, ``rank=``,
    any other ``key=value`` directory above it), as text."""
    path: Path
    keys: dict = field(default_factory=dict)
    root: Path | None = None

    @property
    def host(self) -> str | None:
        return self.keys.get("host")

    @property
    def rank(self) -> int | None:
        v = self.keys.get("rank")
        return int(v) if v is not None and v.lstrip("-").isdigit() else None


def is_bundle(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / BUNDLE_META).is_file()


def discover(root: str | Path) -> list[FleetBundle]:
    """The bundles below ``root`` (any depth of ``key=value`` directories): one pyarrow dataset
    of their calls parts with hive partitioning; each bundle's keys are its fragments'
    partition keys.  A bundle holding no calls part (only markers, say) gets the keys of its
    own directory path through the same partitioning.  Ordered by rank, host, path."""
    import pyarrow.dataset as ds

    root = Path(root)
    dset = open_dataset(root, text_keys=True) if _calls_parts(root) else None
    found: dict[Path, dict] = {}
    if dset is not None:
        for frag in dset.get_fragments():
            bundle = Path(frag.path).parent.parent
            if is_bundle(bundle):
                found.setdefault(bundle, ds.get_partition_keys(frag.partition_expression))
    for meta in root.rglob(BUNDLE_META):
        bundle = meta.parent
        if bundle in found or any(x.startswith(".") for x in bundle.relative_to(root).parts):
            continue
        keys = {}
        if dset is not None and dset.partitioning is not None:
            keys = ds.get_partition_keys(dset.partitioning.parse(str(bundle.relative_to(root))))
        else:
            keys = dict(x.split("=", 1) for x in bundle.relative_to(root).parts if "=" in x)
        found[bundle] = keys
    out = [FleetBundle(path=p, keys={k: str(v) for k, v in keys.items() if v is not None}, root=root)
           for p, keys in found.items()]
    if not out:
        raise UserError(f"{root}: no bundle below it (a fleet directory holds bundles laid out as "
                        "host=H/rank=R/<bundle>/, each with a meta.json)")
    return sorted(out, key=lambda b: (b.rank is None, b.rank if b.rank is not None else 0, b.host or "", str(b.path)))


def expand(traces: list[Path], *, need_ranks: bool) -> list[FleetBundle]:
    """Each TRACE argument as its bundles: a bundle (or a Parquet / CSV table) is itself; a
    directory that is not a bundle is a fleet root, read through :func:`discover`.  With
    ``need_ranks`` (``--ranks``) every bundle found below a root must have a ``rank=`` directory
    above it, and no two may claim one (host, rank).  A bundle given twice is refused."""
    out: list[FleetBundle] = []
    for t in traces:
        t = Path(t)
        if t.is_dir() and not is_bundle(t):
            out.extend(discover(t))
        else:
            out.append(FleetBundle(path=t))
    seen: dict = {}
    claims: dict = {}
    for b in out:
        key = b.path.resolve() if b.path.exists() else b.path
        if key in seen:
            raise UserError(f"{b.path}: given twice (as {seen[key]} and {b.path})")
        seen[key] = b.path
        if b.root is None or not need_ranks:
            continue
        if b.rank is None:
            what = f"rank={b.keys['rank']} is not an integer" if "rank" in b.keys else "no rank=K directory above it"
            raise UserError(f"{b.path}: {what} (below {b.root}, --ranks reads bundles laid out as "
                            "host=H/rank=R/<bundle>/)")
        claim = (b.host, b.rank)
        if claim in claims:
            who = f"host {b.host}, rank {b.rank}" if b.host is not None else f"rank {b.rank}"
            raise UserError(f"{claims[claim]} and {b.path} both claim {who}: one bundle per rank "
                            "(move one out, or give the bundles one by one)")
        claims[claim] = b.path
    return out


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

        return int(sum(h.metadata.num_rows for h in complete_parts(d)))


def check_calls(traces: list[Path], markers: list) -> None:
    """A bundle with no read event and no markers cannot be compared (one line, exit 2)."""
    for t, m in zip(traces, markers):
        if Path(t).is_dir() and m is None and not (Path(t) / "markers.jsonl").is_file() and count_calls(t) == 0:
            raise UserError(f"{t}: the trace holds no read event (and no markers)")
