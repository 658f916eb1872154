"""tools/sim_cc.py: window laws side by side in the simulator. A quick run of two scenarios
gives the JSON it documents, with every byte in place and numbers that can be true (no incast
finishes faster than its last hop allows); a bad law is a one-line usage error."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_cc.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120
    )


def test_quick_json_of_incast_and_fairness_for_nscc() -> None:
    out = _run("--quick", "--json", "--cc", "nscc", "--scenarios", "incast7,fair2")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning: every QP finished with its bytes in place
    doc: dict[str, Any] = json.loads(out.stdout)
    assert {"window", "qp", "seed", "quick", "scenarios", "laws", "version"} <= doc.keys()
    assert doc["quick"] is True and doc["scenarios"] == ["incast7", "fair2"]
    assert list(doc["laws"]) == ["nscc"]
    runs = doc["laws"]["nscc"]
    assert list(runs) == ["incast7", "fair2"]
    for run in runs.values():
        assert {"metrics", "raw", "corrupt", "wall_s"} <= run.keys()
        assert run["metrics"]["data_ok"] is True and run["corrupt"] == 0
        assert run["raw"]["qps_failed"] == 0 and run["raw"]["failure"] == ""
        assert 0 < run["metrics"]["jain"] <= 1
    incast = runs["incast7"]
    m, raw = incast["metrics"], incast["raw"]
    assert set(m) == {"p100_over_ideal", "trims_per_packet", "timeouts", "jain", "data_ok"}
    # P100 cannot beat total bytes / last-hop capacity (headers take room too)
    assert math.isfinite(m["p100_over_ideal"]) and m["p100_over_ideal"] >= 1.0
    assert m["p100_over_ideal"] < 3  # measured 1.17
    assert len(raw["flow_done_s"]) == len(raw["flow_goodput_Bps"]) == 7
    assert max(raw["flow_done_s"]) == raw["p100_s"] >= raw["ideal_s"] > 0
    assert m["trims_per_packet"] == raw["trimmed"] / (7 * 512 * 1024 // 8192)
    fair = runs["fair2"]
    assert set(fair["metrics"]) == {"jain", "utilization", "timeouts", "data_ok"}
    assert 0.5 < fair["metrics"]["utilization"] <= 1.0
    assert len(fair["raw"]["flow_goodput_Bps"]) == 2
    assert all(n > 0 for n in fair["raw"]["writes_checked"])  # completed writes were hashed


def test_a_bad_law_is_one_line_exit_2() -> None:
    out = _run("--quick", "--cc", "nscc,nosuchlaw")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "nosuchlaw" in out.stderr, out.stderr
    assert out.stderr.startswith("sim_cc.py: error: ")
