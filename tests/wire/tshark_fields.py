"""Run tshark on a capture and read chosen fields back, per frame (shared by the wire tests)."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Sequence


def read_fields(
    tshark: str, pcap: str, fields: Sequence[str], *extra: str, timeout: float = 60
) -> list[dict[str, list[str]]]:
    """Per frame of ``pcap``: every occurrence of each of ``fields`` (``extra``: more tshark
    options, e.g. ``-X lua_script:...`` or ``-o ...``). Fails the test if tshark does."""
    cmd = [tshark, "-r", pcap, *extra, "-T", "fields"]
    cmd += ["-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=,"]
    for f in fields:
        cmd += ["-e", f]
    res = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    frames = []
    for line in res.stdout.decode().splitlines():
        cols = line.split("\t")
        frames.append({f: (v.split(",") if v else []) for f, v in zip(fields, cols, strict=True)})
    return frames


def wait_capturing(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Read tshark's stderr until it reports the capture started (or ``timeout`` seconds
    pass, or it exits); return what it said."""
    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    said = b""
    deadline = time.monotonic() + timeout
    try:
        while b"Capturing on" not in said:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                break
            if sel.select(left):
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                said += chunk
    finally:
        sel.close()
    return said.decode(errors="replace")
