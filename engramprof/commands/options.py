"""Options several commands share, defined once."""
from __future__ import annotations

LAYOUT_HELP = ("A layout file (TOML) naming the tensor, row bytes and first row of raw table files "
               "(.bin); safetensors files need none. See docs/tables.md.")


def use_layout(path) -> None:
    """Register ``--layout FILE`` for this process (tensor / row of raw table files)."""
    if path is not None:
        from engramprof.tables import raw as raw_layout

        raw_layout.use(path)


# ------------------------------------------------ -p / -d / -o: the live commands' flags

def pid_option(help: str):
    """``--pid/-p PID`` (repeatable): the process(es) a live command targets."""
    import typer

    return typer.Option(None, "--pid", "-p", metavar="PID", help=help)


def duration_option(default, help: str):
    """``--duration/-d SECONDS``."""
    import typer

    return typer.Option(default, "--duration", "-d", metavar="SECONDS", help=help)


def output_option(help: str):
    """``--output/-o TRACE``: the trace bundle (a new directory) a live command writes."""
    import typer

    return typer.Option(None, "--output", "-o", metavar="TRACE", help=help)
