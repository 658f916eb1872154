"""``tools/failover_demo.py --host-image``: the failover demo between real host containers.

A quick MRC and MPTCP run on a 2-plane fabric whose hosts are containers of the image built
from this tree: the roles run inside them as the image's user (``python -m
mrc.lab.bench.failover_roles``), data and result files go through the fabric's shared directory and
MPTCP's path manager is set up from outside. What arrived must hash like what was sent, the
stall figure must be there, and the demo must leave no container, namespace or shared
directory behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
from fabric.fabric_helpers import unique_name

from mrc.lab.fabric.containers import labelled, share_dir
from mrc.lab.fabric.teardown import fabric_namespaces

ROOT = Path(__file__).resolve().parents[2]


def test_failover_demo_between_host_containers(mrc_image: str) -> None:
    name = unique_name("fo")
    res = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "failover_demo.py"), "--quick", "--json"]
        + ["--host-image", mrc_image, "--name", name, "--planes", "2", "--plot", ""]
        + ["--transports", "mrc,mptcp"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    schema = json.loads((ROOT / "docs/schemas/failover_demo.schema.json").read_text())
    jsonschema.validate(out, schema)
    assert out["fabric"]["name"] == name
    assert out["fabric"]["host_image"] == mrc_image
    engine = out["fabric"]["engine"]
    assert engine in ("podman", "docker")
    for transport in ("mrc", "mptcp"):
        r = out[transport]
        assert r["ok"] and r["sha256_match"], (transport, r)
        assert r["bytes"] > 0
        assert isinstance(r["max_stall_ms"], float) and r["max_stall_ms"] >= 0
        assert r["goodput_before_bps"] > 0 and r["goodput_after_bps"] > 0
    # the sender's EV log came back through the shared directory: the failed link's EVs
    # were retired during the outage
    assert out["mrc"]["evs_assumed_bad"] >= 1
    assert out["mptcp"]["subflows"] == 1  # an extra one in plane 1: set up from outside
    assert labelled(engine, name) == []
    assert fabric_namespaces(name) == []
    assert not share_dir(name).exists()
