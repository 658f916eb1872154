"""``tools/failover_demo.py`` on bare namespaces: quick MRC-only runs, a spine link healed and the
receiver's NIC of the side channel's set-up plane lost for good, their JSON against its schema,
the data verified by SHA-256 and the fabric removed afterwards.

The roles run as ``python -m mrc.lab.bench.failover_roles`` with this checkout's mrc; the container
variant is tests/containers/test_failover_demo_containers.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
from fabric.fabric_helpers import REPO, needs_netns, unique_name

from mrc.lab.fabric.teardown import fabric_namespaces
from mrc.topology.model import topology_path


def _quick_mrc_demo(name: str, *extra: str) -> dict[str, Any]:
    """tools/failover_demo.py --quick, MRC only, on 2 planes named ``name``: its JSON,
    checked against the demo's schema, once it exited 0."""
    res = subprocess.run(
        [sys.executable, str(REPO / "tools" / "failover_demo.py"), "--quick", "--json"]
        + ["--name", name, "--planes", "2", "--plot", "", "--transports", "mrc", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout)
    schema = json.loads((REPO / "docs/schemas/failover_demo.schema.json").read_text())
    jsonschema.validate(out, schema)
    return out


@needs_netns
def test_quick_mrc_failover_between_namespaces() -> None:
    name = unique_name("fd")
    out = _quick_mrc_demo(name)
    assert out["fabric"]["host_image"] is None and out["fabric"]["engine"] is None
    assert set(out).isdisjoint({"tcp", "mptcp"})
    mrc = out["mrc"]
    assert mrc["ok"] and mrc["sha256_match"], mrc
    assert mrc["max_stall_ms"] >= 0 and mrc["goodput_during_bps"] > 0
    assert mrc["evs_assumed_bad"] >= 1  # the failed link's EVs were retired
    assert fabric_namespaces(name) == []
    assert not topology_path(name).exists()


@needs_netns
def test_mrc_finishes_when_the_receivers_nic_of_its_set_up_plane_never_comes_back() -> None:
    """Issue 37: the receiver's NIC in plane 1, the plane the side channel was set up over, goes
    down 1.5 s into the transfer and stays down. MRC finishes over plane 0, its data verified,
    and the JSON records the case (what failed, how, not healed, on the set-up's plane)."""
    name = unique_name("fd")
    out = _quick_mrc_demo(name, "--fail", "recv-nic", "--no-heal")
    (case,) = out["cases"]
    assert case["label"] == "recv-nic:down:never"
    assert case["link"] == ["h3", "p1l1"] and case["how"] == "down" and case["failed_plane"] == 1
    assert case["healed"] is False and case["heal_at_s"] is None and out["heal_at_s"] is None
    assert case["setup_plane"] == 1 and case["setup_on_failed_plane"] is True
    mrc = case["mrc"]
    assert mrc == out["mrc"]
    assert mrc["ok"] and mrc["finished"] and mrc["sha256_match"], mrc
    assert mrc["expected_to_finish"] is True
    assert mrc["goodput_during_bps"] > 0 and mrc["goodput_after_bps"] is None
    assert mrc["recovery_ms"] is not None
    side = mrc["side_channel"]
    assert side["setup_plane"] == side["setup_plane_receiver"] == 1, side  # as planned
    assert side["on_failed_plane"] is True
    assert side["data_lost_after_s"] is not None, side  # the data path saw plane 1 go
    assert fabric_namespaces(name) == []
    assert not topology_path(name).exists()
