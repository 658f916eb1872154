"""Run tshark on a capture and read chosen fields back, per frame (shared by the wire tests)."""

from __future__ import annotations

import subprocess
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
