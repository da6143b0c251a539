"""`engramprof export` scraped by a real Prometheus (Debian's package), with real probes.

One shared run (module fixture): a cgroup2 group holding a warm lab pool reader (the
python-scheduling scenario), `engramprof export --cgroup` on it (label rank=0); two memory-mapped
lab readers (numpy.memmap gathers), one in the residency scenario (its table evicted every 20 ms)
and one warm, and the io_uring, libaio and lseek + read() readers in the residency scenario,
each with its own `engramprof export --pid --markers` (rank=mmap-cold, rank=mmap-warm,
rank=uring-cold, rank=aio-cold, rank=read-cold; their exporters start side by side); and a
Prometheus server started here on 127.0.0.1 scraping them all (generated config, scrape interval
1 s, data in a temporary directory).  The tests then ask Prometheus's HTTP API; the restart test kills the reader and
starts another one in the same group.  The --file test runs its own exporter (no Prometheus:
it parses /metrics).  Bad input (tests/test_export_input.py) needs neither BPF nor Prometheus.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.tracing import Proc, engramprof

REPO = Path(__file__).resolve().parent.parent
CGROUP2 = Path("/sys/fs/cgroup/unified")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DASHBOARD = REPO / "deploy" / "grafana-dashboard.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Prom:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        q = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        doc = json.loads(_get(f"{self.base}/api/v1/query?{urllib.parse.urlencode(q)}"))
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def value(self, expr: str, at: float | None = None) -> float:
        res = self.query(expr, at)
        assert len(res) == 1, f"{expr}: {res}"
        return float(res[0]["value"][1])


def _wait(what: str, ok, timeout: float = 60, every: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            v = ok()
            if v:
                return v
        except (OSError, AssertionError, ValueError):
            pass
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _start_reader(table: Path, markers: Path, group: Path) -> Proc:
    lab = Proc(engramprof("lab", "run", "--table", table, "--warm", "--reader", "pool", "--duration", "300",
                          "--markers", markers, "--start-delay", "120", "--json"))
    lab.wait_line("lab: ready")
    (group / "cgroup.procs").write_text(str(lab.pid))  # moved in before its first read
    os.kill(lab.pid, signal.SIGUSR1)
    return lab


#: the lab reader of each request-path case: (`--reader`, the exporter's `kind` label)
REQUEST_READERS = {"uring-cold": ("uring", "io_uring"), "aio-cold": ("aio", "libaio"),
                   "read-cold": ("read", "syscall")}  # lseek + read(): syscall reads from the file position


def _start_mapped(kind: str, table: Path, tmp: Path, port: int) -> dict:
    """A lab reader waiting to start (mmap-cold: a numpy.memmap gather in the residency scenario;
    mmap-warm: `lab run --warm`; uring-cold / aio-cold / read-cold: the io_uring / libaio /
    read() reader in the residency scenario, 300 steps) and its exporter (--pid, its markers, label rank=KIND),
    starting (see _go)."""
    if kind == "mmap-cold":
        argv = engramprof("lab", "scenario", "residency", "--reader", "mmap", "--table", table, "--duration", "300",
                          "--start-delay", "120", "--json")
    elif kind in REQUEST_READERS:
        argv = engramprof("lab", "scenario", "residency", "--reader", REQUEST_READERS[kind][0], "--table", table,
                          "--steps", "300", "--start-delay", "120", "--json")
    else:
        argv = engramprof("lab", "run", "--table", table, "--warm", "--reader", "mmap", "--duration", "300",
                          "--markers", tmp / "mmap-warm.jsonl", "--start-delay", "120", "--json")
    reader = Proc(argv)
    if kind != "mmap-warm":
        ready = json.loads(reader.p.stdout.readline())  # the scenario's first JSON line
        pid, markers = ready["pid"], ready["markers"]
    else:
        reader.wait_line("lab: ready")
        pid, markers = reader.p.pid, tmp / "mmap-warm.jsonl"
    exporter = Proc(engramprof("export", "--pid", str(pid), "--markers", markers, "--window", "3",
                               "--listen", f"127.0.0.1:{port}", "--label", f"rank={kind}"))
    return dict(reader=reader, exporter=exporter, pid=pid, port=port)


def _go(m: dict) -> None:
    """Once its exporter is attached: the reader's majflt now, and the reader started."""
    m["exporter"].wait_line("Exporting", timeout=180)
    m["majflt0"] = _majflt(m["pid"])
    os.kill(m["pid"], signal.SIGUSR1)  # attached: start reading


