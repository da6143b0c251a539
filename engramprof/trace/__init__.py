"""The recorded trace: the one place that knows the on-disk format.

A TRACE is a directory (a "bundle"):

    TRACE/
      meta.json                 host, kernel, pid, command line, start/end, probe version,
                                format_version, lost-event counts, notes; rewritten atomically
      calls/part-NNNNNN.parquet read events (EVENT_SCHEMA), one complete Parquet file per flushed batch
      samples/NAME/part-NNNNNN.parquet   time series (SAMPLE_SCHEMAS: psi, vmstat, threads, ...,
                                kswapd_events)
      tables/NAME.parquet       one-off tables (TABLE_SCHEMAS: in-kernel latency histograms)

Streaming as many small complete files (rather than one Parquet file with a footer written at
the end) is what makes an interrupted trace still loadable: everything flushed before the
interruption is a valid file.  ``pandas.read_parquet("TRACE/calls")`` reads the per-call table
directly; :func:`load` does the same with type and format-version checks.

Files are created inside a directory this process made itself (``mkdir`` fails on an existing
path, so a planted symlink is never followed) with ``O_EXCL | O_NOFOLLOW``.

Modules: :mod:`.schema` (every column, the version), :mod:`.writer` (TraceWriter),
:mod:`.reader` (load, load_bundle, Trace).
"""
from __future__ import annotations

from engramprof.trace.reader import LaterColumn, Trace, empty_calls, load, load_bundle
from engramprof.trace.schema import (CALL_SCHEMA, CGROUP_COUNTERS, CGROUP_GAUGES, CONTRACT_COLUMNS, DICT_COLUMNS,
                                     ENRICHED_COLUMNS, EVENT_READ_COLUMNS, EVENT_SCHEMA, EVIDENCE_COLUMNS, FORMAT, FORMAT_VERSION,
                                     LATER_COLUMNS, PSI_RESOURCES, READ_KINDS, SAMPLE_NAMES, SAMPLE_READ_COLUMNS, SAMPLE_SCHEMAS,
                                     TABLE_SCHEMAS, VMSTAT_COUNTERS, VMSTAT_DERIVED, WRITE_SCHEMA, bio_latency_table,
                                     check_record_columns, fd_latency_table, kswapd_events_table, lost_records_table, sample_schema,
                                     table_schema)
from engramprof.trace.schema import FAULT_DEFAULTS, FAULT_FIELDS, fault_default_column, with_fault_columns
from engramprof.trace.schema import URING_DEFAULTS, URING_FIELDS
from engramprof.trace.schema import FILE_DEFAULTS, FILE_FIELDS, OPTIONAL_DEFAULTS, OPTIONAL_FIELDS
from engramprof.trace.writer import END_DURATION, END_REASONS, END_SIGNAL, END_TARGET_EXIT, TraceWriter  # noqa: F401

__all__ = [
    "CALL_SCHEMA", "CGROUP_COUNTERS", "CGROUP_GAUGES", "CONTRACT_COLUMNS", "DICT_COLUMNS", "ENRICHED_COLUMNS", "EVENT_READ_COLUMNS",
    "EVENT_SCHEMA", "EVIDENCE_COLUMNS", "FAULT_DEFAULTS", "FAULT_FIELDS", "fault_default_column", "with_fault_columns", "URING_DEFAULTS", "URING_FIELDS", "FILE_DEFAULTS", "FILE_FIELDS", "OPTIONAL_DEFAULTS", "OPTIONAL_FIELDS", "FORMAT", "FORMAT_VERSION", "LATER_COLUMNS", "PSI_RESOURCES", "READ_KINDS", "SAMPLE_NAMES",
    "SAMPLE_READ_COLUMNS", "SAMPLE_SCHEMAS", "TABLE_SCHEMAS", "LaterColumn", "Trace", "TraceWriter", "VMSTAT_COUNTERS",
    "VMSTAT_DERIVED", "WRITE_SCHEMA", "bio_latency_table", "check_record_columns", "empty_calls",
    "fd_latency_table", "kswapd_events_table", "load", "lost_records_table", "load_bundle", "sample_schema", "table_schema",
]
