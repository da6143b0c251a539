"""The syscall probe's sched hooks (probes/syscalls.bpf.c, HAVE_SCHED): real eBPF.

sched_switch (next) and sched_wakeup fire for every task of the machine; they test one bit of
``call_out_bits`` ("this target thread is switched out inside a traced call") before the clock
read and the ``offcpu_by_tid`` lookup.  The bit is set when a target thread inside a call is
switched out and cleared when it is switched back in, so:

* a thread blocked inside a call has its bit set and an entry; once the call returned, both are
  gone (fails on the code before the bitmap: there is no ``call_out_bits``);
* a call switched out many times (sleeps on its bios, preemptions by a spinner on its CPU) still
  gets all of its off-CPU time: every switch-out sets the bit again (a guard: the old code did
  the lookup for every switch);
* switches of non-target threads inside their own preadv calls, and of the target outside any
  call, leave no entry and no bit (a guard: the old code never created entries for them either).
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.bpf
SYS_PREADV2 = 327  # x86_64; /proc/PID/syscall's first field while blocked in it

# preadv2(fd 0, one iovec, offset -1, flags 0): -1 reads at the file position, so a pipe works
# (preadv / pread64 refuse a pipe: ESPIPE); it blocks until the test writes
PIPE_READER = r"""
import ctypes, os, sys
go = int(sys.argv[1])             # the test's go / end pipe
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(4096)
iov = iovec(ctypes.cast(buf, ctypes.c_void_p), 4096)
print("ready", flush=True)
os.read(go, 1)                    # a plain read: not a traced call
n = libc.preadv2(0, ctypes.byref(iov), 1, ctypes.c_longlong(-1), 0)
print(n, flush=True)
os.read(go, 1)
"""

# one cold preadv of the whole file, pinned to the CPU a spinner is pinned to: the call sleeps on
# its bios and is preempted; the script reports its own wall and thread CPU time around the call
# and its context switches (voluntary: sleeps, nonvoluntary: preemptions)
COLD_READER = r"""
import json, os, sys, time
path, cpu = sys.argv[1], int(sys.argv[2])
os.sched_setaffinity(0, {cpu})
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
buf = bytearray(b"\1") * size     # touched: no zero-fill faults inside the call
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
def switches():
    with open("/proc/thread-self/status") as f:
        kv = dict(l.split(":", 1) for l in f if "ctxt_switches" in l)
    return int(kv["voluntary_ctxt_switches"]), int(kv["nonvoluntary_ctxt_switches"])
print("ready", flush=True)
sys.stdin.readline()
v0, n0 = switches()
c0, w0 = time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID), time.monotonic_ns()
n = os.preadv(fd, [buf], 0)
c1, w1 = time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID), time.monotonic_ns()
v1, n1 = switches()
print(json.dumps({"n": n, "wall": w1 - w0, "cpu": c1 - c0, "vol": v1 - v0, "invol": n1 - n0}), flush=True)
sys.stdin.readline()
"""

SPINNER = r"""
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
print("ready", flush=True)
while True:
    pass
"""

# the target: a ping-pong with plain read / write (switches outside any traced call) against a
# partner (not a target) that reads with preadv2 (switched out inside untraced preadv calls)
PING_PONG = r"""
import ctypes, os, sys
rounds = int(sys.argv[1])
partner_in, target_out = os.pipe()   # (read end, write end)
target_in, partner_out = os.pipe()
print("ready", flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:                      # the partner: a new tgid, not selected
    libc = ctypes.CDLL(None, use_errno=True)
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    buf = ctypes.create_string_buffer(1)
    iov = iovec(ctypes.cast(buf, ctypes.c_void_p), 1)
    for _ in range(rounds):
        if libc.preadv2(partner_in, ctypes.byref(iov), 1, ctypes.c_longlong(-1), 0) != 1:
            os._exit(1)
        os.write(partner_out, b"p")
    os._exit(0)
for _ in range(rounds):
    os.write(target_out, b"t")
    os.read(target_in, 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), flush=True)