def _majflt(pid: int) -> int:
    """The kernel's count of the process's major faults (/proc/PID/stat field 12)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[9])


def _stop(proc, sig=signal.SIGKILL):
    p = proc.p if isinstance(proc, Proc) else proc
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def lab_rate(markers: Path, t0_mono: float, t1_mono: float) -> float:
    """The lab's own reads per second in [t0, t1] (CLOCK_MONOTONIC s): rows of its marked batches."""
    rows = 0
    for line in markers.read_text().splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if t0_mono * 1e9 <= m["end_ns"] <= t1_mono * 1e9:
            rows += m["rows"]
    return rows / (t1_mono - t0_mono)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    from tests.conftest import require_bpf

    require_bpf()
    if not os.path.exists(PROMETHEUS):
        pytest.skip("Debian's prometheus package is not installed (`make setup` installs it)")
    if not (CGROUP2 / "cgroup.procs").exists():
        pytest.skip(f"no cgroup2 hierarchy at {CGROUP2}")
    tmp = tmp_path_factory.mktemp("export")
    table = tmp / "table.safetensors"
    subprocess.run(engramprof("lab", "make-table", table, "--rows", "32768"), check=True, capture_output=True)
    group = CGROUP2 / f"engramprof-export-{os.getpid()}"
    group.mkdir()
    procs: list = []
    try:
        markers = tmp / "m1.jsonl"
        lab = _start_reader(table, markers, group)
        procs.append(lab)
        eport, pport = _free_port(), _free_port()
        exporter = Proc(engramprof("export", "--cgroup", group, "--window", "3", "--listen", f"127.0.0.1:{eport}",
                                   "--label", "rank=0"))
        procs.append(exporter)
        exporter.wait_line("Exporting", timeout=120)
        mapped = {}
        for kind in ("mmap-cold", "mmap-warm", *REQUEST_READERS):  # their exporters compile side by side
            mtable = tmp / f"{kind}.safetensors"
            subprocess.run(engramprof("lab", "make-table", mtable, "--rows", "16384"), check=True, capture_output=True)
            mapped[kind] = _start_mapped(kind, mtable, tmp, _free_port())
            procs += [mapped[kind]["reader"], mapped[kind]["exporter"]]
        ports = ", ".join(f"'127.0.0.1:{p}'" for p in [eport] + [m["port"] for m in mapped.values()])
        cfg = tmp / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                       f"  - job_name: engramprof\n    static_configs:\n      - targets: [{ports}]\n")
        prom_p = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{pport}"],
                                  stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"))
        procs.append(prom_p)
        prom = Prom(pport)
        _wait("prometheus ready", lambda: "Ready" in _get(f"{prom.base}/-/ready"))
        for m in mapped.values():  # scraped from their first read (the request readers' 300 steps take seconds)
            _go(m)
        # 20 s of scrapes: a full 15 s rate window while the reader runs, several analysis windows
        _wait("20 s of samples", lambda: prom.query("count_over_time(up[25s]) >= 20"), timeout=60)
        yield dict(tmp=tmp, table=table, group=group, lab=lab, markers=markers, exporter=exporter, prom=prom,
                   eport=eport, procs=procs, mapped=mapped)
    finally:
        for p in reversed(procs):
            _stop(p, signal.SIGTERM if p is not procs[0] else signal.SIGKILL)
        for p in procs:
            _stop(p)
        _wait("cgroup empty", lambda: not (group / "cgroup.procs").read_text().strip(), timeout=30)
        group.rmdir()


