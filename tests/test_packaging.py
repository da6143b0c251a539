"""A non-editable install finds the probes: build the wheel, install it into a fresh venv,
load the probe from the installed package and trace a real read."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CHECK = r"""
import os, sys, engramprof
from engramprof.bpf import structs as layout, syscalls as loader
assert engramprof.__file__.startswith(sys.prefix), engramprof.__file__
src = layout.probe_dir() / "syscalls.bpf.c"
assert str(src).startswith(sys.prefix), src
print("probe", src)
if len(sys.argv) > 1:
    p = loader.SyscallsProbe(loader.plan(loader.SyscallsConfig(tgid=os.getpid())))
    fd = os.open(sys.argv[1], os.O_RDONLY)
    for i in range(100):
        os.preadv(fd, [bytearray(64)], i)
    recs = p.ring.drain()
    p.close()
    # this file's reads: its other reads (read() of a module file, maybe on the same fd number) aside
    print("records", int((recs["ino"] == os.fstat(fd).st_ino).sum()))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("engramprof-*.whl")
    return whl


def test_wheel_ships_probes(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "engramprof/probes/syscalls.bpf.c" in names
    assert "engramprof/probes/engramprof.h" in names


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    v = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(v)], check=True)
    # the dependencies come from the project's venv (no download); engramprof itself only from the wheel
    site = next((v / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(v / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    return v


def test_installed_package_finds_probes(venv):
    r = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "probe " + str(venv) in r.stdout


@pytest.mark.bpf
def test_installed_package_loads_probe_and_traces(venv, tmp_path):
    data = tmp_path / "d"
    data.write_bytes(os.urandom(4096))
    r = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK, str(data)], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "records 100" in r.stdout


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_matplotlib_is_the_plot_extra_and_psutil_not_a_runtime_dependency():
    proj = _pyproject()["project"]
    names = [d.split(">")[0].split("=")[0].strip() for d in proj["dependencies"]]
    assert "matplotlib" not in names and "psutil" not in names
    assert any(d.startswith("matplotlib") for d in proj["optional-dependencies"]["plot"])
    assert "'.[dev,plot]'" in (REPO / "scripts" / "setup.sh").read_text()  # tests and demo plot


BLOCKED = r"""
import sys
for m in sys.argv[1].split(","):
    sys.modules[m] = None  # as if not installed
sys.argv = ["engramprof", *sys.argv[2:]]
from engramprof.cli import main
main()
"""


def _run_without(modules: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, modules, *args], capture_output=True, text=True, cwd=REPO)


def test_plot_without_matplotlib_is_a_one_line_error(tmp_path):
    r = _run_without("matplotlib", "batch-tail", str(tmp_path / "none"), "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 2, r.stderr  # a UserError
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "engramprof[plot]" in r.stderr and "matplotlib" in r.stderr
    assert not (tmp_path / "p.png").exists()


def test_commands_run_without_psutil_and_matplotlib(tmp_path):
    r = _run_without("psutil,matplotlib", "batch-tail", str(tmp_path / "none"))
    assert r.returncode == 2 and "no such trace" in r.stderr, r.stderr
    r = _run_without("psutil,matplotlib", "sample", "--duration", "0.3", "--json")
    assert r.returncode == 0, r.stderr


def test_every_subpackage_is_in_the_wheel():
    # a package missing from pyproject's list is absent from a non-editable install, and only
    # the commands that import it fail there (engramprof.analysis once was)
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "engramprof").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