sys.stdin.readline()
"""


def _probe(pid: int):
    from engramprof.bpf import syscalls as syscalls_probe

    probe = syscalls_probe.SyscallsProbe(syscalls_probe.plan(syscalls_probe.SyscallsConfig(tgid=pid)))
    if not probe.plan.features.get("HAVE_SCHED"):
        probe.close()
        pytest.skip("this kernel lacks sched_switch / sched_wakeup: no off-CPU evidence to check")
    return probe


def _bits_set(probe) -> dict[int, int]:
    """word index -> word, of every non-zero word of call_out_bits (none: a probe without it)."""
    try:
        table = probe.bpf["call_out_bits"]
    except KeyError:  # the probe before the bitmap: the guards below still apply to it
        return {}
    return {i: table[ctypes.c_int(i)].value for i in range(probe.plan.config.tid_words)
            if table[ctypes.c_int(i)].value}


def _offcpu_entries(probe) -> dict[int, tuple[int, int]]:
    """tid -> (out_ts, preempted) of every offcpu_by_tid entry."""
    return {k.value: (v.out_ts, v.preempted) for k, v in probe.bpf["offcpu_by_tid"].items()}


def _blocked_in(pid: int, nr: int, timeout: float = 10.0) -> bool:
    """Wait until thread ``pid`` sleeps inside syscall ``nr``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/syscall") as f:
            sc = f.read().split()[0]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if sc == str(nr) and state == "S":
            return True
        time.sleep(0.01)
    return False


