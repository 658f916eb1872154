"""The README's main demo (tools/demo.py, which tools/demo.sh runs after set-up) must work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mrc.lab.testbed import netns_available

DEMO = Path(__file__).resolve().parent.parent / "tools" / "demo.py"


@pytest.mark.netns
def test_demo_transfers_over_two_planes_and_verifies() -> None:
    why = netns_available()
    if why is not None:
        pytest.skip(why)
    res = subprocess.run(
        [sys.executable, str(DEMO), "--size", "16M"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "-> MATCH" in out
    m = re.search(r"spraying\s+(\d+) of (\d+) EVs carried traffic", out)
    assert m and m.group(1) == m.group(2) == "128", out
    planes = re.findall(r"plane (\d)\s+(\d+) packets from our counters, (\d+) bytes received", out)
    assert [p for p, _, _ in planes] == ["0", "1"], out
    for _, ours, kernel in planes:
        # the kernel saw at least the payload of what we sent on each plane (8 KiB packets;
        # the last one of the transfer may be short)
        assert int(kernel) >= (int(ours) - 1) * 8192 and int(ours) > 0, out
