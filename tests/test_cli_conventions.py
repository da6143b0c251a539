"""The CLI in its field's conventions (bcc, perf, py-spy), walked over every command of the
typer app (``lab`` sub-commands included):

* ``-h`` is ``--help`` everywhere;
* every option that takes a value names it with an upper-case metavar (``PID``, ``SECONDS``,
  ``TRACE``), never a Python type (``<list[int]>``, ``<str>``); a flag shows none; usage lines
  show arguments bare (``TRACE``, not ``{trace}``);
* each option shows one default (not ``(default: x)`` in its help and ``[default: y]`` too);
* the live commands take ``-p`` / ``-d`` / ``-o``;
* the root --help lists ``diagnose`` first, with the on-call recipe.
"""
from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from engramprof.cli import app

METAVAR = re.compile(r"^[A-Z][A-Z0-9_]*([:=,][A-Z0-9_]+)*(\.\.\.)?$")


def _commands():
    out = {}

    def walk(cmd, path):
        if getattr(cmd, "commands", None):
            out[path] = cmd
            for name, sub in cmd.commands.items():
                walk(sub, path + (name,))
        else:
            out[path] = cmd

    walk(typer.main.get_command(app), ())
    return out


COMMANDS = _commands()
LEAVES = {p: c for p, c in COMMANDS.items() if not getattr(c, "commands", None)}


def _ctx(path, cmd):
    return cmd.make_context(" ".join(("engramprof",) + path), ["--help"], resilient_parsing=True)


def _help(path) -> str:
    r = CliRunner().invoke(app, [*path, "-h"], env={"COLUMNS": "80", "TERM": "dumb"}, prog_name="engramprof")
    assert r.exit_code == 0, (path, r.output)
    return r.output


def test_commands_walked():
    assert {("diagnose",), ("sample",), ("lab", "run"), ("lab", "scenario"), ("compare",)} <= set(LEAVES)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p) or "root")
def test_dash_h_is_help(path):
    out = _help(path)
    assert "Usage: engramprof" in " ".join(out.split()) and "-h" in out


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_metavars_name_what_they_take(path):
    cmd = LEAVES[path]
    ctx = _ctx(path, cmd)
    bad = []
    for prm in cmd.get_params(ctx):
        shown = prm.display_type_rich(ctx) if hasattr(prm, "display_type_rich") else prm.make_metavar(ctx)
        if getattr(prm, "is_flag", False) or getattr(prm, "count", False):
            if shown:
                bad.append(f"{prm.opts}: flag shows {shown!r}")
            continue
        name = prm.metavar if prm.param_type_name == "argument" else shown
        if not name or not METAVAR.match(name):
            bad.append(f"{prm.opts or prm.name}: metavar {name!r}")
    assert not bad, f"engramprof {' '.join(path)}: " + "; ".join(bad)
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    assert "{" not in usage and "<" not in usage and not re.search(r"\b[a-z_]+\b", usage), usage
    out = _help(path)
    assert not re.search(r"<(list|str|int|float|bool|path|Path)\b", out), out
    assert "{" not in next(line for line in out.splitlines() if "Usage:" in line)


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_each_option_shows_one_default(path):
    cmd = LEAVES[path]
    ctx = _ctx(path, cmd)
    twice = []
    for prm in cmd.get_params(ctx):
        rec = prm.get_help_record(ctx)
        if rec and len(re.findall(r"\bdefault\b", rec[1], re.I)) > 1:
            twice.append(f"{prm.opts}: {rec[1]}")
    assert not twice, "\n".join(twice)


@pytest.mark.parametrize("path", [("syscalls",), ("diagnose",), ("sample",)], ids=" ".join)
def test_live_commands_take_p_d_o(path):
    opts = {o for prm in LEAVES[path].params for o in prm.opts}
    assert {"-p", "-d", "-o"} <= opts, opts


def test_lab_run_takes_d_and_lists_the_readers_that_exist():
    from engramprof.lab.readers import READERS

    assert "-d" in {o for prm in LEAVES[("lab", "run")].params for o in prm.opts}
    flat = " ".join(_help(("lab", "run")).split())
    assert all(r in flat for r in READERS), flat


def test_root_help_lists_diagnose_first_with_the_on_call_recipe():
    out = _help(())
    flat = " ".join(out.split())
    i, j, k = flat.find("engramprof doctor"), flat.find("engramprof diagnose -p PID"), flat.find(
        "playbooks/decode-steps-slow.md")
    assert -1 < i < j < k, flat
    listed = re.findall(r"^│ ([a-z][a-z-]+)\s", out.split("Commands")[1], flags=re.M)
    assert listed[0] == "diagnose", listed
