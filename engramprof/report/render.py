"""Tables that fit the terminal: no number or name a decision rests on is cut.

The commands print rich tables.  At 80 columns rich would squeeze every column and cut or
fold its cells ("2,27...", "237.0" over "µs").  :func:`fit_table` instead keeps every cell
whole: it first drops the columns marked as secondary (all-zero evidence columns first,
then by ``drop`` rank), then shortens the one column allowed to shrink (a path, cut from
the left so its file name stays), and says in the caption what it left out (``--json``
has everything).  :func:`console` is a Console at the terminal's width, or at ``COLUMNS``
/ 80 when the output is piped (never a forced width).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

#: cells that carry no information in a column of evidence
ZERO_CELLS = frozenset(("", "-", "0", "0.0", "0.00", "0.0 µs", "0.00 ms", "0 µs", "0 ms", "0.0%", "0%"))


def console(stderr: bool = False) -> Console:
    """The terminal's width; piped: ``COLUMNS``, else the terminal on stdin, else 80."""
    return Console(stderr=stderr)


@dataclass
class Col:
    header: str
    justify: str = "right"
    #: 0: never dropped; otherwise dropped when the table does not fit, highest rank first
    drop: int = 0
    #: dropped first (before any ranked column) when every cell is zero / empty
    drop_if_zero: bool = False
    #: may be shortened (from the left, "…/name") to make the table fit; at most one column
    shrink: bool = False
    min_width: int = 12
    style: str | None = None
    #: prose (evidence, a verdict with its share): wraps at spaces inside its column, counted at
    #: ``min_width`` when fitting (a word longer than that still is never cut)
    wrap: bool = False


def shorten_left(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if width > 1 else "…"


def _natural(con: Console, t: Table) -> int:
    """The table's natural width (unclamped: Measurement clamps to the options' max_width)."""
    return Measurement.get(con, con.options.update(max_width=10_000), t).maximum


def _longest_word(c: Col, rows: list, i: int) -> int:
    words = [len(w) for r in rows for w in str(r[i]).split()] + [len(w) for w in c.header.split()]
    return max([c.min_width if c.wrap else 0] + words)


def _longest_cell(c: Col, rows: list, i: int) -> int:
    if c.wrap:
        return _longest_word(c, rows, i)
    return max((len(str(r[i])) for r in rows), default=0)


def _cell(c: Col, text, shrink_to: int | None, measure: bool):
    if c.shrink and shrink_to:
        return shorten_left(text, shrink_to)
    if measure and c.wrap:
        return str(text)[:_clip(c, text)]
    return text


def _clip(c: Col, text) -> int:
    return max(c.min_width, max((len(w) for w in str(text).split()), default=0))


def fit_table(con: Console, cols: list[Col], rows: list[list[str]], *, title: str | None = None,
              caption: str | None = None, width: int | None = None, **table_kw) -> Table:
    """A table of ``rows`` (cells as text) that fits ``width`` (the console's) with its cells
    whole: see the module docstring."""
    width = width or con.width
    keep = list(range(len(cols)))
    dropped: list[str] = []
    zero: list[str] = []
    shrink_to: int | None = None
    stack = [False]  # headers one word a line (once the table is too wide)

    def build(measure: bool = False) -> Table:
        notes = [n for n in (caption,) if n]
        if zero:
            notes.append(f"not shown: {', '.join(zero)} (0 in every row)")
        if dropped:
            notes.append(f"not shown at {width} columns: {', '.join(dropped)} (see --json)")
        t = Table(title=title, title_justify="left", caption="; ".join(notes) or None, caption_justify="left",
                  **table_kw)
        for i in keep:
            c = cols[i]
            header = c.header
            if stack[0] and len(header) > _longest_cell(c, rows, i):  # one word a line
                header = "\n".join(header.split())
            t.add_column(header, justify=c.justify, no_wrap=not c.wrap, style=c.style,
                         overflow="ellipsis" if c.shrink else "fold",
                         min_width=_longest_word(c, rows, i) if c.wrap else None,
                         max_width=_longest_word(c, rows, i) if c.wrap and stack[0] else None)
        for r in rows:
            t.add_row(*(_cell(cols[i], r[i], shrink_to, measure) for i in keep))
        return t

    def natural() -> int:  # prose columns counted at their minimum width
        return _natural(con, build(measure=True))

    if natural() <= width:
        return build()
    for i, c in enumerate(cols):
        if c.drop_if_zero and rows and all(str(r[i]).strip() in ZERO_CELLS for r in rows):
            keep.remove(i)
            zero.append(c.header)
    if natural() > width:
        stack[0] = True
    order = sorted((i for i in keep if cols[i].drop), key=lambda i: -cols[i].drop)
    while natural() > width:
        shrinkable = [i for i in keep if cols[i].shrink]
        if shrinkable and shrink_to is None:  # first try the path: cut from its left
            i = shrinkable[0]
            longest = max([len(cols[i].header)] + [len(str(r[i])) for r in rows])
            shrink_to = max(cols[i].min_width, longest - (natural() - width))
            if natural() <= width:
                break
        if not order:
            break
        j = order.pop(0)
        keep.remove(j)
        dropped.append(cols[j].header)
        shrink_to = None
    return build()


# ------------------------------------------------------------------------ sentences --

_BREAK = re.compile(r"(?<=; )|(?<=: )|(?<= — )|(?= \()")


def say(con: Console, text, indent: int = 2, width: int | None = None) -> None:
    """Print a sentence at the console's width without breaking a clause where avoidable:
    lines break after "; ", ": " and " — " or before " (" (continuation lines indented by
    ``indent``); a clause longer than a line wraps at words under its own indent.
    ``text``: a str (printed as plain text, not markup) or a rich Text."""
    t = text if isinstance(text, Text) else Text(str(text))
    width = width or con.width
    plain = t.plain
    if len(plain) <= width:
        con.print(t, soft_wrap=True)
        return
    cuts = [m.start() for m in _BREAK.finditer(plain) if 0 < m.start() < len(plain)]
    chosen, start = [], 0
    while True:
        room = width - (indent if start else 0)
        if len(plain) - start <= room:
            break
        # a clause break that fills at least half the line; else the rest wraps at words
        fitting = [c for c in cuts if start + room // 2 < c <= start + room]
        if not fitting:
            break
        chosen.append(fitting[-1])
        start = fitting[-1]
    import textwrap

    for k, piece in enumerate(t.divide(chosen)):
        body = piece.plain.strip()
        lead = " " * (indent if k else 0)
        if len(lead) + len(body) <= width:
            line = Text(lead)
            line.append_text(_strip_text(piece))
            con.print(line, soft_wrap=True)
            continue
        # one clause longer than a line: wrap it at words, continuation lines indented
        for line in textwrap.wrap(body, width, initial_indent=lead, subsequent_indent=" " * indent,
                                  break_long_words=False, break_on_hyphens=False):
            con.print(Text(line, style=piece.style), soft_wrap=True)


def _strip_text(piece: Text) -> Text:
    n = len(piece.plain) - len(piece.plain.lstrip())
    out = piece[n:]
    out.rstrip()
    return out
