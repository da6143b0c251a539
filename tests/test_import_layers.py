"""The package's layers import in one direction (docs/layout.md draws them).

Walks every module of ``engramprof`` with :mod:`ast` (nothing is imported) and fails on:

* an import that goes up: a module may import its own layer and the layers below it;
* a cycle between modules (imports under ``if TYPE_CHECKING:`` are annotations only and do
  not count);
* an import of one of the package's own modules inside a function, outside ``commands/``
  (commands import the library lazily so that ``--help`` stays fast; the library does not);
* a module that no layer claims (a new top-level module or package must be placed).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "engramprof"

#: lowest first; a top-level name of the package (module or subpackage) -> its layer
LAYERS: list[tuple[str, ...]] = [
    ("__init__", "errors", "extras", "markers", "jsonable", "units", "validate"),  # base: stdlib + numpy only
    ("tables",),  # table layouts: file + offset -> tensor + row
    ("host",),  # this machine: residency, cachestat, files, tracepoints, doctor's checks
    ("trace",),  # the one owner of the bundle format
    ("sampling",),  # PSI / vmstat / process samplers
    ("target",),  # what is traced: processes, cgroups, files, mounts
    ("bpf",),  # loading probes, decoding their structs
    ("record",),  # the recorder and its sources
    ("analysis",),  # batches, attribution, verdicts, diagnose's evidence chain
    ("compare",),  # ranks and before/after over bundles
    ("lab",),  # the built-in workload, impairments, replay, the demo
    ("export",),  # always-on Prometheus metrics
    ("report",),  # every rendering
    ("commands", "cli", "__main__"),  # the CLI
]
LAZY_OK = ("commands",)  # top-level names whose functions may import the package lazily


def _rank() -> dict[str, int]:
    return {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = ("engramprof",) + p.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _in_type_checking(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _in_function(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _imports(mod: str, path: Path, mods: dict[str, Path]):
    """(target module, line, inside a function) for each import of the package's own modules."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                m = ".".join(base + ([node.module] if node.module else []))
            else:
                m = node.module or ""
            names = [m] + [f"{m}.{a.name}" for a in node.names]
        else:
            continue
        if _in_type_checking(node, parents):
            continue
        if isinstance(node, ast.ImportFrom):
            # `from engramprof.x import name`: the submodule x.name where there is one, else x
            subs = [n for n in names[1:] if n in mods]
            names = subs + ([names[0]] if len(subs) < len(names) - 1 else [])
        for target in dict.fromkeys(n for n in names if n in mods and n != mod):
            yield target, node.lineno, _in_function(node, parents)


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return mods, {m: list(_imports(m, p, mods)) for m, p in mods.items()}


def test_every_module_has_a_layer(graph):
    mods, _ = graph
    rank = _rank()
    unplaced = sorted({_top(m) for m in mods} - set(rank))
    assert not unplaced, f"place these in LAYERS (and docs/layout.md): {unplaced}"


def test_no_import_goes_up(graph):
    mods, edges = graph
    rank = _rank()
    up = [f"{m}:{line} imports {t} ({_top(t)} is above {_top(m)})"
          for m, es in edges.items() for t, line, _ in es
          if rank.get(_top(t), 0) > rank.get(_top(m), 0)]
    assert not up, "\n".join(up)


def test_no_import_cycle(graph):
    _, edges = graph
    adj = {m: sorted({t for t, _, _ in es}) for m, es in edges.items()}
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in adj.get(m, ()):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in adj:
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_library_imports_at_module_level(graph):
    _, edges = graph
    lazy = [f"{m}:{line} imports {t} inside a function"
            for m, es in edges.items() if _top(m) not in LAZY_OK
            for t, line, infunc in es if infunc]
    assert not lazy, f"{len(lazy)} imports:\n" + "\n".join(lazy)


def test_the_walk_sees_what_it_checks():
    """The walker finds a lazy import, an upward import and a cycle in a made-up package."""
    src = {"engramprof.host.a": "from engramprof.report import r\n",
           "engramprof.report.r": "def f():\n    from engramprof.host import a\n"}
    mods = {m: None for m in src}
    found = {}
    for m, text in src.items():
        p = Path("/nonexistent") / (m.replace(".", "/") + ".py")
        tree_path = p

        class _P:  # a path whose text is `text`
            name = tree_path.name

            def read_text(self, _t=text):
                return _t

            def __str__(self):
                return str(tree_path)

        found[m] = list(_imports(m, _P(), mods))
    assert found["engramprof.host.a"] == [("engramprof.report.r", 1, False)]
    assert found["engramprof.report.r"] == [("engramprof.host.a", 2, True)]


MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 120


def test_no_class_or_function_is_too_long(graph):
    """Small units whose names say what they hold: no class over 400 lines, no function over 120."""
    mods, _ = graph
    long = []
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = node.end_lineno - node.lineno + 1
            if isinstance(node, ast.ClassDef) and n > MAX_CLASS_LINES:
                long.append(f"{m}:{node.lineno} class {node.name}: {n} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n > MAX_FUNCTION_LINES:
                long.append(f"{m}:{node.lineno} {node.name}(): {n} lines")
    assert not long, "\n".join(long)