pytestmark = [pytest.mark.bpf, pytest.mark.slow]


def test_read_rate_matches_the_lab_own_rate(scraped):
    prom = scraped["prom"]
    at = time.time() - 3  # the lab flushes its markers about once a second
    mono = at - (time.time() - time.monotonic())
    got = prom.value('sum(rate(engramprof_read_calls_total{kind="syscall",rank="0"}[15s]))', at)
    want = lab_rate(scraped["markers"], mono - 15, mono)
    assert want > 1000, want
    print(f"rate[15s]: Prometheus {got:.0f}/s, the lab's own {want:.0f}/s ({(got - want) / want:+.2%})")
    assert abs(got - want) / want <= 0.05, (got, want)


def test_histogram_count_equals_the_calls_counter(scraped):
    prom = scraped["prom"]
    at = time.time() - 1
    calls = {r["metric"]["file"]: float(r["value"][1])
             for r in prom.query('engramprof_read_calls_total{kind="syscall"}', at)}
    counts = {r["metric"]["file"]: float(r["value"][1])
              for r in prom.query('engramprof_read_latency_seconds_count{kind="syscall"}', at)}
    assert str(scraped["table"]) in calls and calls[str(scraped["table"])] > 10_000, calls
    assert counts == calls
    inf = {r["metric"]["file"]: float(r["value"][1])
           for r in prom.query('engramprof_read_latency_seconds_bucket{kind="syscall",le="+Inf"}', at)}
    assert inf == calls


def test_python_scheduling_scenario_puts_python_scheduling_first(scraped):
    prom = scraped["prom"]
    res = prom.query('increase(engramprof_batch_cause_seconds_total{rank="0"}[20s])')
    inc = {r["metric"]["cause"]: float(r["value"][1]) for r in res}
    assert inc["python-scheduling"] > 0, inc
    verdict_causes = {c: inc[c] for c in ("residency", "reclaim", "storage", "python-scheduling")}
    assert max(verdict_causes, key=verdict_causes.get) == "python-scheduling", inc
    assert prom.value('max_over_time(engramprof_window_verdict{rank="0",verdict="python-scheduling"}[20s])') == 1
    assert prom.value('increase(engramprof_batch_seconds_count{rank="0"}[20s])') > 0


def test_dashboard_metrics_are_all_in_a_real_scrape(scraped):
    text = _get(f"http://127.0.0.1:{scraped['eport']}/metrics")
    exported = set(re.findall(r"^(engramprof_\w+?)(?:\{| )", text, flags=re.M))
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    used = {n for e in exprs for n in re.findall(r"\bengramprof_\w+", e)}
    assert used and used <= exported, sorted(used - exported)


def test_target_restart_continues_without_duplicated_series(scraped):
    prom, group = scraped["prom"], scraped["group"]
    table = str(scraped["table"])
    sel = f'engramprof_read_calls_total{{kind="syscall",file="{table}"}}'
    before = prom.value(sel)
    _stop(scraped["lab"])  # kill -9: the target is gone, the exporter stays
    _wait("target gone", lambda: prom.value('engramprof_target_processes{rank="0"}') == 0, timeout=20)
    assert prom.value('engramprof_target_waiting{rank="0"}') == 1
    lab2 = _start_reader(scraped["table"], scraped["tmp"] / "m2.jsonl", group)
    scraped["procs"].insert(1, lab2)
    _wait("new target counted", lambda: prom.value('engramprof_target_processes{rank="0"}') == 1, timeout=20)
    _wait("reads of the new process", lambda: prom.value(sel) > before + 10_000, timeout=30)
    assert scraped["exporter"].p.poll() is None, "the exporter restarted or died"
    assert prom.value('engramprof_target_waiting{rank="0"}') == 0
    # one series per (file, kind): the new process's reads went on in the same ones
    dup = prom.query("count by (file, kind, rank) (engramprof_read_calls_total) > 1")
    assert dup == [], dup
    assert len(prom.query(sel)) == 1


