#!/usr/bin/env python3
"""Make docs/examples/<page>.txt from the current build: each command run for real, at 80 columns.

Run it as root from the repository (BPF commands need root; `make setup` first):

    sudo .venv/bin/python scripts/make_examples.py              # every page, 3-4 minutes on 2 cores
    sudo .venv/bin/python scripts/make_examples.py batch-tail replay   # only these pages
    .venv/bin/python scripts/make_examples.py --list            # the pages it makes

Re-run it after any change to a command's output (a column, a heading, an option): it rewrites
the files it makes and nothing else, so running it twice is harmless (only the numbers move).
tests/test_docs.py checks that each file still has the shape of the command's current output.

Each file holds `$ command` lines, each followed by what the command printed (stdout and
stderr, as a terminal shows them; `# exit N` when N is not 0). Commentary belongs in the
EXAMPLES section of docs/commands/<page>.md, not here.  The inputs are the built-in lab: a
33 MiB lab table (`table.safetensors`), a lab reader (`lab run --warm --gap-ms 2 --markers
markers.jsonl`) and a trace of it recorded by `syscalls --output trace`; everything runs in one
working directory, /var/tmp/engramprof-examples (made afresh, removed at the end; so two runs at
once collide), so file names in the commands are short.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "docs" / "examples"
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
COLUMNS = 80
WORK = Path("/var/tmp/engramprof-examples")  # not tmpfs: residency and replay need a droppable page cache
HEADER = ("# Made by scripts/make_examples.py at COLUMNS={cols}: re-run it, do not edit.\n"
          "# What the output means: docs/commands/{page}.md, EXAMPLES.\n")
ROOT_PAGES = {"doctor", "syscalls", "diagnose", "export", "lab-scenario", "demo", "compare"}


class Session:
    """One working directory, the lab inputs in it, and the lines of each page."""

    def __init__(self, work: Path):
        self.work = work
        self.env = dict(os.environ, COLUMNS=str(COLUMNS), LINES="200", TERM="dumb", NO_COLOR="1",
                        PYTHONUNBUFFERED="1")
        self.env.pop("FORCE_COLOR", None)
        self.pages: dict[str, list[str]] = {}
        self.bg: list[subprocess.Popen] = []

    def argv(self, args: list[str]) -> list[str]:
        return [PY, "-m", "engramprof", *args[1:]] if args[0] == "engramprof" else args

    def run(self, page: str, cmd: str, show: str | None = None, timeout: float = 300, pipe: str | None = None) -> str:
        """Run `cmd` (a shell-like line starting with `engramprof`) in the working directory and
        add `$ cmd` and its output to page.  pipe: a shell filter applied to stdout, shown too."""
        args = shlex.split(cmd)
        t0 = time.monotonic()
        p = subprocess.run(self.argv(args), cwd=self.work, env=self.env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        out = p.stdout
        if pipe:
            out = subprocess.run(pipe, shell=True, input=out, capture_output=True, text=True).stdout
        lines = self.pages.setdefault(page, [])
        lines.append(f"$ {show or cmd}" + (f" | {pipe}" if pipe else ""))
        lines += out.rstrip("\n").splitlines()  # trailing blanks kept: a rich title is padded to its table
        if p.returncode:
            lines.append(f"# exit {p.returncode}")
        lines.append("")
        print(f"  {page}: {cmd} ({time.monotonic() - t0:.1f} s, exit {p.returncode})", file=sys.stderr)
        return p.stdout

    def start(self, page: str | None, cmd: str, until: str, timeout: float = 120) -> tuple[subprocess.Popen, list[str]]:
        """Start `cmd` in the background; wait for a stderr line starting with `until`."""
        p = subprocess.Popen(self.argv(shlex.split(cmd)), cwd=self.work, env=self.env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.bg.append(p)
        seen, deadline = [], time.monotonic() + timeout
        for line in p.stderr:
            seen.append(line.rstrip("\n"))
            if line.startswith(until) or time.monotonic() > deadline:
                break
        else:
            raise SystemExit(f"make_examples: `{cmd}` ended before printing {until!r}: {seen[-5:]}")
        if page:
            self.pages.setdefault(page, []).extend([f"$ {cmd} &", *[l.rstrip() for l in seen], ""])
        return p, seen

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p.stderr:
            p.stderr.close()

    def close(self) -> None:
        for p in self.bg:
            self.stop(p)

    def write(self, page: str) -> Path:
        path = EXAMPLES / f"{page}.txt"
        text = HEADER.format(cols=COLUMNS, page=page) + "\n" + "\n".join(self.pages[page]).rstrip("\n") + "\n"
        path.write_text(text)
        return path


def _pid(lines: list[str]) -> int:
    for line in lines:
        m = re.match(r"lab: pid (\d+)", line)
        if m:
            return int(m.group(1))
    raise SystemExit(f"make_examples: no 'lab: pid N' in {lines}")


LAB_READER = "engramprof lab run --table table.safetensors --warm --duration 600 --gap-ms 2 --markers markers.jsonl"


def make(s: Session, want: set[str]) -> None:
    """The pages, in an order that records each input before the pages that read it."""
    s.run("lab", "engramprof lab make-table table.safetensors --rows 65536")
    need_trace = want & {"syscalls", "batch-tail", "residency", "replay", "diagnose", "sample", "export"}
    if "lab" in want:
        s.run("lab", "engramprof lab run --table table.safetensors --warm --steps 200 --gap-ms 1 --threads 8")
        s.run("lab", "engramprof lab run --table table.safetensors --reader nowait --steps 200 --gap-ms 1")
        s.run("lab", "engramprof lab run --table table.safetensors --reader serial --tokens 3750 --steps 3 --json")
    if "doctor" in want:
        s.run("doctor", "engramprof doctor")
        s.run("doctor", "engramprof doctor --path . --json", pipe="head -c 1200")
    if need_trace:
        reader, seen = s.start(None, LAB_READER, "lab: ready")
        pid = _pid(seen)
        for page in need_trace & {"syscalls", "diagnose", "sample", "export"}:
            s.pages.setdefault(page, []).extend([f"$ {LAB_READER} &", *seen, ""])
        if need_trace & {"syscalls", "batch-tail", "residency", "replay"}:
            s.run("syscalls", f"engramprof syscalls --pid {pid} --duration 3 --output trace")
        if "sample" in want:
            s.run("sample", f"engramprof sample --pid {pid} --duration 2")
            s.run("sample", "engramprof sample --duration 1 --json", pipe="head -c 1500")
        if "diagnose" in want:
            s.run("diagnose", f"engramprof diagnose --pid {pid} --duration 4 --markers markers.jsonl")
        if "export" in want:
            export_page(s, pid)
        s.stop(reader)
    if "batch-tail" in want:
        s.run("batch-tail", "engramprof batch-tail trace --markers markers.jsonl")
        s.run("batch-tail", "engramprof batch-tail trace")
        s.run("batch-tail", "engramprof batch-tail trace --json", pipe="head -c 1500")
    if "residency" in want:
        s.run("residency", "engramprof residency table.safetensors --tensors --ranges 2")
        s.run("residency", "engramprof residency --rows trace")
    if "replay" in want:
        s.run("replay", "engramprof replay trace --markers markers.jsonl --batches 20 --threads 8")
        s.run("replay", "engramprof replay trace --batches 8 --rounds 6 --threads 8 "
              "--strategies pool,nowait,io_uring,direct")
        s.run("replay", "engramprof replay trace --batches 20 --rounds 6 --threads 8 --cold-frac 0.25 --allow-evict")
    if "lab-scenario" in want:
        s.run("lab-scenario", "engramprof lab scenario python-scheduling --duration 3 --rows 16384 --threads 8 "
                              "--markers scenario.jsonl")
        s.run("lab-scenario", "engramprof lab scenario residency --duration 3 --rows 16384 --threads 8 "
                              "--markers scenario.jsonl")
    if "compare" in want:
        compare_page(s)
    if "demo" in want:
        s.run("demo", "engramprof demo", timeout=600)


def export_page(s: Session, pid: int) -> None:
    port = 19000 + os.getpid() % 1000
    cmd = f"engramprof export --pid {pid} --window 2 --label rank=0 --listen 127.0.0.1:{port}"
    exporter, seen = s.start("export", cmd, "Exporting", timeout=180)
    time.sleep(5)  # two windows analysed
    url = f"http://127.0.0.1:{port}/metrics"
    body = urllib.request.urlopen(url, timeout=30).read().decode()
    shown = [l.rstrip() for l in body.splitlines() if l and not l.startswith("#") and "_bucket{" not in l]
    s.pages["export"] += [f"$ curl -s {url} | grep -v -e '^#' -e '_bucket{{'", *shown, ""]
    s.stop(exporter)


def compare_page(s: Session) -> None:
    """Two ranks of one job (lab run --workers 2), one trace of both
    processes, split by pid; aligned by the markers' step ids."""
    cmd = ("engramprof lab run --table table.safetensors --workers 2 --duration 120 --gap-ms 2 --threads 8 "
           "--markers ranks.jsonl")
    reader, seen = s.start("compare", cmd, "lab: ready")
    s.run("compare", f"engramprof syscalls --pid {_pid(seen)} --children --duration 3 --output ranks")
    s.stop(reader)
    s.run("compare", "engramprof compare --ranks ranks --markers ranks.jsonl --top 5")
    s.run("compare", "engramprof compare --ranks ranks --markers ranks.jsonl --json", pipe="head -c 1500")


