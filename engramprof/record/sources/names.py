"""The file-name source: probes/names.bpf.c names, at every open of a target, the file it opened
by identity (device, inode), from the kernel's dentries.

It writes no events.  The read sources' :class:`~.filepaths.FilePathEnricher` asks it
(:meth:`Recording.kernel_file_name`) for an identity the process's open files and mappings do
not name: a file opened, read and closed between two looks at /proc (open / read / close per
chunk).  It is attached while it loads, first of all sources, so that a file opened after the
read sources looked at /proc is named.  Its counts go to meta.json (``file_names``).
"""
from __future__ import annotations

from engramprof.bpf import names as names_probe
from engramprof.host import tracepoints as tp
from engramprof.record.sources.base import YES, Availability, Recording, Source, sync_probe_targets


class NamesSource(Source):
    """The file-name probe: names for identities, no events."""

    name = "file_names"
    title = "file names at open"

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.probe: names_probe.NamesProbe | None = None
        self._totals: dict[str, int] = {}

    def available(self) -> Availability:
        if tp.tracefs_root() is None:
            return Availability(False, "tracefs cannot be read")
        lacking = names_probe.missing()
        if lacking:
            return Availability(False, f"the kernel lacks {', '.join(lacking)}: files opened and closed between "
                                       "two looks at /proc stay unnamed")
        return YES

    def load(self) -> None:
        """Compile and attach at once (before the read sources look at /proc)."""
        rec = self.rec
        self.probe = names_probe.NamesProbe(names_probe.plan(rec.pid, rec.tid, rec.selection))
        self.probe.arm()
        rec.kernel_names = self.probe

    def arm(self) -> None:
        pass

    def begin_window(self, start_ns: int) -> None:
        pass

    def drain(self, sink) -> None:
        pass

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def totals(self) -> dict[str, int]:
        if self.probe is not None and self.probe.bpf is not None:
            self._totals = self.probe.totals()
        return dict(self._totals)

    def summary(self) -> dict | None:
        return None

    def closing_meta(self, summary: dict | None) -> dict:
        return {self.name: self.totals()}

    def close(self) -> None:
        if self.probe is not None and self.probe.bpf is not None:
            self.totals()
            self.rec.kernel_names = None
            self.probe.close()
