"""Every command of every on-call playbook runs, for real, against a live lab scenario.

The playbooks (playbooks/*.md) are Markdown; each ```sh block holds exactly one command.
This test parses every playbook, takes every ```sh block in order, substitutes the
placeholders from a live `engramprof.lab.scenarios.Scenario`, runs the command with bash
(`engramprof` mapped to `.venv/bin/python -m engramprof`) and checks:

* the exit status is 0, or the one written in the block as a comment `# exit N expected ...`;
* no Python traceback on stderr or stdout;
* with `--json`, stdout is JSON (one or more values, so `| jq` filters are covered too), and
  a `| jq` projection has no top-level key that came out null: a renamed or misspelt key in
  a playbook's filter fails here instead of printing `null` to someone at 3 a.m.

Placeholders: $PID, $MARKERS, $TABLE, $TRACE, each optionally suffixed _BEFORE / _AFTER.
$PID<s> / $MARKERS<s> come from the scenario configured for suffix <s> (SCENARIOS below;
default: python-scheduling). That scenario starts when a block first needs it and stops after
the last block that uses its $PID (its markers file is kept, for later analysis steps).
$TRACE<s> is a new path in the test's directory that does not exist yet: the playbook's own
recording command (`syscalls` / `diagnose --output $TRACE`) creates it, and later blocks read
it, as they would on call. $TABLE<s> is the table the scenarios read (one per playbook run,
shared by its scenarios, so before/after read the same file).

ENGRAMPROF_PLAYBOOK_OUTPUT=DIR keeps every command's output there (<playbook>-<line>.out).

Durations: `--duration N` / `-d N` of an `engramprof` command is rewritten to at most
ENGRAMPROF_PLAYBOOK_DURATION seconds (default 4) so the whole file stays a few minutes on
2 cores; the playbooks keep realistic windows (30-60 s).

The static checks (no root) run everywhere: each playbook has commands, only ```sh blocks are
shell (```bash / ```shell / ```console would escape the test: refused), one command per
block, known placeholders only, `engramprof` subcommands that exist, links between playbooks
that resolve.  The live run is @pytest.mark.bpf (tests/conftest.py skips or fails it).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK_DIR = REPO / "playbooks"
VENV_PY = REPO / ".venv" / "bin" / "python"

REQUIRED = ("decode-steps-slow.md", "long-prefill-ttft.md", "after-deploy.md",
            "memory-pressure-unified-memory.md")

#: playbook -> {placeholder suffix: Scenario(**kwargs)}; anything not listed: DEFAULT_SCENARIOS
SCENARIOS: dict[str, dict[str, dict]] = {
    "decode-steps-slow.md": {"": {"name": "python-scheduling"}},
    # prefill-shaped batches (2000 tokens: ~48k rows a batch) on a cached table: the
    # playbook's replay step needs rows that are resident (a residency scenario evicts them
    # every 20 ms, so its replay would exit 2 by construction)
    "long-prefill-ttft.md": {"": {"name": "python-scheduling", "tokens": 2000}},
    # control on the old (pool) reader, canary on the NOWAIT-first reader, same table and shape
    "after-deploy.md": {"_BEFORE": {"name": "python-scheduling"}, "_AFTER": {"name": "healthy"}},
    "memory-pressure-unified-memory.md": {"": {"name": "reclaim"}},
}
DEFAULT_SCENARIOS = {"": {"name": "python-scheduling"}}

DURATION_CAP_S = float(os.environ.get("ENGRAMPROF_PLAYBOOK_DURATION", "4"))
#: a directory to keep every command's output in (<playbook>-<line>.out), to read what a step prints
OUTPUT_DIR = os.environ.get("ENGRAMPROF_PLAYBOOK_OUTPUT")
COMMAND_TIMEOUT_S = 180
TABLE_ROWS = 1 << 18  # the scenarios' default table size (132 MiB)

SHELL_LANGS = {"sh"}
REFUSED_LANGS = {"bash", "shell", "console", "zsh", "sh-session", "shell-session"}
PLACEHOLDER_RE = re.compile(r"\$(PID|MARKERS|TABLE|TRACE)(_BEFORE|_AFTER)?(?![A-Za-z0-9_])")
ANY_VAR_RE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
EXPECT_RE = re.compile(r"^#\s*exit\s+(\d+)\s+expected\b", re.I)
DURATION_RE = re.compile(r"(--duration|-d)(=|\s+)(\d+(?:\.\d+)?)")
FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
LINK_RE = re.compile(r"\]\(([^)#\s]+\.md)(#[^)]*)?\)")


@dataclass
class Step:
    playbook: str
    line: int        # line of the opening fence
    command: str     # continuation lines joined
    expect: int = 0
    problems: list[str] = field(default_factory=list)


def parse_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """Fenced code blocks as (language, line of the opening fence, body lines)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start, body, i = i + 1, [], i + 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            ln = lines[i]
            body.append(ln[indent:] if ln[:indent].strip() == "" else ln.lstrip())
            i += 1
        blocks.append((lang, start, body))
        i += 1
    return blocks


