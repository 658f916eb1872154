"""What mrc-send and mrc-recv share: argument parsing, one-line errors, progress, output."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Coroutine
from typing import Any, NoReturn

from mrc.wire import DEFAULT_PORT

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
}


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


class Failure(Exception):
    """The transfer failed: reported as one line, exit status 1."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (argparse prints usage + message)."""

    def error(self, message: str) -> NoReturn:
        die(self.prog, f"{message} (see {self.prog} --help)", 2)


def parse_size(text: str) -> int:
    """'64M' -> 64 MiB. K/M/G are binary (as dd and most transfer tools read them); KB/MB/GB
    are decimal; KiB/MiB/GiB are binary."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 64M, 1G, 1500)")
    unit = m.group(2).lower()
    if unit in ("k", "m", "g"):
        unit += "i"
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"unknown size unit in {text!r} (use K, M, G)")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_endpoint(text: str, default_host: str = "::") -> tuple[str, int]:
    """'[::1]:4791', '::1', 'host:4791', 'host', ':4791' -> (host, port)."""
    text = text.strip()
    port: int | None = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise argparse.ArgumentTypeError(f"missing ']' in {text!r}")
        if rest:
            if not rest.startswith(":"):
                raise argparse.ArgumentTypeError(f"expected ':PORT' after ']' in {text!r}")
            port = _port(rest[1:], text)
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = _port(p, text)
    else:
        host = text
    return (host or default_host, DEFAULT_PORT if port is None else port)


def endpoint_arg(text: str) -> str:
    """argparse type for HOST[:PORT]: checked while parsing (bad usage), split later."""
    parse_endpoint(text)
    return text


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"bad port in {whole!r}")
    return int(text)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def die(prog: str, message: str, status: int) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def emit_json(obj: dict[str, object]) -> None:
    print(json.dumps(obj, sort_keys=False), flush=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} bit/s"


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self._last = 0.0

    def update(self, done: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = done * 8 / max(now - self.start, 1e-9)
        sys.stderr.write(
            f"\r{self.label} [{bar}] {frac * 100:5.1f}% {human_bytes(done)} {human_rate(rate)}  "
        )
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run_command(prog: str, main: Coroutine[Any, Any, int]) -> int:
    """Run a command's coroutine on the fast loop; failures become one line, not a traceback.

    Exit status: what ``main`` returns; 1 for a failed transfer; 130 on Ctrl-C.
    """
    from mrc.connection import MRCError
    from mrc.transport.loop import run

    try:
        return run(main)
    except (Failure, MRCError) as exc:
        die(prog, str(exc), 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
