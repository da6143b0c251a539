"""The docs a user finds their way in: checked against the commands themselves.

* every registered command (the typer app walked as a click group, `lab` subcommands
  included) has its page in docs/commands/ with the BCC man-page sections, every option of
  its --help named under OPTIONS, an example file in docs/examples/, and an examples epilog;
* README.md is at most 300 lines and links to every command page; relative links in the
  README, docs/ and benchmarks/RESULTS.md resolve (files and #anchors);
* the JSON keys a page lists under FIELDS ("### JSON keys": a table whose first column holds
  the keys in backticks, dotted paths, ``[]`` for list elements, ``<name>`` for any key; the
  second column says when the key is present, ``always`` or a condition) are the keys the
  command really prints with --json.  Rules, per real run:
    - every top-level key printed is documented;
    - where a page lists any child of an object, every child printed is documented;
    - every key documented as ``always`` is printed (inside each printed parent).
  Commands that need neither root nor BPF run on small synthetic or lab inputs; `syscalls`
  and `diagnose` run for a few seconds against a lab reader (``@pytest.mark.bpf``); `lab
  scenario` needs root.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.synthetic import engramprof as _run, fs_type, planned_trace

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
DOCS = REPO / "docs"
PAGES = DOCS / "commands"
EXAMPLES = DOCS / "examples"
README = REPO / "README.md"
SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXAMPLES", "FIELDS", "OVERHEAD", "LIMITS", "SEE ALSO"]
MAX_README_LINES = 300
EPILOG_WIDTH = 76  # typer pads the epilog by one column each side: fits 80 columns


# ------------------------------------------------------------------------- the commands


def _commands() -> dict[tuple[str, ...], object]:
    import typer.main

    from engramprof.cli import app

    out: dict[tuple[str, ...], object] = {}

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + (name,))
        else:
            out[path] = cmd

    walk(typer.main.get_command(app), ())
    return out


COMMANDS = _commands()


def page_of(path: tuple[str, ...]) -> Path:
    """docs/commands/<a>-<b>.md, else the group's page (lab make-table -> lab.md)."""
    for n in range(len(path), 0, -1):
        p = PAGES / ("-".join(path[:n]) + ".md")
        if p.exists():
            return p
    return PAGES / ("-".join(path) + ".md")


def _ids(path):
    return " ".join(path)


def _options(cmd) -> list[str]:
    opts = []
    for prm in cmd.params:
        if type(prm).__name__.endswith("Argument"):
            continue
        opts += [o for o in list(prm.opts) + list(getattr(prm, "secondary_opts", [])) if o.startswith("--")]
    return [o for o in opts if o != "--help"]


def _has_json(cmd) -> bool:
    return "--json" in _options(cmd)


