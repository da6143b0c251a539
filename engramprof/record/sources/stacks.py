"""The stack sampler's source: the target's Python stacks and GIL holder (samples/stacks),
sampled with py-spy at ``--stack-hz`` from the window's start to the recording's end
(engramprof/sampling/stacks.py).

No probe: like the samplers it runs its own thread and writes its series through the trace
writer.  Context, never a cost to the trace: no py-spy, or a target that is not CPython, is
one note and the rest of the recording is unchanged.
"""
from __future__ import annotations

from engramprof.record.sources.base import NOT_ASKED, YES, Availability, Recording, Source
from engramprof.sampling.stacks import StackSampler, find_py_spy


class StacksSource(Source):
    """Starts the stack sampler when the window begins; its summary is ``stacks``."""

    name = "stacks"
    title = "Python stacks"
    absent = "not sampled"
    absent_meta = {"stacks": None}

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.sampler: StackSampler | None = None

    def available(self) -> Availability:
        if not self.rec.options.stack_hz:
            return NOT_ASKED
        if find_py_spy() is None:
            return Availability(False, "py-spy is not installed (pip install py-spy; `make setup` does)")
        return YES

    def load(self) -> None:
        """Nothing to compile."""

    def arm(self) -> None:
        """Nothing to attach: sampling starts with the window."""

    def begin_window(self, start_ns: int) -> None:
        s = self.rec.selection
        pids = (lambda: s.pids) if s.pids and not s.children else self.rec.traced_tgids
        sampler = StackSampler(pids, hz=self.rec.options.stack_hz, writer=self.rec.writer, notes=self.rec.notes)
        sampler.start()
        self.sampler = sampler

    def drain(self, sink) -> None:
        """The sampler writes its own series (about once a second)."""

    def sync_targets(self) -> None:
        """It asks for the traced processes each round."""

    def totals(self) -> dict[str, int]:
        return {} if self.sampler is None else {"stack_rounds": self.sampler.rounds}

    def detach(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def summary(self) -> dict | None:
        return None if self.sampler is None else self.sampler.summary()

    def close(self) -> None:
        self.detach()
