"""engramprof command line: a thin typer layer over the modules that do the work.

Each command module in engramprof.commands has a ``register(app)`` that adds its commands;
the work itself lives in the modules those commands call.
"""
from __future__ import annotations

import os
import sys

import typer

from engramprof.commands import (batch_tail, demo, diagnose, doctor, lab, lab_scenario, replay, residency,
                                 sample, syscalls)
from engramprof.errors import UserError

app = typer.Typer(
    name="engramprof",
    help=(
        "Tell, with evidence, which of page-cache residency, memory reclaim, storage service "
        "or Python scheduling holds back a table-on-disk reader's decode batches."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: registration order: ``lab_scenario`` adds its command to the ``lab`` group
COMMAND_MODULES = (doctor, lab, lab_scenario, syscalls, sample, batch_tail, residency, replay, diagnose, demo)

for _mod in COMMAND_MODULES:
    _mod.register(app)


def main() -> None:
    from engramprof.pages import prefer_small_pages

    prefer_small_pages()
    try:
        app()
    except UserError as exc:
        print(f"engramprof: {exc}", file=sys.stderr)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        print("engramprof: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # a bug: still one line; the traceback on request
        if os.environ.get("ENGRAMPROF_DEBUG"):
            raise
        print(f"engramprof: internal error: {type(exc).__name__}: {exc} (ENGRAMPROF_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(70)
