"""Write an Engram-shaped safetensors table filled with random bytes.

Per Engram layer L: ``layers.L.engram.embed.weight`` [rows, dim] F8_E4M3 and
``layers.L.engram.embed.scale`` [rows, dim/32] U8 (one scale byte per 32 weights).
Without ``force`` the file is created with ``O_EXCL | O_NOFOLLOW``; with ``force`` it is
written to a new temporary file beside it and renamed over the path (which replaces a
symlink rather than writing through it).  The free space of the target's filesystem is
checked first (statvfs), and a disk that fills anyway (ENOSPC, EDQUOT) is an exit-1 error;
the partial file is removed in every case.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
from pathlib import Path
from typing import Callable

import numpy as np

from engramprof.errors import UserError
from engramprof.tables import safetensors as layout

DEFAULT_ROWS = 1 << 19  # 2 layers x 524288 rows x (256 + 8) bytes = 264 MiB
DEFAULT_DIM = 256
DEFAULT_LAYERS = (3, 17)
SCALE_BLOCK = 32
CHUNK = 8 << 20


def weight_name(layer: int) -> str:
    return f"layers.{layer}.engram.embed.weight"


def scale_name(layer: int) -> str:
    return f"layers.{layer}.engram.embed.scale"


def engram_layers(lay: layout.Layout) -> list[int]:
    """Layers that have both an Engram weight and scale tensor, in file order."""
    names = set(lay.names())
    out = []
    for t in lay.tensors:
        parts = t.name.split(".")
        if (len(parts) == 5 and parts[0] == "layers" and parts[1].isdigit()
                and t.name == weight_name(int(parts[1])) and scale_name(int(parts[1])) in names):
            out.append(int(parts[1]))
    return out


def build_header(rows: int, dim: int, layers: tuple[int, ...] | list[int]) -> bytes:
    """The 8-byte length plus the space-padded JSON header."""
    if rows < 1:
        raise UserError("rows must be at least 1")
    if dim < SCALE_BLOCK or dim % SCALE_BLOCK:
        raise UserError(f"dim (weights per row) must be a positive multiple of {SCALE_BLOCK}")
    if not layers or len(set(layers)) != len(layers) or min(layers) < 0:
        raise UserError("layers must be distinct non-negative integers, e.g. (3, 17)")
    head: dict = {"__metadata__": {
        "format": "pt", "engramprof": "lab-table", "rows": str(rows), "dim": str(dim),
    }}
    pos = 0
    for layer in layers:
        for name, width, dtype in ((weight_name(layer), dim, "F8_E4M3"),
                                   (scale_name(layer), dim // SCALE_BLOCK, "U8")):
            head[name] = {"dtype": dtype, "shape": [rows, width],
                          "data_offsets": [pos, pos + rows * width]}
            pos += rows * width
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def data_bytes(rows: int, dim: int, layers) -> int:
    return len(layers) * rows * (dim + dim // SCALE_BLOCK)


class TableExistsError(UserError):
    """The table's path exists and ``force`` was not given."""

    def __init__(self, path: Path):
        super().__init__(f"{path} already exists (force=True replaces it)")
        self.path = path


#: write errors that mean "the disk is full" rather than a bug
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check_space(path: Path, total: int) -> None:
    """Exit-1 UserError unless the filesystem of ``path`` has ``total`` bytes free for us."""
    d = path.parent if str(path.parent) else Path(".")
    try:
        st = os.statvfs(d)
    except FileNotFoundError:
        raise UserError(f"cannot create {path}: {d} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot create {path}: {d}: {exc.strerror}") from None
    free = st.f_bavail * st.f_frsize
    if free < total:
        raise UserError(f"not enough free space for {path}: the table needs {_mib(total)}, "
                        f"{d} has {_mib(free)} free", code=1)


def check_can_create(path: str | os.PathLike, rows: int, dim: int, layers, force: bool = False) -> int:
    """Every check :func:`make_table` makes before writing a byte (shape, existing path,
    directory, free space); returns the file's size."""
    path = Path(path)
    header = build_header(rows, dim, tuple(layers))
    if path.is_dir() and not path.is_symlink():
        raise UserError(f"{path} is a directory (give the path of the table file to create)")
    if not force and os.path.lexists(path):
        raise TableExistsError(path)
    total = len(header) + data_bytes(rows, dim, layers)
    check_space(path, total)
    return total


def _create(path: Path, force: bool) -> tuple[int, Path]:
    """(fd, the path being written); the latter is a temporary name when ``force``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    target = path
    if force:
        if path.is_dir() and not path.is_symlink():
            raise UserError(f"{path} is a directory")
        target = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        return os.open(target, flags, 0o644), target
    except FileExistsError:
        raise TableExistsError(path) from None
    except OSError as exc:
        raise UserError(f"cannot create {path}: {exc.strerror}") from None


def make_table(
    path: str | os.PathLike,
    rows: int = DEFAULT_ROWS,
    dim: int = DEFAULT_DIM,
    layers: tuple[int, ...] | list[int] = DEFAULT_LAYERS,
    *,
    force: bool = False,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> layout.Layout:
    """Write the table; ``progress(done_bytes, total_bytes)`` is called per chunk.
    Returns the parsed (validated) layout of the written file."""
    path = Path(path)
    check_can_create(path, rows, dim, layers, force)
    header = build_header(rows, dim, tuple(layers))
    total = len(header) + data_bytes(rows, dim, layers)
    rng = np.random.default_rng(seed)
    fd, target = _create(path, force)
    done = 0
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            f.write(header)
            done = len(header)
            while done < total:
                n = min(CHUNK, total - done)
                buf = memoryview(rng.bytes(n))
                while buf:  # raw file: write() may be partial
                    buf = buf[f.write(buf):]
                done += n
                if progress:
                    progress(done, total)
        if target != path:
            os.replace(target, path)
    except BaseException as exc:
        try:
            os.unlink(target)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            raise UserError(f"{path}: {exc.strerror} after {_mib(done)} of {_mib(total)} "
                            "(the partial file was removed)", code=1) from None
        raise
    return layout.load(path)
