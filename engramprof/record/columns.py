"""A :class:`~.decode.ReadBatch` as an Arrow table of the trace's EVENT_SCHEMA.

The column list is the trace's (engramprof/trace/schema.py): a column named like a field of the
probe's record is that field cast to the schema's type, ``syscall`` is the record's code looked
up in the header's SYSCALL_* names, the enriched columns come from the batch, ``kind`` is the
batch's kind, and the fault columns (``major``, ``mapped_pages``, ``address``) come from the batch's
columns when its decoder set them (faults), and so do the io_uring columns (``uring_path``,
``io_tid``, ``direct``: io_uring requests), else the defaults of another kind.  Nothing here lists the columns again.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from engramprof import trace
from engramprof.record.decode import ReadBatch
from engramprof.record.strings import Interner


class EventTableBuilder:
    """Builds the calls/ table of a batch.  ``missing``: evidence columns this kernel cannot
    measure, written all-null (not a misleading 0)."""

    def __init__(self, syscall_dictionary: pa.Array, paths: Interner, tensors: Interner, missing: list[str] = ()):
        self.syscall_dictionary = syscall_dictionary
        self.max_syscall = len(syscall_dictionary) - 1
        self.dictionaries = {"path": paths, "tensor": tensors}
        self.missing = set(missing)
        self._kinds: dict[str, pa.Array] = {}

    def build(self, batch: ReadBatch) -> pa.Table:
        n = len(batch)
        recs = batch.recs
        arrays = []
        for f in trace.CALL_SCHEMA:
            name = f.name
            if name in self.missing:
                arrays.append(pa.nulls(n, type=f.type))
            elif name == "syscall":
                codes = np.minimum(recs["syscall"], self.max_syscall).astype(np.int32)
                arrays.append(pa.DictionaryArray.from_arrays(pa.array(codes), self.syscall_dictionary))
            elif name in self.dictionaries:
                arrays.append(pa.DictionaryArray.from_arrays(pa.array(batch.cols[name]),
                                                             self.dictionaries[name].dictionary()))
            elif name in batch.cols:
                arrays.append(pa.array(batch.cols[name]))
            else:
                arrays.append(pa.array(recs[name].astype(f.type.to_pandas_dtype(), copy=False)))
        arrays.append(pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), self._kind(batch.kind)))
        for f in trace.OPTIONAL_FIELDS:  # their kind's decoder fills them; others: defaults
            if f.name in batch.cols:
                arrays.append(pa.array(batch.cols[f.name], type=f.type))
            else:
                arrays.append(trace.fault_default_column(f.name, n))
        return pa.Table.from_arrays(arrays, names=trace.EVENT_SCHEMA.names)

    def _kind(self, kind: str) -> pa.Array:
        d = self._kinds.get(kind)
        if d is None:
            d = self._kinds[kind] = pa.array([kind], type=pa.string())
        return d