README = REPO / "README.md"
DEMO_BEGIN = "<!-- demo output: made by scripts/make_examples.py -->"
DEMO_END = "<!-- end of demo output -->"


def readme_demo(lines: list[str]) -> None:
    """The README's worked example is the demo's output of this run (between its two markers)."""
    text = README.read_text()
    i, j = text.find(DEMO_BEGIN), text.find(DEMO_END)
    if i < 0 or j < i:
        print(f"make_examples: README.md has no {DEMO_BEGIN!r} ... {DEMO_END!r}: left alone", file=sys.stderr)
        return
    out = [l for l in lines if not l.startswith("$ ") and not l.startswith("# exit")]
    block = "\n".join(["```", *out, "```"]).replace("\n\n```", "\n```")
    README.write_text(text[:i + len(DEMO_BEGIN)] + "\n" + block + "\n" + text[j:])
    print("wrote README.md's demo output", file=sys.stderr)


PAGES = ["lab", "doctor", "syscalls", "sample", "diagnose", "export", "batch-tail", "residency", "replay",
         "lab-scenario", "compare", "demo"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="*", help=f"pages to make (default: all): {' '.join(PAGES)}")
    ap.add_argument("--list", action="store_true", help="list the pages and exit")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    a = ap.parse_args()
    if a.list:
        print("\n".join(PAGES))
        return 0
    want = set(a.pages or PAGES)
    if want - set(PAGES):
        ap.error(f"unknown pages {sorted(want - set(PAGES))}; known: {PAGES}")
    if os.geteuid() != 0 and want & ROOT_PAGES:
        ap.error(f"pages {sorted(want & ROOT_PAGES)} need root (BPF, cgroups, evictions): run with sudo")
    work = WORK  # one fixed path, so that a re-run changes only the numbers in the files
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    s = Session(work)
    try:
        make(s, want)
    finally:
        s.close()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    for page in PAGES:
        if page in want:
            print(f"wrote {s.write(page).relative_to(REPO)}", file=sys.stderr)
    if "demo" in want:
        readme_demo(s.pages["demo"])
    print(f"make_examples: {len(want)} pages in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