def parse_playbook(path: Path) -> tuple[list[Step], list[str]]:
    """The playbook's shell steps in order, and problems that make it untestable."""
    steps, problems = [], []
    for lang, line, body in parse_blocks(path.read_text()):
        if lang in REFUSED_LANGS:
            problems.append(f"{path.name}:{line}: ```{lang} block: use ```sh (run by this test) "
                            "or ```text (shown, not run)")
            continue
        if lang not in SHELL_LANGS:
            continue
        expect, cmds, cur = 0, [], ""
        for raw in body:
            s = raw.strip()
            if not cur and (not s or s.startswith("#")):
                m = EXPECT_RE.match(s)
                if m:
                    expect = int(m.group(1))
                continue
            cur = f"{cur} {s[:-1].strip()}" if s.endswith("\\") else f"{cur} {s}"
            if not s.endswith("\\"):
                cmds.append(cur.strip())
                cur = ""
        if cur:
            cmds.append(cur.strip())
        step = Step(path.name, line, cmds[0] if cmds else "", expect)
        if len(cmds) != 1:
            problems.append(f"{path.name}:{line}: a ```sh block must hold exactly one command, "
                            f"found {len(cmds)}")
        for var in ANY_VAR_RE.findall(step.command):
            if var.isupper() and not PLACEHOLDER_RE.fullmatch(f"${var}"):
                problems.append(f"{path.name}:{line}: unknown placeholder ${var} (known: $PID, $MARKERS, "
                                "$TABLE, $TRACE, optionally _BEFORE/_AFTER)")
        steps.append(step)
    if not steps:
        problems.append(f"{path.name}: no ```sh command: every playbook step must be a tested command")
    return steps, problems


def playbooks() -> list[Path]:
    return sorted(PLAYBOOK_DIR.glob("*.md"))


def engramprof_commands() -> set[str]:
    from typer.main import get_command

    from engramprof.cli import app

    return set(get_command(app).commands)


# --------------------------------------------------------------------------- static checks


def test_required_playbooks_exist():
    names = {p.name for p in playbooks()}
    missing = [n for n in REQUIRED if n not in names]
    assert not missing, f"missing playbooks: {missing}"


