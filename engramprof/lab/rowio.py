"""The errors every lab reader shares (the readers' modules import this one, never each other)."""
from __future__ import annotations


class ShortReadError(OSError):
    """A row read hit end-of-file (zero return) before the row was complete."""


class ReaderUnavailable(ValueError):
    """A reader cannot run here (a filesystem without O_DIRECT, io_uring disabled, a binding
    missing): one line for the user; ``code`` is the CLI's exit status (2: this input, 1: this
    host)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
