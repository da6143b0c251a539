"""Dictionary codes for the recorder's string columns (path, tensor)."""
from __future__ import annotations

import pyarrow as pa


class Interner:
    """Each distinct string gets an int32 code once; Arrow dictionary arrays are built from
    the codes, so neither the recorder nor Parquet hashes a string per record."""

    def __init__(self, first: str = ""):
        self.index: dict[str, int] = {}
        self.values: list[str] = []
        self._dictionary: pa.Array | None = None
        self.code(first)

    def code(self, value: str) -> int:
        c = self.index.get(value)
        if c is None:
            c = self.index[value] = len(self.values)
            self.values.append(value)
            self._dictionary = None
        return c

    def __len__(self) -> int:
        return len(self.values)

    def dictionary(self) -> pa.Array:
        """The values as an Arrow string array (rebuilt only when a value was added)."""
        if self._dictionary is None:
            self._dictionary = pa.array(self.values, type=pa.string())
        return self._dictionary
