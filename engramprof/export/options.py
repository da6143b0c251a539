"""The export command's values, checked before anything is loaded (bad input: one line, exit 2)."""
from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass

from engramprof.errors import UserError
from engramprof.validate import bad_number

#: label names the exporter's own metrics use: a --label may not take them
RESERVED_LABELS = ("file", "kind", "cause", "verdict", "le", "what", "result", "quantile")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"


def parse_listen(text: str, allow_remote: bool) -> Listen:
    host, sep, port_s = text.rpartition(":")
    if not sep or not host:
        raise UserError(f"--listen {text}: expected HOST:PORT (for example 127.0.0.1:9435)", code=2)
    host = host.strip("[]")
    try:
        port = int(port_s)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise UserError(f"--listen {text}: the port must be 1-65535", code=2)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UserError(f"--listen {text}: HOST must be an IP address or localhost", code=2) from None
        addr = ipaddress.ip_address("127.0.0.1")
        host = "127.0.0.1"
    if not addr.is_loopback and not allow_remote:
        raise UserError(f"--listen {text}: not a loopback address; the metrics reveal file paths, so serving them "
                        "beyond this host needs --allow-remote", code=2)
    return Listen(host, port)


def parse_labels(items) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not _LABEL_NAME.match(name) or name.startswith("__") or not value:
            raise UserError(f"--label {item}: expected NAME=VALUE with NAME a Prometheus label name "
                            "([a-zA-Z_][a-zA-Z0-9_]*, not starting with __) and VALUE not empty", code=2)
        if name in RESERVED_LABELS:
            raise UserError(f"--label {item}: {name!r} is one of the exporter's own labels "
                            f"({', '.join(RESERVED_LABELS)})", code=2)
        if name in out:
            raise UserError(f"--label {item}: {name} given twice", code=2)
        out[name] = value
    return out


def check_window(window: float) -> float:
    if not (isinstance(window, (int, float)) and math.isfinite(window) and window >= 1):
        raise bad_number("--window", "a number of seconds >= 1", window)
    return float(window)


def check_markers(path: str | None) -> str | None:
    """A markers file may not exist yet (the server writes it later); a directory is refused."""
    if path is not None and os.path.isdir(path):
        raise UserError(f"--markers {path}: a directory, not a file", code=2)
    return path