def test_mapped_reader_evicted_every_step_windows_say_residency(scraped):
    """A numpy.memmap gather whose table is evicted every 20 ms: its windows (batches from its
    markers, read events from the fault samples) say residency, and the exporter's fault misses
    equal the kernel's count of the reader's major faults."""
    prom, m = scraped["prom"], scraped["mapped"]["mmap-cold"]
    assert prom.value('max_over_time(engramprof_window_verdict{rank="mmap-cold",verdict="residency"}[20s])') == 1
    inc = {r["metric"]["cause"]: float(r["value"][1])
           for r in prom.query('increase(engramprof_batch_cause_seconds_total{rank="mmap-cold"}[20s])')}
    causes = {c: inc[c] for c in ("residency", "reclaim", "storage", "python-scheduling")}
    assert max(causes, key=causes.get) == "residency" and inc["residency"] > 0, inc
    assert prom.value('increase(engramprof_window_analyses_total{rank="mmap-cold",result="ok"}[20s])') > 0
    # the kernel's count as the truth: the reader stopped (SIGSTOP), its faults all closed by
    # the switch-out or left open (at most one a thread: the stopped thread's last fault)
    os.kill(m["pid"], signal.SIGSTOP)
    try:
        time.sleep(0.5)
        majflt = _majflt(m["pid"]) - m["majflt0"]
        threads = len(os.listdir(f"/proc/{m['pid']}/task"))
        got = _scrape(m["port"])
    finally:
        os.kill(m["pid"], signal.SIGCONT)
    misses = sum(v for (name, labels), v in got.items()
                 if name == "engramprof_read_misses_total" and dict(labels).get("kind") == "fault")
    assert majflt > 1000, majflt
    assert majflt - threads <= misses <= majflt, (misses, majflt, threads)


def test_mapped_reader_warm_windows_say_healthy(scraped):
    """The same reader on a cached, mapped table: it hardly faults; its marked batches are
    analysed all the same, and say healthy."""
    prom = scraped["prom"]
    assert prom.value('max_over_time(engramprof_window_verdict{rank="mmap-warm",verdict="healthy"}[20s])') == 1
    assert prom.value('increase(engramprof_window_analyses_total{rank="mmap-warm",result="ok"}[20s])') > 0
    assert prom.value('increase(engramprof_window_analyses_total{rank="mmap-warm",result="no-batches"}[20s])') == 0


