"""tools/sim_scale.py: one step of a workload on H simulated hosts, timed; every QP
completes, the JSON says so, and sizes the simulator cannot hold are skipped with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_scale.py"


def _run(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--json", "--size", "65536", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_every_qp_of_a_step_completes_and_is_counted() -> None:
    out = _run("--hosts", "4,20", "--workload", "ring", "--evs", "4")
    rows = out["results"]
    assert isinstance(rows, list) and [r["hosts"] for r in rows] == [4, 20]
    for r in rows:
        assert r["complete"] is True and r["qps"] == r["hosts"]
        assert r["packets"] >= r["qps"] * 8  # 64 KiB in 8 KiB packets each
        assert r["events"] > r["packets"] and r["simulated_s"] > 0
    a2a = _run("--hosts", "5", "--workload", "alltoall", "--evs", "4")["results"]
    assert isinstance(a2a, list) and a2a[0]["qps"] == 20 and a2a[0]["complete"] is True


def test_sizes_beyond_the_simulator_are_skipped_with_the_reason() -> None:
    rows = _run("--hosts", "3000", "--workload", "ring", "--evs", "16")["results"]
    assert isinstance(rows, list)
    # 16 EVs over 4 planes x 4 spines: a source port each (one per route of the QP)
    assert rows[0]["qps"] == 3000 and "96000 source ports" in str(rows[0]["skipped"])
    rows = _run("--hosts", "200", "--workload", "alltoall", "--max-qps", "1000")["results"]
    assert isinstance(rows, list) and rows[0]["skipped"] == "more than 1000 QPs"


def test_a_qp_takes_a_port_per_route_and_plane_not_per_ev() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sim_scale", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    ports = {
        (fabric, evs): tool.ports_per_qp(
            tool.parser().parse_args(["--fabric", fabric, "--evs", str(evs)])
        )
        for fabric in ("srv6", "ecmp")
        for evs in (4, 16, 128)
    }
    # 4 planes x 4 spines: 16 routes, fewer if the EVs do not reach them all (4 active EVs
    # and their 4 backups, one a plane, reach 8); with ECMP a route per plane, its EVs told
    # apart by flow label
    assert ports == {
        ("srv6", 4): 8,
        ("srv6", 16): 16,
        ("srv6", 128): 16,
        ("ecmp", 4): 4,
        ("ecmp", 16): 4,
        ("ecmp", 128): 4,
    }
    alone = tool.parser().parse_args(["--evs", "4", "--backups", "0"])
    assert tool.ports_per_qp(alone) == 4
