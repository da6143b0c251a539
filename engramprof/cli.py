"""engramprof command line: a thin typer layer over the modules that do the work.

Each command module in engramprof.commands has a ``register(app)`` that adds its commands;
the work itself lives in the modules those commands call.
"""
from __future__ import annotations

import os
import sys

import typer

from engramprof import __version__
from engramprof.commands import (
    batch_tail,
    compare,
    demo,
    diagnose,
    doctor,
    export,
    lab,
    lab_scenario,
    replay,
    residency,
    sample,
    syscalls,
)
from engramprof.errors import UserError
from engramprof.host.pages import prefer_small_pages
from engramprof.validate import bad_number

#: ``-h`` as well as ``--help``, on every command (sub-commands' contexts inherit it; lab_app sets it too)
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="engramprof",
    help=(
        "Tell, with evidence, which of page-cache residency, memory reclaim, storage service "
        "or Python scheduling holds back a table-on-disk reader's decode batches.\n\n"
        "On call: run `engramprof doctor`, then `engramprof diagnose -p PID`, then follow "
        "playbooks/decode-steps-slow.md."
    ),
    context_settings=CONTEXT_SETTINGS,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: registration order (the order of the root --help, diagnose first: what an on-call user
#: runs); ``lab_scenario`` adds its command to the ``lab`` group
COMMAND_MODULES = (diagnose, doctor, syscalls, sample, batch_tail, residency, replay, compare, export, demo, lab,
                   lab_scenario)

for _mod in COMMAND_MODULES:
    _mod.register(app)


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Each paragraph of a command's docstring as one line, so that --help wraps it at the
    terminal's width instead of breaking it where the source line ended ("Ends on" /
    "Ctrl-C, ...").  Paragraphs stay apart; epilogs (the examples) are left as written."""
    import inspect

    for info in typer_app.registered_commands:
        text = info.help if isinstance(info.help, str) else (info.callback.__doc__ if info.callback else None)
        if text:
            paras = inspect.cleandoc(text).split("\n\n")
            info.help = "\n\n".join(" ".join(p.split()) for p in paras)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _unwrap_help(group.typer_instance)


_unwrap_help(app)


def _conventional_help() -> None:
    """--help as bcc / perf / py-spy users read it: an option's value is named by its metavar
    (``PID``, ``SECONDS``; set on each option), a flag shows none (typer would print
    ``<bool>``), an argument is named once, by its metavar (not again as ``<str>``), and the
    usage line shows a required argument bare (``TRACE``, not ``{TRACE}``).  typer has no
    setting for these; each patch is skipped where its typer lacks the method."""
    from typer import core

    opt, arg = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if opt is not None and hasattr(opt, "display_type_rich"):
        opt_type = opt.display_type_rich

        def option_type(self, ctx):
            return None if self.is_flag or self.count else opt_type(self, ctx)

        opt.display_type_rich = option_type
    if arg is not None and hasattr(arg, "display_type_rich"):
        arg_type = arg.display_type_rich

        def argument_type(self, ctx):
            return None if self.metavar is not None else arg_type(self, ctx)

        arg.display_type_rich = argument_type
    if arg is not None and hasattr(arg, "_usage_display_name"):
        def usage_name(self):
            name = self.metavar if self.metavar is not None else self.name.upper()
            name = name if self.required else f"[{name}]"
            return name + ("..." if self.nargs != 1 and not name.endswith("...") else "")

        arg._usage_display_name = usage_name


_conventional_help()


def _print_version(value: bool) -> None:
    if value:
        print(f"engramprof {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print engramprof's version and exit."),
) -> None:
    pass


def usage_line(exc) -> str:
    """A click usage error as one line: ``engramprof: COMMAND: message (see ... --help)``."""
    msg = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else PROG
    sub = path[len(PROG):].strip()
    where = f"{sub}: " if sub else ""
    return f"{PROG}: {where}{msg} (see '{path} --help')"


PROG = "engramprof"


def _number_line(exc) -> str | None:
    """A value that does not parse as the number an option takes (``--duration abc``), in
    the words of every other bad number (engramprof.validate.bad_number); None for
    any other usage error."""
    cause, param = getattr(exc, "__cause__", None), getattr(exc, "param", None)
    errors = getattr(cause, "errors", None)
    if param is None or not callable(errors):
        return None
    try:
        err = errors()[0]
    except Exception:  # not pydantic's ValidationError
        return None
    kind = str(err.get("type", ""))
    what = "an integer" if kind.startswith("int_") else "a number" if kind.startswith("float_") else None
    if what is None:
        return None
    flag = max((o for o in param.opts if o.startswith("--")), key=len, default=param.opts[0] if param.opts else "")
    return f"{PROG}: {bad_number(flag or param.name, what, str(err.get('input')))}"


def main() -> None:
    from typer import exceptions as typer_exc
    from typer._click import exceptions as click_exc  # typer's own click

    prefer_small_pages()
    try:
        # standalone_mode=False: click's usage errors come here (one line, exit 2) instead
        # of typer's boxed panel; --help is printed by click itself, rich as before
        rc = app(standalone_mode=False, prog_name=PROG)
        # exit as click's standalone mode does (callers and tests expect SystemExit)
        sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)
    except click_exc.NoArgsIsHelpError:  # `engramprof lab`: typer printed the help, as before
        sys.exit(2)
    except click_exc.UsageError as exc:
        print(_number_line(exc) or usage_line(exc), file=sys.stderr)
        sys.exit(2)
    except click_exc.ClickException as exc:
        print(f"{PROG}: {' '.join(exc.format_message().split())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer_exc.Abort:
        print(f"{PROG}: aborted", file=sys.stderr)
        sys.exit(1)
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
