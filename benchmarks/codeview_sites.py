#!/usr/bin/env python3
"""The code view's read sites of recorded traces, per process: each site's share of the
process's joined reads, so two trees' joins can be set side by side on the same recordings.

    PYTHONPATH=TREE .venv/bin/python benchmarks/codeview_sites.py TRACE...

A TRACE is a bundle recorded with stacks (``syscalls`` / ``diagnose --output``, the default
--stack-hz).  For each of its three processes with the most read events that have stacks:
one line with the join counts, then its top sites (share of reads, slow reads, submitter).
Run it once with ``PYTHONPATH`` at an older tree (a ``git worktree``) and once at this one.
"""
from __future__ import annotations

import sys


def main(paths: list[str]) -> int:
    from engramprof.analysis import codeview as cv
    from engramprof.trace.reader import load_bundle

    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in paths:
        t = load_bundle(path)
        calls, stacks, offcpu = t.calls, t.samples("stacks"), t.samples("offcpu")
        if stacks is None or not len(stacks):
            print(f"{path}: no stacks")
            continue
        sampled = set(stacks["pid"])
        for pid in [p for p in calls["pid"].value_counts().index[:3] if p in sampled]:
            v = cv.code_view(stacks, calls, None, 4.0, pid=int(pid), offcpu=offcpu)
            total = max(v["join"]["reads"], 1)
            print(path, int(pid), {k: v["join"][k] for k in ("inside", "near", "pool", "none", "exact")})
            for s in v.get("read_sites", [])[:4]:
                print(f"    {s['site']:<52} {s['reads'] / total:6.3f} slow={s['slow_reads']} "
                      f"sub={s['submitted_from']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