def sections(text: str) -> dict[str, str]:
    """Level-2 sections of a page: heading -> body."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


# ------------------------------------------------------------------------- pages, epilogs, README


def test_commands_found():
    assert {("doctor",), ("syscalls",), ("sample",), ("batch-tail",), ("diagnose",), ("residency",), ("replay",),
            ("lab", "make-table"), ("lab", "run"), ("lab", "scenario"), ("demo",)} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=_ids)
def test_page_has_the_man_page_sections(path):
    page = page_of(path)
    assert page.exists(), f"no docs page for `engramprof {' '.join(path)}` ({page.relative_to(REPO)})"
    text = page.read_text()
    found = [h for h in re.findall(r"^## (.+)$", text, flags=re.M) if h.strip() in SECTIONS]
    assert found == SECTIONS, f"{page.name}: sections {found}, expected {SECTIONS} in that order"
    sec = sections(text)
    name = "engramprof " + " ".join(path)
    assert name in sec["NAME"], f"{page.name}: NAME does not name `{name}`"
    assert name in sec["SYNOPSIS"], f"{page.name}: SYNOPSIS does not show `{name}`"
    missing = [o for o in _options(COMMANDS[path]) if o not in sec["OPTIONS"]]
    assert not missing, f"{page.name}: options of `{name} --help` not under OPTIONS: {missing}"
    if _has_json(COMMANDS[path]):
        assert json_key_rows(page), f"{page.name}: `{name}` has --json but FIELDS lists no JSON keys"


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=_ids)
def test_example_file_exists_and_is_linked(path):
    page = page_of(path)
    ex = EXAMPLES / (page.stem + ".txt")
    assert ex.exists() and ex.stat().st_size > 200, f"no real output in {ex.relative_to(REPO)}"
    assert f"../examples/{ex.name}" in page.read_text(), f"{page.name} does not link {ex.name}"


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=_ids)
def test_epilog_has_examples_that_fit_80_columns(path):
    ep = COMMANDS[path].epilog or ""
    name = "engramprof " + " ".join(path)
    assert "Examples" in ep and name in ep, f"`{name} --help` has no examples epilog"
    long = [line for line in ep.splitlines() if len(line) > EPILOG_WIDTH]
    assert not long, f"`{name}` epilog lines wrap at 80 columns: {long}"
    assert "docs/commands/" + page_of(path).name in ep, f"`{name}` epilog does not name its page"


def test_help_renders_each_example_on_its_own_line():
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([PY, "-m", "engramprof", "batch-tail", "--help"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=60).stdout
    lines = [l.strip() for l in out.splitlines()]
    ex = [l for l in lines if l.startswith("engramprof batch-tail ")]
    assert len(ex) >= 3, out
    assert max(len(l) for l in out.splitlines()) <= 80


def test_readme_is_short_and_links_every_page():
    text = README.read_text()
    n = len(text.splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES})"
    for page in sorted(PAGES.glob("*.md")):
        assert f"(docs/commands/{page.name})" in text, f"README.md does not link docs/commands/{page.name}"
    for doc in ("docs/model.md", "docs/kernel.md", "benchmarks/RESULTS.md"):
        assert f"({doc})" in text
    for cmd in ("doctor", "syscalls", "sample", "batch-tail", "diagnose", "residency", "replay", "lab", "lab scenario",
                "compare", "demo"):
        assert f"`engramprof {cmd}" in text, f"README's command table lacks `engramprof {cmd}`"
    assert "make demo" in text and "make test" in text


def _anchors(md: Path) -> set[str]:
    out = set()
    for h in re.findall(r"^#{1,6} (.+)$", md.read_text(), flags=re.M):
        a = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(a)
    return out


DOC_FILES = [README, REPO / "benchmarks" / "RESULTS.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("md", DOC_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(md):
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (md.parent / file).resolve() if file else md
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(target)
    assert not bad, f"{md.relative_to(REPO)}: broken links {bad}"


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("md", DOC_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_tables_are_whole(md):
    """Every run of table rows starts with its header and `| --- |` line: a paragraph dropped
    into the middle of a table (sample.md's OPTIONS once) splits it and leaves headless rows."""
    lines = _outside_code(md.read_text()).splitlines()
    bad = []
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            if i + 1 >= len(lines) or not re.match(r"^\|\s*:?-", lines[i + 1]):
                bad.append(line[:60])
    assert not bad, f"{md.relative_to(REPO)}: table rows without a header: {bad}"


@pytest.mark.parametrize("md", DOC_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_section_twice(md):
    """No heading appears twice in one file (kernel.md once held a section twice, word for word)."""
    heads = re.findall(r"^#{1,6} (.+)$", _outside_code(md.read_text()), flags=re.M)
    twice = sorted({h for h in heads if heads.count(h) > 1})
    assert not twice, f"{md.relative_to(REPO)}: headings repeated: {twice}"


REFERENCE_PAGES = [*sorted(PAGES.glob("*.md")), DOCS / "model.md", DOCS / "kernel.md"]
#: what belongs in benchmarks/RESULTS.md, not on a reference page: a dated run, a commit, "today"
DATED = [(re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date"),
         (re.compile(r"\bcommit [0-9a-f]{7,40}\b"), "a commit hash"),
         (re.compile(r"\btoday'?s? (code|run|main)\b", re.I), "today's code"),
         (re.compile(r"\bduckdb\b.*\b\d+(\.\d+)?x\b", re.I), "the DuckDB study")]


@pytest.mark.parametrize("md", REFERENCE_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_reference_pages_hold_no_dated_runs(md):
    """Command pages, model.md and kernel.md are reference: measured runs live in
    benchmarks/RESULTS.md and the pages link there (code blocks, e.g. example paths, are exempt)."""
    found = []
    for line in _outside_code(md.read_text()).splitlines():
        if "](" in line and "RESULTS.md#" in line and not re.sub(r"\[[^]]*\]\([^)]*\)", "", line).strip():
            continue  # a line that is only a link to a RESULTS.md anchor
        for rx, what in DATED:
            if rx.search(re.sub(r"\]\([^)]*\)", "]", line)):
                found.append(f"{what}: {line.strip()[:90]}")
    assert not found, f"{md.relative_to(REPO)} holds measured runs (move them to benchmarks/RESULTS.md): {found}"


@pytest.mark.parametrize("page", sorted(PAGES.glob("*.md")), ids=lambda p: p.name)
def test_overhead_and_limits_are_short(page):
    """OVERHEAD and LIMITS: a short statement, the figures behind a link."""
    sec = sections(page.read_text())
    for name, most in (("OVERHEAD", 12), ("LIMITS", 30)):
        body = [l for l in _outside_code(sec[name]).splitlines() if l.strip()]
        assert len(body) <= most, f"{page.name}: {name} has {len(body)} lines (at most {most}: move figures to RESULTS.md)"


def _playbook_steps(text: str) -> list[str]:
    return re.findall(r"^#{2,3} (\d+[a-z]?)\. ", text, flags=re.M)


def test_playbook_steps_are_numbered_in_order():
    """Steps 1, 2, 3a, 3b, 3c...: no letter or number skipped (decode-steps-slow once went 3b, 3d)."""
    for pb in sorted((REPO / "playbooks").glob("*.md")):
        text = pb.read_text()
        seen: dict[int, list[str]] = {}
        for s in _playbook_steps(text):
            seen.setdefault(int(re.match(r"\d+", s).group()), []).append(s[len(str(int(re.match(r"\d+", s).group()))):])
        nums = sorted(seen)
        assert nums == list(range(nums[0], nums[0] + len(nums))), f"{pb.name}: steps {nums}"
        for n, letters in seen.items():
            first = "b" if "" in letters else "a"  # "1." then "1b." (the bare step is the first)
            letters = [l for l in letters if l]
            want = [chr(ord(first) + i) for i in range(len(letters))]
            assert letters == want, f"{pb.name}: step {n} sub-steps {letters}, expected {want}"
        for line in text.splitlines():
            if ".md" in line:
                continue  # "[other.md](other.md) step 3a": another playbook's step
            for ref in re.findall(r"\bstep (\d+[a-z]?)\b", line):
                assert ref in _playbook_steps(text), f"{pb.name}: 'step {ref}' names no step"
    assert _playbook_steps("## 3a. x\n## 3b. y\n### 1b. z\n") == ["3a", "3b", "1b"]


# ------------------------------------------------------------------------- JSON keys: the parser


def json_key_rows(page: Path) -> list[tuple[tuple[str, ...], bool]]:
    """(path segments, always?) for every key in the page's "### JSON keys" tables."""
    fields = sections(page.read_text()).get("FIELDS", "")
    rows: list[tuple[tuple[str, ...], bool]] = []
    in_table = False
    for line in fields.splitlines():
        if re.match(r"^\|\s*key\s*\|", line):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table or re.match(r"^\|\s*-", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        always = len(cells) > 1 and cells[1] == "always"
        for key in re.findall(r"`([^`]+)`", cells[0]):
            rows.append((_split(key), always))
    return rows


def _split(key: str) -> tuple[str, ...]:
    segs: list[str] = []
    for part in key.split("."):
        while part.endswith("[]"):
            segs += [part[:-2]] if part[:-2] else []
            segs.append("[]")
            part = ""
        if part:
            segs.append(part)
    return tuple(segs)


def printed_paths(obj) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(every key path printed, the paths that are non-empty containers)."""
    paths: set[tuple[str, ...]] = set()
    containers: set[tuple[str, ...]] = {()}

    def walk(o, p):
        if isinstance(o, dict):
            if o and p:
                containers.add(p)
            for k, v in o.items():
                paths.add(p + (k,))
                walk(v, p + (k,))
        elif isinstance(o, list):
            dicts = [e for e in o if isinstance(e, dict)]
            if dicts:
                paths.add(p + ("[]",))
                containers.add(p)
                for e in dicts:
                    walk(e, p + ("[]",))

    walk(obj, ())
    return paths, containers


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    return len(pattern) == len(path) and all(a == b or (a.startswith("<") and a.endswith(">"))
                                             for a, b in zip(pattern, path))


def check_keys(page: Path, obj, what: str) -> None:
    rows = json_key_rows(page)
    documented = [p for p, _ in rows]
    paths, containers = printed_paths(obj)
    undocumented = []
    for p in sorted(paths):
        parent = p[:-1]
        lists_children = len(p) == 1 or any(len(d) == len(p) and _match(d[:-1], parent) for d in documented)
        if lists_children and not any(_match(d, p) for d in documented):
            undocumented.append(".".join(p).replace(".[]", "[]"))
    missing = []
    for d, always in rows:
        if not always:
            continue
        for q in containers:
            if len(q) == len(d) - 1 and _match(d[:-1], q):
                last = d[-1]
                wildcard = last.startswith("<")
                if not wildcard and q + (last,) not in paths:
                    missing.append(".".join(d).replace(".[]", "[]"))
    assert not undocumented, f"{what}: printed but not in {page.name}'s JSON keys: {undocumented}"
    assert not missing, f"{what}: documented as always present but not printed: {sorted(set(missing))}"


def test_key_parser():
    assert _split("files[].tensors[].name") == ("files", "[]", "tensors", "[]", "name")
    assert _split("arms.<arm>.batch_ms.p50") == ("arms", "<arm>", "batch_ms", "p50")
    page_rows = json_key_rows(PAGES / "replay.md")
    assert (("arms", "<arm>", "batch_ms", "p50"), True) in page_rows
    paths, cont = printed_paths({"a": {"b": 1}, "l": [{"x": 1}], "e": []})
    assert ("a", "b") in paths and ("l", "[]", "x") in paths and ("l",) in cont and ("e",) not in cont


# ------------------------------------------------------------------------- JSON keys: real runs


@pytest.fixture(scope="module")
def lab_inputs(tmp_path_factory):
    """A small lab table, a synthetic trace of its planned reads (3 batches 20 ms apart) and
    markers for those batches: inputs for batch-tail, residency and replay without root."""
    from engramprof.lab import workload

    d = tmp_path_factory.mktemp("docs")
    if fs_type(d) in ("tmpfs", "ramfs"):
        pytest.skip("tmp is on tmpfs: residency and replay need a filesystem with a droppable page cache")
    inputs = planned_trace(d, d / "table.safetensors", steps=3)
    workload.evict(inputs["table"])
    workload.warm(inputs["table"])
    return inputs


def _json(out: str):
    return json.loads(out)


def test_json_keys_batch_tail(lab_inputs):
    page = PAGES / "batch-tail.md"
    check_keys(page, _json(_run("batch-tail", lab_inputs["trace"], "--json")), "batch-tail (inferred)")
    check_keys(page, _json(_run("batch-tail", lab_inputs["trace"], "--markers", lab_inputs["markers"], "--json")),
               "batch-tail --markers")


def test_json_keys_residency(lab_inputs):
    page = PAGES / "residency.md"
    check_keys(page, _json(_run("residency", lab_inputs["table"], "--tensors", "--ranges", "2", "--json")),
               "residency --tensors --ranges")
    check_keys(page, _json(_run("residency", "--rows", lab_inputs["trace"], "--json")), "residency --rows")
    check_keys(page, _json(_run("residency", lab_inputs["table"], "--method", "mincore", "--json")),
               "residency --method mincore")


def test_json_keys_replay(lab_inputs):
    out = _run("replay", lab_inputs["trace"], "--markers", lab_inputs["markers"], "--rounds", "2", "--threads", "4",
               "--json")
    check_keys(PAGES / "replay.md", _json(out), "replay")


def test_json_keys_lab_run(lab_inputs):
    out = _run("lab", "run", "--table", lab_inputs["table"], "--steps", "5", "--threads", "4", "--json")
    check_keys(PAGES / "lab.md", _json(out), "lab run")


def test_json_keys_sample():
    check_keys(PAGES / "sample.md", _json(_run("sample", "--duration", "1", "--json")), "sample")
    target = subprocess.Popen(["sleep", "30"])
    try:
        out = _run("sample", "--pid", target.pid, "--duration", "1", "--json")
    finally:
        target.kill()
        target.wait()
    check_keys(PAGES / "sample.md", _json(out), "sample --pid")


def test_json_keys_doctor():
    out = _run("doctor", "--json", check=False)  # exit 1 where this host cannot trace: the JSON is still printed
    check_keys(PAGES / "doctor.md", _json(out), "doctor")


@pytest.mark.skipif(os.geteuid() != 0, reason="lab scenario needs root")
def test_json_keys_lab_scenario(tmp_path):
    out = _run("lab", "scenario", "python-scheduling", "--steps", "5", "--rows", "4096", "--threads", "4",
               "--markers", tmp_path / "m.jsonl", "--json")
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    check_keys(PAGES / "lab-scenario.md", {l["event"]: l for l in lines}, "lab scenario --json")


@pytest.fixture(scope="module")
def lab_reader(lab_inputs):
    """A lab reader running for the bpf tests, with its markers; killed at the end."""
    m = lab_inputs["dir"] / "reader-markers.jsonl"
    p = subprocess.Popen([PY, "-m", "engramprof", "lab", "run", "--table", str(lab_inputs["table"]),
                          "--warm", "--duration", "900", "--gap-ms", "2", "--threads", "8", "--markers", str(m)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    for line in p.stderr:
        if line.startswith("lab: ready") or time.monotonic() > deadline:
            break
    yield {"pid": p.pid, "markers": m}
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@pytest.mark.bpf
def test_json_keys_syscalls_and_batch_tail_on_a_real_trace(lab_reader, tmp_path):
    trace = tmp_path / "trace"
    out = _run("syscalls", "--pid", lab_reader["pid"], "--duration", "2", "--output", trace, "--json")
    check_keys(PAGES / "syscalls.md", _json(out), "syscalls")
    check_keys(PAGES / "batch-tail.md", _json(_run("batch-tail", trace, "--json")), "batch-tail on a real trace")
    check_keys(PAGES / "batch-tail.md", _json(_run("batch-tail", trace, "--markers", lab_reader["markers"], "--json")),
               "batch-tail --markers on a real trace")


@pytest.mark.bpf
def test_json_keys_diagnose(lab_reader):
    out = _run("diagnose", "--pid", lab_reader["pid"], "--duration", "3", "--markers", lab_reader["markers"], "--json")
    check_keys(PAGES / "diagnose.md", _json(out), "diagnose")


def test_json_keys_compare(tmp_path):
    """compare --ranks (step ids, with --plot when matplotlib is there), --ranks by clock, and
    --before/--after matched (exit 0) and unmatched (exit 3), on hand-made bundles."""
    from tests.test_compare import make_rank

    page = PAGES / "compare.md"
    rng = np.random.default_rng(0)
    r = [make_rank(tmp_path / f"rank={i}", (np.arange(20) % 2 == 0) if i == 1 else np.zeros(20, bool), rng, 20)
         for i in range(3)]
    args = ["compare", "--ranks", *r, "--json", "--top", "3"]
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", tmp_path / "r.png"]
    except ImportError:
        pass
    check_keys(page, _json(_run(*args)), "compare --ranks")
    c = [make_rank(tmp_path / f"c{i}", np.zeros(20, bool), rng, 20, steps_in_markers=False) for i in range(2)]
    check_keys(page, _json(_run("compare", "--ranks", *c, "--json")), "compare --ranks by clock")
    cold = make_rank(tmp_path / "cold", np.ones(20, bool), rng, 20)
    check_keys(page, _json(_run("compare", "--before", r[0], "--after", r[2], "--resamples", "100", "--json")),
               "compare --before --after (matched)")
    p = subprocess.run([PY, "-m", "engramprof", "compare", "--before", r[0], "--after", r[2], "--after", cold,
                        "--resamples", "100", "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 3, p.stderr
    check_keys(page, _json(p.stdout), "compare --before --after (unmatched)")


def test_every_json_command_is_checked():
    """A new command with --json needs its keys documented and a run here."""
    checked = {("batch-tail",), ("residency",), ("replay",), ("lab", "run"), ("sample",), ("doctor",),
               ("lab", "scenario"), ("syscalls",), ("diagnose",), ("compare",)}
    assert {p for p, c in COMMANDS.items() if _has_json(c)} == checked


# ------------------------------------------------------------------------- examples: the shape of current output
#
# docs/examples/<page>.txt is made by scripts/make_examples.py: `$ command` lines, each followed by
# what it printed.  Its shape (rich tables' titles and column titles, the labels of key/value
# panels, the keys of JSON output) must still be the shape the current code prints:
#   * cheap commands (no BPF) run again here, on the lab inputs above, and every recorded table,
#     column and JSON key must be in their output (a column the command now hides as all-zero or
#     too wide is named on its "not shown" line, and counts as there);
#   * the live ones (syscalls, diagnose, export, demo, compare of a recorded job) are checked
#     against their renderers' source: each recorded title, column and label is a literal of
#     engramprof/.  A renamed column or heading fails either way.

EXAMPLE_HEADER = "# Made by scripts/make_examples.py"
#: pages whose commands this test runs again (the rest are checked against the source)
RERUN_PAGES = {"lab", "doctor", "batch-tail", "residency", "replay", "sample", "lab-scenario"}
_BOX = "┏┃┡│└━╇╋┗┓┛┩"


def example_blocks(text: str) -> list[tuple[str, str]]:
    """(command line, its output) for each `$ ` line of an example file."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            blocks.append((line[2:], []))
        elif blocks:
            blocks[-1][1].append(line)
    return [(c, "\n".join(o)) for c, o in blocks]


def _norm_title(t: str) -> str:
    t = re.split(r"\s\(|,|:|\d", t.strip(), maxsplit=1)[0]
    return " ".join(t.lower().split())


def _norm_col(c: str) -> str:
    return " ".join(re.sub(r"\d[\d,.]*", "#", c).split())


def output_shape(out: str) -> dict[str, set]:
    """tables: {title}; columns: {(title, column)}; hidden: {column}; labels: {label}; keys: {json key}."""
    shape = {"tables": set(), "columns": set(), "hidden": set(), "labels": set(), "keys": set()}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("┏"):
            # a rich title is padded to its table's width; any other line above a table is text
            prev = lines[i - 1].strip() if i and len(lines[i - 1]) == len(line.rstrip()) else ""
            title = _norm_title(prev)
            shape["tables"].add(title)
            cells: dict[int, list[str]] = {}
            for h in lines[i + 1:]:
                if not h.startswith("┃"):
                    break
                parts = h.split("┃")[1:]
                cut = not h.rstrip().endswith("┃")  # cropped at 80 columns: its last cell is partial
                if not cut:
                    parts = parts[:-1]
                for k, p in enumerate(parts):
                    cells.setdefault(k, []).append(p.strip() + ("…" if cut and k == len(parts) - 1 and p.strip() else ""))
            for k in sorted(cells):
                col = _norm_col(" ".join(p for p in cells[k] if p).replace("… ", "…"))
                if col:
                    shape["columns"].add((title, col))
        m = re.match(r"^ ([A-Za-z][\w /-]*?\S)\s{2,}\S", line)  # a key/value panel row: " calls     102,419"
        if m:
            shape["labels"].add(m.group(1))
    flat = " ".join(l.strip() for l in lines)  # a "not shown" line wraps like any other
    for m in re.finditer(r"not shown(?: at \d+ columns)?: ([^;(]+)", flat):
        shape["hidden"] |= {_norm_col(c) for c in m.group(1).split(",")}
    shape["keys"] = set(re.findall(r'"([A-Za-z_][\w.-]*)"\s*:', out))
    return shape


def _col_found(col: str, cols: set[str], hidden: set[str]) -> bool:
    for c in cols | hidden:
        if c == col:
            return True
        a, b = col.rstrip("…"), c.rstrip("…")
        if (col.endswith("…") and c.startswith(a)) or (c.endswith("…") and col.startswith(b) and b):
            return True
    return False


def shape_missing(recorded: str, current: str) -> list[str]:
    """What the recorded output shows that the current output does not."""
    r, c = output_shape(recorded), output_shape(current)
    missing = [f"table '{t}'" for t in sorted(r["tables"] - c["tables"])]
    for title, col in sorted(r["columns"]):
        cols = {cc for t, cc in c["columns"] if t == title}
        if title in c["tables"] and not _col_found(col, cols, c["hidden"]):
            missing.append(f"column '{col}' of table '{title}'")
    missing += [f"label '{l}'" for l in sorted(r["labels"] - c["labels"])]
    missing += [f"JSON key '{k}'" for k in sorted(r["keys"] - c["keys"])]
    return missing


def test_output_shape_catches_a_renamed_column_or_heading():
    """The check itself: a changed column title, table title, panel label or JSON key is missed."""
    rec = ("Slowest batches (of 787)\n┏━━━┳━━━━━━┳━━━━━━━━━━━┓\n┃   ┃ wall ┃ slow…     ┃\n┃ # ┃   ms ┃           ┃\n"
           "┡━━━╇━━━━━━╇━━━━━━━━━━━┩\n│ 1 │ 2.0  │ x         │\n└───┴──────┴───────────┘\n lost records     0\n"
           '{"verdict": "healthy"}')
    assert output_shape(rec)["columns"] == {("slowest batches", "#"), ("slowest batches", "wall ms"),
                                            ("slowest batches", "slow…")}
    assert shape_missing(rec, rec.replace("787", "612").replace("2.0", "9.1")) == []
    assert shape_missing(rec, rec.replace("wall", "time")) == ["column 'wall ms' of table 'slowest batches'"]
    assert shape_missing(rec, rec.replace("Slowest", "Worst")) == ["table 'slowest batches'"]
    assert shape_missing(rec, rec.replace("lost records", "lost events")) == ["label 'lost records'"]
    assert shape_missing(rec, rec.replace('"verdict"', '"answer"')) == ["JSON key 'verdict'"]
    hidden = rec.replace("wall", "    ").replace("ms", "  ") + "\nnot shown: wall ms (0 in every row)"
    assert shape_missing(rec, hidden) == []


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.txt"))


@pytest.mark.parametrize("ex", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_is_generated(ex):
    """Made by the script (not by hand), with at least one command and its output, and tables
    that fit 80 columns (the old files claimed COLUMNS values their tables did not have)."""
    text = ex.read_text()
    assert text.startswith(EXAMPLE_HEADER), f"{ex.name}: not made by scripts/make_examples.py (re-run it)"
    blocks = example_blocks(text)
    assert blocks and all(c.startswith(("engramprof ", "curl ")) for c, _ in blocks), f"{ex.name}: {blocks[:1]}"
    wide = [l for l in text.splitlines() if len(l.rstrip()) > 80 and any(c in l for c in _BOX)]
    assert not wide, f"{ex.name}: lines wider than 80 columns: {wide[:3]}"
    assert "COLUMNS" not in "".join(o for _, o in blocks), f"{ex.name}: output claims about COLUMNS"
    broken = [l for l in text.splitlines() if "internal error" in l or l.startswith(("Traceback", "# exit 70"))]
    assert not broken, f"{ex.name}: a command crashed when the example was made: {broken[:2]}"


def _source_text() -> str:
    return "\n".join(p.read_text() for p in sorted((REPO / "engramprof").rglob("*.py")))


@pytest.mark.parametrize("ex", [e for e in EXAMPLE_FILES if e.stem not in RERUN_PAGES], ids=lambda p: p.name)
def test_live_example_titles_are_in_the_renderers(ex):
    src = _source_text()
    src_lower = src.lower()
    missing = []
    for cmd, out in example_blocks(ex.read_text()):
        if cmd.endswith("&"):
            continue
        s = output_shape(out)
        for t in s["tables"]:
            if t and t not in src_lower:
                missing.append(f"table '{t}'")
        for _, col in s["columns"]:
            words = col.rstrip("…")
            if "#" not in words and words and words.lower() not in src_lower:
                missing.append(f"column '{col}'")
        missing += [f"label '{l}'" for l in s["labels"] if l not in src]
        for m in set(re.findall(r"^(engramprof_[a-z_]+?)(?:_total|_count|_sum|_bucket)?[{ ]", out, flags=re.M)):
            if "_process_" in m:  # prometheus_client's process collector, under the exporter's prefix
                continue
            if m not in src and m.replace("engramprof_", "", 1) not in src:
                missing.append(f"metric '{m}'")
    assert not missing, (f"{ex.name} shows titles the current code does not print: {sorted(set(missing))}; "
                         f"re-run scripts/make_examples.py")


def _rerun_args(cmd: str, pid: int) -> list[str] | None:
    import shlex

    args = shlex.split(cmd.split(" | ")[0])
    if args[0] != "engramprof" or args[-1] == "&":
        return None
    args = args[1:]
    for i, a in enumerate(args):
        if a == "--pid":
            args[i + 1] = str(pid)
        elif a == "--duration":
            args[i + 1] = str(min(float(args[i + 1]), 2))
    if args[:2] == ["lab", "make-table"]:
        args[2] = "new.safetensors"
        args += ["--force"]
    if args[:2] == ["lab", "scenario"] and os.geteuid() != 0:
        return None
    return args


@pytest.fixture(scope="module")
def example_reruns(lab_inputs):
    """The cheap example commands run again in the lab inputs' directory (the file names the
    script uses: table.safetensors, trace, markers.jsonl), a few at a time."""
    from concurrent.futures import ThreadPoolExecutor

    target = subprocess.Popen(["sleep", "60"])
    jobs = {}
    for ex in EXAMPLE_FILES:
        if ex.stem in RERUN_PAGES:
            for cmd, _ in example_blocks(ex.read_text()):
                args = _rerun_args(cmd, target.pid)
                if args:
                    jobs[(ex.stem, cmd)] = args
    env = dict(os.environ, COLUMNS="80")

    def run(args):
        p = subprocess.run([PY, "-m", "engramprof", *args], cwd=lab_inputs["dir"], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
        return p.stdout

    try:
        with ThreadPoolExecutor(3) as pool:
            outs = dict(zip(jobs, pool.map(run, jobs.values())))
    finally:
        target.kill()
        target.wait()
    return outs


@pytest.mark.parametrize("page", sorted(RERUN_PAGES))
def test_example_has_the_current_output_shape(page, example_reruns):
    ex = EXAMPLES / f"{page}.txt"
    checked, bad = 0, []
    for cmd, out in example_blocks(ex.read_text()):
        if (page, cmd) not in example_reruns:
            continue
        checked += 1
        missing = shape_missing(out, example_reruns[(page, cmd)])
        if missing:
            bad.append(f"`{cmd}`: {missing}")
    if page == "lab-scenario" and os.geteuid() != 0:
        pytest.skip("lab scenario needs root")
    assert checked, f"{ex.name}: no command run again"
    assert not bad, f"{ex.name} no longer has the shape of the current output (re-run scripts/make_examples.py): {bad}"


def test_doctor_example_and_readme_count_the_checks_doctor_runs():
    """doctor.txt shows every check doctor runs now; the README's and demo.txt's "N checks pass"
    is the pass count of that same doctor run (the script makes all three in one go)."""
    n = len(_json(_run("doctor", "--json", check=False))["checks"])
    out = example_blocks((EXAMPLES / "doctor.txt").read_text())[0][1]
    rows = re.findall(r"^│ (pass|warn|fail|info) ", out, flags=re.M)
    assert len(rows) == n, f"doctor.txt shows {len(rows)} checks, doctor runs {n}"
    for doc in (README, EXAMPLES / "demo.txt", PAGES / "doctor.md", PAGES / "demo.md"):
        for m in re.findall(r"\b(\d+) checks( pass)?\b", doc.read_text()):
            want = rows.count("pass") if m[1] else n
            assert int(m[0]) == want, f"{doc.name} says {m[0]} checks{m[1]}, doctor.txt has {want}"
