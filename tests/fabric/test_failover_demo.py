"""``tools/failover_demo.py`` on bare namespaces: a quick MRC-only run, its JSON against its
schema, the data verified by SHA-256 and the fabric removed afterwards.

The roles run as ``python -m mrc.lab.bench.failover_roles`` with this checkout's mrc; the container
variant is tests/containers/test_failover_demo_containers.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema

from mrc.lab.fabric.teardown import fabric_namespaces
from mrc.topology.model import topology_path
from tests.fabric.fabric_helpers import REPO, needs_netns, unique_name


@needs_netns
def test_quick_mrc_failover_between_namespaces() -> None:
    name = unique_name("fd")
    res = subprocess.run(
        [sys.executable, str(REPO / "tools" / "failover_demo.py"), "--quick", "--json"]
        + ["--name", name, "--planes", "2", "--plot", "", "--transports", "mrc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    schema = json.loads((REPO / "docs/schemas/failover_demo.schema.json").read_text())
    jsonschema.validate(out, schema)
    assert out["fabric"]["host_image"] is None and out["fabric"]["engine"] is None
    assert set(out).isdisjoint({"tcp", "mptcp"})
    mrc = out["mrc"]
    assert mrc["ok"] and mrc["sha256_match"], mrc
    assert mrc["max_stall_ms"] >= 0 and mrc["goodput_during_bps"] > 0
    assert mrc["evs_assumed_bad"] >= 1  # the failed link's EVs were retired
    assert fabric_namespaces(name) == []
    assert not topology_path(name).exists()
