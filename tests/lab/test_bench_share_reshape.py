"""``tools/bench_share.py --no-trim --reshape --fail-at`` for real, kept small: two senders
into one host on a 2-plane fabric without trimming, the receiver's links reshaped from 200 to
50 Mbit/s behind the tools' back, a spine link into its leaf set down mid-run.

Asserted: the kernel holds the new rate on the receiver's leaf ports (read back), the last hop's
own counters never carried more than that (the senders were told 4 x more), every byte arrived
(digests), the dead route's EVs were retired, and the fabric is gone afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrc.lab.testbed import netns_available

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_share.py"

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_reshaped_last_hop_and_a_dying_link() -> None:
    why = netns_available()
    if why is not None:
        pytest.skip(why)
    from mrc.lab.fabric.teardown import fabric_namespaces

    name = f"t{os.getpid()}b0"  # as tests/fabric's names: swept if this process dies
    argv = ["--name", name, "--senders", "2", "--planes", "2", "--spines", "2", "--size", "8M"]
    argv += ["--rate", "200mbit", "--no-trim", "--reshape", "50mbit", "--fail-at", "0.5"]
    try:
        res = subprocess.run(
            [sys.executable, str(TOOL), *argv, "--json", "--quiet"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        leftover = fabric_namespaces(name)
    print(res.stderr)  # the table (pytest -s)
    assert res.returncode == 0, res.stderr[-3000:]
    assert leftover == []
    out = json.loads(res.stdout)
    cfg = out["config"]
    assert cfg["trim"] is False and cfg["reshape_bps"] == 50_000_000
    assert cfg["capacity_bps"] == 2 * 50_000_000 and cfg["rate_bps"] == 200_000_000
    # the kernel's own tbf on the leaf's ports into h2: 50 Mbit/s, 9 ms of it
    assert sorted(q["port"] for q in cfg["reshaped"]) == ["p0l2:h2", "p1l2:h2"]
    for q in cfg["reshaped"]:
        assert q["rate_bps"] == 50_000_000 and q["limit_bytes"] == 56_250, q
    assert out["sha256_ok"] is True
    (r,) = out["results"]
    (run,) = r["runs"]
    # the receiver's NICs' own counters: every byte came over them, never faster than the new
    # rate (tbf's burst and the sampling allow a little over), far below the 400 told
    assert run["lasthop_bytes"] >= 2 * (8 << 20)
    assert 0 < run["lasthop_peak_bps"] <= 1.15 * 100_000_000
    assert run["fabric_trims"] == 0 and run["utilization"] > 0
    for h, s in run["per_sender"].items():
        assert s["digest"] == s["digest_receiver"] == s["receiver_digest"], h
        assert s["bytes"] == s["receiver_bytes"] == 8 << 20, h
        assert s["evs_assumed_bad"] is not None and s["ev_losses_delayed"] is not None, h
    # the link died once the data flowed, and its route's EVs were retired
    assert run["fail_link"] == "p0s0-p0l2" and run["fail_at_s"] is not None
    assert run["fail_evs_retired"] > 0 and run["fail_retire_first_s"] is not None
    assert run["max_stall_s"] is not None
    assert run["retired_reasons"] and sum(run["retired_reasons"].values()) >= 1
