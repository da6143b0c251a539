"""Options several commands share, defined once."""
from __future__ import annotations

LAYOUT_HELP = ("A layout file (TOML) naming the tensor, row bytes and first row of raw table files "
               "(.bin); safetensors files need none. See docs/tables.md.")


def use_layout(path) -> None:
    """Register ``--layout FILE`` for this process (tensor / row of raw table files)."""
    if path is not None:
        from engramprof.tables import raw as raw_layout

        raw_layout.use(path)
