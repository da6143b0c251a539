"""Raw table files: a layout file that says which tensor and rows a ``.bin`` file holds.

Safetensors files describe themselves (engramprof.tables.safetensors reads their header).  Many readers
keep tables as raw files instead, one per tensor and shard: vLLM-style
``engram_v<vocab_start>_<vocab_end>_r<shard>.weight.bin`` (with a ``.scale.bin``), PLE
``<layer>.<param>.bin``, sglang ``ple_table_<dims>_<dtype>_<bytes>B.bin``.  A layout file,
written once, maps a path pattern to a tensor name, the first byte of the rows, the bytes per
row, and the first row id (for a shard holding a row range).  TOML::

    [[file]]
    match = 'engram_v(?P<start>\\d+)_(?P<end>\\d+)_r(?P<shard>\\d+)\\.weight\\.bin$'
    tensor = "engram.weight"      # may use the pattern's groups: "engram.r{shard}"
    row_bytes = 1024
    first_row = "{start}"         # a number, or a group of the pattern (default 0)
    first_byte = 0                # where row 0 of the file starts (default 0)

``match`` is a regular expression searched in the file's absolute path; the first entry that
matches wins.  Commands that take ``--layout FILE`` register it with :func:`use`; then
:func:`engramprof.tables.safetensors.load` answers for those files as for a safetensors file.  Nothing here
reads the table: the layout comes from the file's name and size.
"""
from __future__ import annotations

import os
import re
import threading
import tomllib
from dataclasses import dataclass

from engramprof.errors import UserError

_KEYS = {"match", "tensor", "row_bytes", "first_row", "first_byte", "rows"}


@dataclass(frozen=True)
class RawRule:
    pattern: re.Pattern
    tensor: str
    row_bytes: int
    first_row: str | int
    first_byte: int
    rows: int | None
    source: str  # the layout file and entry, for messages

    def resolve(self, path: str, size: int):
        """(tensor name, first byte, row bytes, first row id, rows) for ``path`` of ``size``, or None."""
        m = self.pattern.search(path)
        if m is None:
            return None
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        try:
            name = self.tensor.format(**groups)
            first_row = int(str(self.first_row).format(**groups))
        except (KeyError, ValueError, IndexError) as exc:
            raise UserError(f"{self.source}: cannot fill the entry from {os.path.basename(path)} ({exc})") from None
        rows = self.rows if self.rows is not None else max(0, (size - self.first_byte) // self.row_bytes)
        return name, self.first_byte, self.row_bytes, first_row, rows


def _int(entry: dict, key: str, where: str, default=None, minimum: int = 0) -> int | None:
    v = entry.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise UserError(f"{where}: {key} must be an integer >= {minimum} (got {v!r})")
    return v


def parse(text: str, source: str) -> list[RawRule]:
    """The rules of a layout file's text (one-line UserError on anything malformed)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source}: not a TOML layout file ({exc})") from None
    entries = doc.get("file")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{source}: a layout file needs at least one [[file]] entry")
    rules = []
    for i, e in enumerate(entries, 1):
        where = f"{source}: [[file]] #{i}"
        unknown = set(e) - _KEYS
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_KEYS))})")
        for key in ("match", "tensor"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise UserError(f"{where}: {key} must be a non-empty string")
        try:
            pattern = re.compile(e["match"])
        except re.error as exc:
            raise UserError(f"{where}: match is not a regular expression ({exc})") from None
        first_row = e.get("first_row", 0)
        if not (isinstance(first_row, str) or (isinstance(first_row, int) and not isinstance(first_row, bool)
                                               and first_row >= 0)):
            raise UserError(f"{where}: first_row must be an integer >= 0 or a template such as \"{{start}}\"")
        rules.append(RawRule(pattern=pattern, tensor=e["tensor"], row_bytes=_int(e, "row_bytes", where, minimum=1),
                             first_row=first_row, first_byte=_int(e, "first_byte", where, 0),
                             rows=_int(e, "rows", where, None), source=where))
        if rules[-1].row_bytes is None:
            raise UserError(f"{where}: row_bytes is required")
    return rules


def read(path: str | os.PathLike) -> list[RawRule]:
    """Parse a layout file."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(1 << 20)
    except IsADirectoryError:
        raise UserError(f"{p}: is a directory, not a layout file") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read the layout file ({exc.strerror})") from None
    try:
        return parse(raw.decode("utf-8"), p)
    except UnicodeDecodeError:
        raise UserError(f"{p}: not a text (TOML) layout file") from None


_rules: list[RawRule] = []
_lock = threading.Lock()
_generation = 0


def use(path: str | os.PathLike | None) -> None:
    """Register a layout file for this process (None: none); engramprof.tables.safetensors.load consults it."""
    rules = read(path) if path is not None else []
    global _generation
    with _lock:
        _rules[:] = rules
        _generation += 1


def generation() -> int:
    """How many times a layout file was registered: a cached layout of an older one is stale."""
    with _lock:
        return _generation


def rule_for(path: str, size: int):
    """The registered rule's answer for ``path`` (see :meth:`RawRule.resolve`), or None."""
    with _lock:
        rules = list(_rules)
    for r in rules:
        hit = r.resolve(os.path.abspath(path), size)
        if hit is not None:
            return hit
    return None
