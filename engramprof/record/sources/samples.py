"""The samplers' source: PSI, vmstat, the target's cgroup and threads sampled at ``--sample-hz``
(engramprof/sampling/sampler.py) from the window's start to the recording's end.

No probe: the sampler runs its own thread and writes its series through the trace writer;
this source starts it when the window begins, stops it at the end, and hands its summary
(``context``).  Samplers are context: a sampler that cannot run never costs the trace.
"""
from __future__ import annotations

from engramprof.record.sources.base import NOT_ASKED, YES, Availability, Recording, Source
from engramprof.sampling.sampler import Sampler


class SamplesSource(Source):
    """Starts the sampler when the window begins; its summary is the summary's ``context``."""

    name = "context"
    aliases = ("sampler",)  # the live view reads recorder.sampler.status_line()
    title = "samplers"
    absent = "not running"

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.sampler: Sampler | None = None

    def available(self) -> Availability:
        return YES if self.rec.options.sample_hz else NOT_ASKED

    def load(self) -> None:
        """Nothing to compile."""

    def arm(self) -> None:
        """Nothing to attach: the sampler starts with the window."""

    def begin_window(self, start_ns: int) -> None:
        s = self.rec.selection
        several = len(s.pids) != 1 or s.children or s.cgroups_v2 or s.cgroups_v1 or s.files
        sampler = Sampler(pid=self.rec.pid or None, hz=self.rec.options.sample_hz,
                          follow=self.rec.traced_tgids if several else None)
        sampler.start(self.rec.writer)
        self.sampler = sampler

    def drain(self, sink) -> None:
        """The sampler writes its own series (about once a second)."""

    def sync_targets(self) -> None:
        """It follows the recorder's traced processes itself (``follow``)."""

    def totals(self) -> dict[str, int]:
        return {}

    def status_line(self) -> str:
        return self.sampler.status_line() if self.sampler is not None else "sampler: not started"

    def detach(self) -> None:
        """Stop sampling (a last round now; its metadata into meta.json)."""
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception as exc:
                self.rec.notes.append(f"sampler stop failed: {exc}")

    def summary(self) -> dict | None:
        if self.sampler is None:
            return None
        try:
            return self.sampler.summary()
        except Exception as exc:
            self.rec.notes.append(f"sampler summary failed: {exc}")
            return None

    def closing_meta(self, summary: dict | None) -> dict:
        return {}  # the sampler wrote its own (meta "sampler")

    def close(self) -> None:
        self.detach()
