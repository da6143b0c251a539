"""The sources of a recording, in the one list the recorder (engramprof/record/recorder.py) reads.

Each is one probe's side (``probes/<p>.bpf.c`` loaded by ``engramprof/bpf/<p>.py``) or the
samplers', implementing :class:`~engramprof.record.sources.base.Source`.  Adding a read path is
one probe and one source module, registered here.

The order is the order of loading (and of draining, syncing and summaries):

0. file names (names): attached at once, first, so that a file opened after the read sources
   looked at /proc is named by the kernel (no events of its own);
1. evictions: attached at once, so the target's files are watched before its first
   recorded read (an eviction before the window explains a miss inside it);
2. page cache: attached at once, before the call probe, whose ring would fill while it compiles;
3. syscalls: the required one; attached while it loads;
4. faults, 5. io_uring read requests (uring), 6. libaio read iocbs (libaio), 7. off-CPU (sched):
   compiled one after the other (seconds each on a busy machine), attached together once every
   probe is compiled: the window begins then;
8. samplers, 9. Python stacks (py-spy): started when the window begins.
"""
from __future__ import annotations

from engramprof.record.sources.base import Availability, Options, Recording, Source
from engramprof.record.sources.evictions import EvictionsSource
from engramprof.record.sources.faults import FaultsSource
from engramprof.record.sources.libaio import LibaioSource
from engramprof.record.sources.names import NamesSource
from engramprof.record.sources.pagecache import PagecacheSource
from engramprof.record.sources.samples import SamplesSource
from engramprof.record.sources.sched import SchedSource
from engramprof.record.sources.stacks import StacksSource
from engramprof.record.sources.syscalls import SyscallsSource
from engramprof.record.sources.uring import UringSource

SOURCES: list[type[Source]] = [NamesSource, EvictionsSource, PagecacheSource, SyscallsSource, FaultsSource, UringSource,
                               LibaioSource, SchedSource,
                               SamplesSource, StacksSource]

__all__ = ["SOURCES", "Availability", "Options", "Recording", "Source"]