@pytest.mark.parametrize("path", playbooks(), ids=lambda p: p.name)
def test_playbook_is_testable(path: Path):
    steps, problems = parse_playbook(path)
    known = engramprof_commands()
    for st in steps:
        lex = shlex.shlex(st.command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words = list(lex)
        words = words[:words.index("|")] if "|" in words else words
        if words and words[0] == "engramprof":
            sub = next((w for w in words[1:] if not w.startswith("-")), None)
            if sub not in known:
                problems.append(f"{path.name}:{st.line}: `engramprof {sub}` is not a command "
                                f"(have: {', '.join(sorted(known))})")
    for target, _anchor in LINK_RE.findall(path.read_text()):
        if "://" not in target and not (path.parent / target).exists():
            problems.append(f"{path.name}: link to {target}, which does not exist")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- live run


def _json_values(text: str) -> list:
    dec, out, i, text = json.JSONDecoder(), [], 0, text.strip()
    while i < len(text):
        val, end = dec.raw_decode(text, i)
        out.append(val)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _cap_duration(cmd: str) -> str:
    if not cmd.startswith("engramprof "):
        return cmd
    return DURATION_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{min(float(m.group(3)), DURATION_CAP_S):g}", cmd)


class PlaybookRun:
    """Scenarios started on first use and stopped after their last $PID, plus paths."""

    def __init__(self, playbook: str, steps: list[Step], workdir: Path, stack: contextlib.ExitStack):
        from engramprof.lab import table as labtable

        self.playbook, self.steps, self.workdir, self.stack = playbook, steps, workdir, stack
        self.config = SCENARIOS.get(playbook, DEFAULT_SCENARIOS)
        self.table = workdir / "engram.safetensors"
        labtable.make_table(self.table, rows=TABLE_ROWS, seed=0)
        self.running: dict[str, object] = {}
        self.markers: dict[str, Path] = {}
        self.last_pid_use: dict[str, int] = {}
        for i, st in enumerate(steps):
            for name, sfx in PLACEHOLDER_RE.findall(st.command):
                if name == "PID":
                    self.last_pid_use[sfx] = i

    def scenario(self, sfx: str):
        from engramprof.lab.scenarios import Scenario

        if sfx not in self.config:
            raise AssertionError(f"{self.playbook}: uses a placeholder with suffix {sfx or '(none)'!r} but "
                                 f"tests/test_playbooks.py SCENARIOS configures only {sorted(self.config)}")
        if sfx not in self.running:
            if sfx in self.markers:
                raise AssertionError(f"{self.playbook}: $PID{sfx} used after its scenario was stopped")
            kw = dict(self.config[sfx])
            name = kw.pop("name")
            self.markers[sfx] = self.workdir / f"markers{sfx.lower()}.jsonl"
            sc = Scenario(name, keep_running=True, table=self.table, markers=self.markers[sfx],
                          python=str(VENV_PY), **kw)
            self.stack.callback(sc.close)
            sc.start()
            self.running[sfx] = sc
        return self.running[sfx]

    def substitute(self, cmd: str) -> str:
        def one(m: re.Match) -> str:
            name, sfx = m.group(1), m.group(2) or ""
            if name == "PID":
                return str(self.scenario(sfx).pid)
            if name == "MARKERS":
                if sfx not in self.markers:
                    self.scenario(sfx)
                return shlex.quote(str(self.markers[sfx]))
            if name == "TABLE":
                return shlex.quote(str(self.table))
            return shlex.quote(str(self.workdir / f"trace{sfx.lower()}"))  # TRACE: made by the playbook
        return PLACEHOLDER_RE.sub(one, cmd)

    def done_with(self, index: int) -> None:
        for sfx, last in self.last_pid_use.items():
            if last == index and sfx in self.running:
                self.running.pop(sfx).close()

    def scenario_log(self) -> str:
        return "\n".join(line for sc in self.running.values() for line in sc.lines[-15:])


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    prelude = ("set -o pipefail\n"
               f"engramprof() {{ {shlex.quote(str(VENV_PY))} -m engramprof \"$@\"; }}\n")
    env = dict(os.environ, COLUMNS="120")
    return subprocess.run(["bash", "-c", prelude + cmd], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def check_result(st: Step, cmd: str, p: subprocess.CompletedProcess) -> list[str]:
    errs = []
    if p.returncode != st.expect:
        errs.append(f"exit status {p.returncode}, expected {st.expect}")
    for stream, text in (("stderr", p.stderr), ("stdout", p.stdout)):
        if "Traceback (most recent call last)" in text:
            errs.append(f"a Python traceback on {stream}")
    if "--json" in cmd and p.returncode == 0:
        try:
            values = _json_values(p.stdout)
        except ValueError as exc:
            errs.append(f"--json output is not JSON: {exc}")
            values = []
        if not values and not errs:
            errs.append("--json printed nothing")
        if re.search(r"\|\s*jq\b", cmd):
            for v in values:
                if isinstance(v, dict):
                    nulls = [k for k, x in v.items() if x is None]
                    if nulls:
                        errs.append(f"jq projection gave null for {nulls}: a key the filter names is "
                                    "missing from the command's JSON (renamed?)")
    return errs


@pytest.mark.bpf
@pytest.mark.parametrize("path", playbooks(), ids=lambda p: p.name)
def test_playbook_commands_run(path: Path):
    steps, problems = parse_playbook(path)
    assert not problems, "\n".join(problems)
    if shutil.which("jq") is None and any(re.search(r"\|\s*jq\b", s.command) for s in steps):
        pytest.fail(f"{path.name} pipes output through jq, which is not installed (apt-get install jq)",
                    pytrace=False)
    from engramprof.lab.scenarios import default_tmp_parent

    t_all = time.monotonic()
    log = []
    workdir = Path(tempfile.mkdtemp(prefix="engramprof-playbook-", dir=default_tmp_parent()))
    try:
        with contextlib.ExitStack() as stack:
            run = PlaybookRun(path.name, steps, workdir, stack)
            for i, st in enumerate(steps):
                cmd = _cap_duration(run.substitute(st.command))
                t0 = time.monotonic()
                p = _run(cmd, workdir)
                secs = time.monotonic() - t0
                log.append(f"{secs:6.1f}s  exit {p.returncode}  {path.name}:{st.line}  {st.command[:100]}")
                if OUTPUT_DIR:
                    os.makedirs(OUTPUT_DIR, exist_ok=True)
                    Path(OUTPUT_DIR, f"{path.stem}-{st.line}.out").write_text(
                        f"$ {cmd}\n# exit {p.returncode}, {secs:.1f} s\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}")
                errs = check_result(st, cmd, p)
                if errs:
                    pytest.fail(
                        f"{path.name}:{st.line}: {'; '.join(errs)}\n"
                        f"playbook command: {st.command}\nran: {cmd}\n"
                        f"--- stderr (tail)\n{p.stderr[-3000:]}\n--- stdout (tail)\n{p.stdout[-3000:]}\n"
                        f"--- scenario (tail)\n{run.scenario_log()}\n--- steps so far\n" + "\n".join(log),
                        pytrace=False)
                run.done_with(i)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{path.name}: {len(steps)} commands in {time.monotonic() - t_all:.1f} s\n" + "\n".join(log))