@pytest.mark.parametrize("case", list(REQUEST_READERS))
def test_request_reader_counted_exactly_and_analysed(scraped, case):
    """The io_uring reader, the libaio reader (O_DIRECT) and the lseek + read() reader, evicted
    every 20 ms: every SQE / iocb / read() it made is one read of its kind on its table (the
    reader's own count), and its windows are analysed with the I/O wait as residency, never as
    Python scheduling."""
    prom, m = scraped["prom"], scraped["mapped"][case]
    kind = REQUEST_READERS[case][1]
    done = json.loads(m["reader"].p.stdout.readline())  # the scenario's last line: 300 steps read
    assert done["event"] == "done", done
    time.sleep(1.5)  # the exporter's next drain and Prometheus's next scrape
    got = _scrape(m["port"])
    calls = {dict(k[1])["file"]: v for k, v in got.items()
             if k[0] == "engramprof_read_calls_total" and dict(k[1]).get("kind") == kind}
    assert calls == {done["summary"]["table"]: done["summary"]["calls"]}, (calls, done["summary"])
    if kind != "syscall":  # every read() of a regular file is a syscall read, the interpreter's too
        assert got[("engramprof_probe_reads_total", (("kind", kind), ("rank", case)))] == done["summary"]["calls"]
    key = (("file", done["summary"]["table"]), ("kind", kind), ("rank", case))
    assert got[("engramprof_read_latency_seconds_count", key)] == done["summary"]["calls"]
    assert 0 < got[("engramprof_read_misses_total", key)] <= done["summary"]["calls"]
    if kind == "libaio":  # O_DIRECT: every iocb bypassed the page cache, each one a miss
        assert got[("engramprof_read_misses_total", key)] == done["summary"]["calls"]
        assert got[("engramprof_read_bytes_total", key)] > 0
    inc = {r["metric"]["cause"]: float(r["value"][1])
           for r in prom.query(f'max_over_time(engramprof_batch_cause_seconds_total{{rank="{case}"}}[60s])')}
    assert inc["python-scheduling"] < 0.1 * sum(inc.values()), inc
    assert prom.value(f'max_over_time(engramprof_window_verdict{{rank="{case}",verdict="residency"}}[60s])') == 1
    assert prom.value(f'max_over_time(engramprof_window_coverage_ratio{{rank="{case}"}}[60s])') > 0


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a real /metrics (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(_get(f"http://127.0.0.1:{port}/metrics")):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_file_selector_counts_those_files_only_both_read_paths(tmp_path):
    """--file A --file C: a pool reader of A (its every call), a cold mmap reader of C (faults with
    misses), a pool reader of B (nothing): selected in the kernel, counted exactly."""
    from tests.conftest import require_bpf

    require_bpf()
    a, b, c = (tmp_path / f"{n}.safetensors" for n in "abc")
    for t in (a, b, c):
        subprocess.run(engramprof("lab", "make-table", t, "--rows", "16384"), check=True, capture_output=True)
    readers = [("--table", a, "--warm", "--reader", "pool", "--steps", "300"),
               ("--table", b, "--warm", "--reader", "pool", "--steps", "300"),
               ("--table", c, "--cold", "--reader", "mmap", "--steps", "50")]
    labs = [Proc(engramprof("lab", "run", *r, "--start-delay", "120", "--json")) for r in readers]
    port = _free_port()
    exporter = None
    try:
        for lab in labs:
            lab.wait_line("lab: ready")
        exporter = Proc(engramprof("export", "--file", a, "--file", c, "--window", "2",
                                   "--listen", f"127.0.0.1:{port}"))
        exporter.wait_line("Exporting", timeout=120)
        for lab in labs:
            os.kill(lab.pid, signal.SIGUSR1)
        results = []
        for lab in labs:
            rc, out, err = lab.finish()
            assert rc == 0, err
            results.append(json.loads(out))
        time.sleep(1.5)
        m = _scrape(port)
    finally:
        for lab in labs:
            _stop(lab)
        if exporter is not None:
            _stop(exporter, signal.SIGTERM)
    files = {(dict(k[1]).get("file"), dict(k[1]).get("kind")) for k in m if k[0] == "engramprof_read_calls_total"}
    assert files == {(str(a), "syscall"), (str(c), "fault")}, files
    calls = m[("engramprof_read_calls_total", (("file", str(a)), ("kind", "syscall")))]
    assert calls == results[0]["calls"] > 0, (calls, results[0]["calls"])
    key = (("file", str(c)), ("kind", "fault"))
    faults, misses = m[("engramprof_read_calls_total", key)], m[("engramprof_read_misses_total", key)]
    assert 0 < misses <= faults, (misses, faults)
    assert m[("engramprof_read_pages_inserted_total", key)] >= misses
    if ("engramprof_read_latency_seconds_count", key) in m:  # fault spans (x86 page_fault_user)
        assert m[("engramprof_read_latency_seconds_count", key)] == faults
        assert m[("engramprof_read_latency_seconds_sum", key)] > 0
    assert m[("engramprof_probe_reads_total", (("kind", "syscall"),))] == calls  # B's reads never counted
    # no bio queued inside a syscall read (A is warm; C's misses are faults): none untracked either
    assert m[("engramprof_bios_untracked_total", ())] == 0
