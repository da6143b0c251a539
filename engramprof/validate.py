"""Checks of command-line numbers, worded with the flag the user typed (one place, so every
command rejects a bad number the same way: ``UserError`` with code 2, one line naming the flag,
in one wording: ``--duration must be a number > 0, got 'x'``; see :func:`bad_number`, which
the CLI also uses for a value that does not parse as a number at all).

Every check lets ``None`` (an optional flag not given) through.  Floats must be finite
(``nan`` and ``inf`` parse as floats but mean nothing here: "no limit" is spelled by leaving
the flag out)."""
from __future__ import annotations

import math

from engramprof.errors import UserError

#: longest --duration any command accepts (leave --duration out to run until Ctrl-C)
MAX_DURATION_S = 10 * 365 * 86400  # 10 years: what `lab scenario --keep-running` passes its reader
#: the samplers' highest rate (engramprof.sampling.sampler.Sampler refuses more)
MAX_SAMPLE_HZ = 1000.0
#: the most pool threads a reader may start
MAX_THREADS = 4096
#: thread ids: the kernel's pid_max limit (2^22)
MAX_PID = 1 << 22


def shown(value) -> str:
    """A number as the user would have typed it: 3 (not 3.0), 0.5, nan, inf, 1e+10."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if not isinstance(value, float) else f"{value:g}" if abs(value) >= 1e15 else repr(value)


def bad_number(flag: str, what: str, value) -> UserError:
    """The one wording of a bad number: ``FLAG must be WHAT, got 'VALUE'`` (exit 2)."""
    return UserError(f"{flag} must be {what}, got '{value if isinstance(value, str) else shown(value)}'")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(flag: str, value: float | None) -> None:
    """Any finite number (not nan, not +-inf)."""
    if value is not None and not (_is_number(value) and math.isfinite(value)):
        raise bad_number(flag, "a number", value)


def positive(flag: str, value: float | None) -> None:
    """A finite number > 0."""
    if value is not None and not (_is_number(value) and math.isfinite(value) and value > 0):
        raise bad_number(flag, "a number > 0", value)


def non_negative(flag: str, value: float | None) -> None:
    """A finite number >= 0."""
    if value is not None and not (_is_number(value) and math.isfinite(value) and value >= 0):
        raise bad_number(flag, "a number >= 0", value)


def in_range(flag: str, value: float | None, lo: float, hi: float, *, lo_open: bool = False,
             hi_open: bool = False, what: str = "") -> None:
    """A finite number in [lo, hi] (``lo_open`` / ``hi_open``: that end excluded)."""
    if value is None:
        return
    ok = _is_number(value) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise bad_number(flag, f"a number in {interval}{what}", value)


def at_least(flag: str, value: int | None, lo: int, hi: int | None = None) -> None:
    """An integer >= lo (and <= hi, when given)."""
    if value is None:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_number(flag, f"an integer {bound}", value)


def share(flag: str, value: float | None) -> None:
    """A share of time in (0, 1]."""
    in_range(flag, value, 0.0, 1.0, lo_open=True)


def fraction(flag: str, value: float | None) -> None:
    """A fraction in [0, 1]."""
    in_range(flag, value, 0.0, 1.0)


def duration(flag: str, value: float | None) -> None:
    """Seconds: finite, > 0 and at most :data:`MAX_DURATION_S` (no --duration: no limit)."""
    if value is None:
        return
    positive(flag, value)
    if value > MAX_DURATION_S:
        raise bad_number(flag, f"a number of seconds <= {MAX_DURATION_S} (10 years; leave it out to run until "
                               "Ctrl-C)", value)


def sample_hz(flag: str, value: float | None, *, zero_is_off: bool = False) -> None:
    """A sampling rate in (0, MAX_SAMPLE_HZ] (``zero_is_off``: 0 too, meaning no sampling)."""
    if zero_is_off and value == 0:
        return
    in_range(flag, value, 0.0, MAX_SAMPLE_HZ, lo_open=True, what=" Hz" + (" (0: off)" if zero_is_off else ""))


def pid(flag: str, value: int | None) -> None:
    """A process id: >= 1 (whether it exists is :func:`live_process`)."""
    at_least(flag, value, 1)


def threads(flag: str, value: int | None) -> None:
    """A pool size: 1 .. MAX_THREADS."""
    at_least(flag, value, 1, MAX_THREADS)


def seed(flag: str, value: int | None) -> None:
    """A random seed (NumPy takes non-negative integers)."""
    at_least(flag, value, 0)


def live_process(flag: str, value: int | None) -> None:
    """A process that exists and has not exited, in the same words in every command: "no
    process with pid N", or "pid N (comm) has already exited (zombie)" (a process that has
    exited and whose parent has not collected it yet)."""
    if value is None:
        return
    pid(flag, value)
    try:
        with open(f"/proc/{value}/stat", "rb") as f:
            data = f.read()
    except OSError:
        raise UserError(f"no process with pid {value}") from None
    try:
        comm = data[data.index(b"(") + 1:data.rindex(b")")].decode(errors="replace")
        state = data[data.rindex(b")") + 2:][:1].decode()
    except ValueError:
        return
    if state in ("Z", "X"):
        raise UserError(f"pid {value} ({comm}) has already exited (zombie)")


def existing_file(flag: str | None, path) -> None:
    """An existing regular file (to read): a missing path, a directory and a special file
    each get their own words.  ``flag`` None: an argument, named by its path only."""
    import os
    import stat

    if path is None:
        return
    where = f"{flag} {path}" if flag else f"{path}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file") from None
    except OSError as exc:
        raise UserError(f"{where}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{where}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{where}: not a regular file")


def new_or_regular_file(flag: str, path) -> None:
    """A file to write: refused when it is a symbolic link (never written through), a
    directory or a special file, or when its directory does not exist."""
    import os
    import stat

    if path is None:
        return
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        d = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(d):
            raise UserError(f"{flag} {p}: directory {d} does not exist") from None
        return
    except OSError as exc:
        raise UserError(f"{flag} {p}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"{flag} {p}: is a symbolic link; engramprof does not write through symlinks "
                        "(give the real path)")
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {p}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{flag} {p}: not a regular file")
