"""``tools/bench_share.py`` for real: two timed NSCC senders into one host on a trimming fabric,
its JSON checked key by key, every byte verified and the fabric removed afterwards.

What the figures are (fairness, utilization) is test_fairness.py's to assert; here only that the
tool measures them and says so: a Jain index in (0, 1], some utilization, digests verified.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fabric.fabric_helpers import REPO, SKIP_REASON, unique_name

from mrc.lab.fabric.teardown import fabric_namespaces
from mrc.topology.model import topology_path

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
]

RESULT_KEYS = {
    "cc",
    "senders",
    "window",
    "jain",
    "utilization",
    "utilization_span",
    "overlap",
    "payload_ceiling",
    "goodput_bps",
    "timeouts",
    "retransmits",
    "fabric_trims",
    "fabric_trims_lasthop",
    "fabric_drops",
    "sha256_ok",
    "runs",
}
RUN_KEYS = RESULT_KEYS - {"runs"} | {
    "run",
    "goodputs_bps",
    "span_seconds",
    "drops_at",
    "mismatches",
    "per_sender",
}


def _trim_unavailable() -> str | None:
    if SKIP_REASON is not None:
        return SKIP_REASON
    from mrc.lab.fabric.trim import unavailable_reason

    return unavailable_reason()


def test_bench_share_two_senders_json() -> None:
    why = _trim_unavailable()
    if why is not None:
        pytest.skip(f"trimming unavailable here: {why}")
    name = unique_name("s")
    tool = [sys.executable, str(REPO / "tools" / "bench_share.py"), "--name", name]
    res = subprocess.run(
        [*tool, "--senders", "2", "--cc", "nscc", "--time", "2", "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(res.stderr)  # the table (pytest -s)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["tool"] == "bench_share" and out["version"]
    assert out["machine"]["cpus"] >= 1
    assert out["sha256_ok"] is True
    cfg = out["config"]
    assert cfg["senders"] == [2] and cfg["cc"] == ["nscc"] and cfg["time"] == 2
    assert cfg["receiver"] == "h2" and cfg["planes"] == 4 and cfg["trim"] is True
    assert cfg["capacity_bps"] == 4 * 100_000_000
    (r,) = out["results"]
    assert r.keys() >= RESULT_KEYS, RESULT_KEYS - r.keys()
    assert r["cc"] == "nscc" and r["senders"] == 2 and r["sha256_ok"] is True
    assert 0 < r["jain"] <= 1
    assert r["utilization"] > 0 and 0 < r["utilization_span"] <= 1.05
    assert 0 < r["payload_ceiling"] < 1
    (run,) = r["runs"]
    assert run.keys() >= RUN_KEYS, RUN_KEYS - run.keys()
    assert run["mismatches"] == [] and len(run["goodputs_bps"]) == 2
    assert sorted(run["per_sender"]) == ["h0", "h1"]
    for h, s in run["per_sender"].items():
        assert s["ok"] is True, (h, s.get("error"))
        assert s["digest"] == s["digest_receiver"] == s["receiver_digest"], h
        assert s["sha256_ok"] is True and s["bytes"] == s["receiver_bytes"] > 0, h
        assert s["seconds"] >= 2 * 0.9, (h, s["seconds"])
    assert sum(run["goodputs_bps"]) == pytest.approx(r["goodput_bps"], abs=2)
    # the fabric, its namespaces and its topology file are gone
    assert fabric_namespaces(name) == []
    assert not topology_path(name).exists()
