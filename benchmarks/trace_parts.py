#!/usr/bin/env python3
"""How the trace writer's Parquet options cost in size, write CPU and read CPU, side by side.

    .venv/bin/python benchmarks/trace_parts.py TRACE... [--parts N] [--rounds R]

For each TRACE (a bundle), its first N ``calls/`` parts are read, then every variant writes
the same rows to memory and reads back the analysis's columns (EVENT_READ_COLUMNS), the
variants interleaved round by round; printed per variant: bytes per event, write and read CPU
ns per event (each the best round), and the ratios to the first variant.  The variants: the
writer's options before 2026-12-07 (zstd on plain values), lz4 on plain values, and the
writer's own options now (engramprof/trace/writer.py: integer columns delta-encoded, lz4).
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engramprof.trace import DICT_COLUMNS, EVENT_READ_COLUMNS  # noqa: E402
from engramprof.trace import writer  # noqa: E402


def _variants(schema: pa.Schema) -> dict:
    dictionary = [c for c in DICT_COLUMNS if c in schema.names]
    return {
        "zstd, plain (before)": dict(compression="zstd", use_dictionary=dictionary),
        "lz4, plain": dict(compression="lz4", use_dictionary=dictionary),
        "lz4, delta ints (writer)": dict(compression=writer.PARQUET_COMPRESSION, use_dictionary=dictionary,
                                         column_encoding=writer.column_encodings(schema, dictionary)),
    }


def _cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def measure(table: pa.Table, rounds: int) -> dict:
    """Per variant: (bytes, best write CPU s, best read CPU s)."""
    variants = _variants(table.schema)
    cols = [c for c in EVENT_READ_COLUMNS if c in table.column_names]
    best: dict = {k: [0, float("inf"), float("inf")] for k in variants}
    for _ in range(rounds):
        for name, opts in variants.items():
            buf = io.BytesIO()
            w = _cpu(lambda: pq.write_table(table, buf, **opts))
            data = buf.getvalue()
            r = _cpu(lambda: pq.read_table(pa.BufferReader(data), columns=cols, use_threads=False))
            b = best[name]
            b[0], b[1], b[2] = len(data), min(b[1], w), min(b[2], r)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--parts", type=int, default=2, help="calls parts of each trace (default 2)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, variants interleaved (default 5)")
    args = ap.parse_args()
    for tr in args.traces:
        parts = sorted((tr / "calls").glob("part-*.parquet"))[:args.parts]
        if not parts:
            print(f"{tr}: no calls parts", file=sys.stderr)
            return 1
        table = pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")
        n = table.num_rows
        res = measure(table, args.rounds)
        base = next(iter(res.values()))
        print(f"{tr} ({n:,} events in {len(parts)} part(s), best of {args.rounds} rounds)")
        print(f"  {'variant':26s} {'B/event':>8s} {'write ns':>9s} {'read ns':>8s}   size  write   read")
        for name, (size, w, r) in res.items():
            print(f"  {name:26s} {size / n:8.2f} {w / n * 1e9:9.0f} {r / n * 1e9:8.0f}  "
                  f"{size / base[0]:5.2f}x {w / base[1]:5.2f}x {r / base[2]:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
