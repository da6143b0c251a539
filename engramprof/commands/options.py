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


# ------------------------------------------------ --stack-hz: the Python stacks (py-spy)

STACK_HZ_DEFAULT = 5.0  # engramprof.sampling.stacks.DEFAULT_STACK_HZ (not imported: --help stays fast)
STACK_HZ_MAX = 50.0  # a py-spy dump takes 10-20 ms: more rounds a second than this cannot be had


def stack_hz_option():
    """``--stack-hz HZ``: the target's Python stacks and GIL holder with py-spy (0: off)."""
    import typer

    return typer.Option(STACK_HZ_DEFAULT, "--stack-hz", metavar="HZ",
                        help="Python stacks and GIL holder sampled with py-spy, rounds a second (0: off; the code view).")


def check_stack_hz(value: float) -> None:
    from engramprof import validate

    if value != 0:
        validate.in_range("--stack-hz", value, 0.0, STACK_HZ_MAX, lo_open=True, what=" Hz (0: off)")