def test_a_thread_blocked_in_a_call_has_its_bit_and_the_return_clears_it():
    if os.uname().machine != "x86_64":
        pytest.skip("the blocked-in-syscall check reads x86_64's preadv2 number")
    go_r, go_w = os.pipe()
    w = subprocess.Popen([sys.executable, "-c", PIPE_READER, str(go_r)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, pass_fds=(go_r,))
    os.close(go_r)
    probe = None
    try:
        assert w.stdout.readline().strip() == "ready"
        probe = _probe(w.pid)
        assert _bits_set(probe) == {} and _offcpu_entries(probe) == {}
        os.write(go_w, b"g")
        assert _blocked_in(w.pid, SYS_PREADV2), "the reader never blocked in preadv2"
        # blocked inside the call: the bit of its tid is set, its entry waits for the switch-in
        assert _bits_set(probe) == {w.pid >> 6: 1 << (w.pid & 63)}
        entries = _offcpu_entries(probe)
        assert list(entries) == [w.pid] and entries[w.pid][0] > 0 and entries[w.pid][1] == 0, entries
        time.sleep(0.3)
        blocked_ns = 300_000_000
        w.stdin.write("x" * 10)
        w.stdin.flush()
        assert w.stdout.readline().strip() == "10"
        recs = probe.ring.drain()
        bits_after, entries_after = _bits_set(probe), _offcpu_entries(probe)
    finally:
        os.write(go_w, b"e")
        os.close(go_w)
        if w.poll() is None:
            w.stdin.close()
            w.wait(timeout=30)
        if probe is not None:
            probe.close()
    assert len(recs) == 1, recs
    r = recs[0]
    # the whole sleep is credited, and it is not run-queue wait (woken on an idle CPU)
    assert blocked_ns <= r["offcpu_ns"] <= r["dur_ns"], (r["offcpu_ns"], r["dur_ns"])
    assert r["runq_ns"] < r["offcpu_ns"] // 10, (r["runq_ns"], r["offcpu_ns"])
    # switched in: bit cleared; returned: entry gone
    assert (bits_after, entries_after) == ({}, {})


def _steal_ticks(cpu: int) -> int:
    """The hypervisor's steal of ``cpu`` so far (/proc/stat, USER_HZ ticks)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                return int(line.split()[8])
    return 0


def _cold_call_beside_a_spinner(path, cpu: int):
    """One cold read of ``path`` by a reader pinned to ``cpu`` beside a spinner there, traced:
    (the reader's own figures, the records, bits and entries left, steal ticks during it)."""
    spin = subprocess.Popen([sys.executable, "-c", SPINNER, str(cpu)], stdout=subprocess.PIPE, text=True)
    w = subprocess.Popen([sys.executable, "-c", COLD_READER, str(path), str(cpu)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    probe = None
    try:
        assert spin.stdout.readline().strip() == "ready"
        assert w.stdout.readline().strip() == "ready"
        probe = _probe(w.pid)
        steal = _steal_ticks(cpu)
        w.stdin.write("go\n")
        w.stdin.flush()
        seen = json.loads(w.stdout.readline())
        steal = _steal_ticks(cpu) - steal
        recs = probe.ring.drain()
        bits_after, entries_after = _bits_set(probe), _offcpu_entries(probe)
    finally:
        spin.kill()
        spin.wait()
        if w.poll() is None:
            w.stdin.close()
            w.wait(timeout=30)
        if probe is not None:
            probe.close()
    return seen, recs, bits_after, entries_after, steal


#: runs of the scenario before its on-CPU bound is failed (see the test)
STEAL_ATTEMPTS = 3


def test_a_call_switched_out_many_times_gets_all_its_off_cpu_time(tmp_path):
    path = tmp_path / "cold.bin"
    size = 64 << 20
    with open(path, "xb") as f:
        f.write(os.urandom(size))
        os.fsync(f.fileno())
    cpu = sorted(os.sched_getaffinity(0))[-1]
    over = []
    for _ in range(STEAL_ATTEMPTS):
        seen, recs, bits_after, entries_after, steal = _cold_call_beside_a_spinner(path, cpu)
        assert seen["n"] == size
        # the scenario: the call slept (its bios) and was preempted (the spinner), 3 switch-outs or more
        assert seen["vol"] >= 1 and seen["invol"] >= 1 and seen["vol"] + seen["invol"] >= 3, seen
        assert len(recs) == 1, recs
        r = recs[0]
        off_cpu, on_cpu = int(r["offcpu_ns"]), int(r["dur_ns"]) - int(r["offcpu_ns"])
        # every switch-out credited.  The call's on-CPU time (its duration less its off-CPU time)
        # is at most the thread's CPU time around it (the script's clock reads add microseconds),
        # so a missed switch-out shows as on-CPU time the thread never had (a spinner's slice,
        # ~3 ms, or a bio's sleep).  The thread's own off-CPU time around the call (wall - cpu)
        # bounds it from above: it also holds the preemptions between the clock reads and the
        # call, which is why the comparison is not with wall - cpu itself (it failed by 11 ms
        # under load in CI run 2).  Time the hypervisor stole from this vCPU while the thread ran
        # is not in the thread's CPU clock (CONFIG_PARAVIRT_TIME_ACCOUNTING) and shows as on-CPU
        # time too (CI run 33, a busy host: 1.28 ms over): a run over the bound is run again, up
        # to STEAL_ATTEMPTS times; a missed switch-out fails every one.
        assert 0 <= on_cpu, (r["offcpu_ns"], r["dur_ns"])
        assert off_cpu <= seen["wall"] - seen["cpu"] + 1_000_000, (r["offcpu_ns"], seen)
        # preempted while runnable and woken onto a busy CPU: part of it is run-queue wait, not all
        assert 0 < r["runq_ns"] < r["offcpu_ns"], (r["runq_ns"], r["offcpu_ns"])
        assert (bits_after, entries_after) == ({}, {})
        if on_cpu <= seen["cpu"] + 1_000_000:
            return
        over.append({"on_cpu": on_cpu, "cpu": seen["cpu"], "steal_ticks": steal})
    pytest.fail(f"on-CPU time above the thread's CPU time in {STEAL_ATTEMPTS} runs of {STEAL_ATTEMPTS}: {over}")


def test_switches_of_other_threads_and_outside_calls_leave_nothing():
    """A guard: the code before the bitmap never created entries for them either."""
    rounds = 20000
    w = subprocess.Popen([sys.executable, "-c", PING_PONG, str(rounds)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    probe = None
    try:
        assert w.stdout.readline().strip() == "ready"
        probe = _probe(w.pid)
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().strip() == "0"  # the partner read every round with preadv2
        recs = probe.ring.drain()
        totals = probe.totals()
        bits_after, entries_after = _bits_set(probe), _offcpu_entries(probe)
    finally:
        if w.poll() is None:
            w.stdin.close()
            w.wait(timeout=30)
        if probe is not None:
            probe.close()
    assert len(recs) == 0 and totals["calls"] == 0, (len(recs), totals)
    assert (bits_after, entries_after) == ({}, {})
