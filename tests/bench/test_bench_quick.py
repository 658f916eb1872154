"""mrc-bench --quick on a real fabric: every workload over every transport, verified intact.

Runs the command as CI would (a subprocess, JSON on stdout) and checks the JSON proves that
every transfer of every clean step completed and its SHA-256 matched at the receiver (and, for
the other conditions, that every step either failed or moved its bytes intact), then that the
run left no fabric and no agent behind. Needs root (namespaces); about 25 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from mrc.lab.bench.common import TRANSPORTS, WORKLOADS

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)


def _expected_per_step(workload: str, hosts: int, size: int, pair_size: int) -> int:
    """Bytes one step moves, computed here from the workload definitions (not the tool's)."""
    return {
        "alltoall": hosts * (hosts - 1) * size,
        "ring": hosts * size,
        "incast": (hosts - 1) * size,
        "pair": pair_size,
    }[workload]


def _leftovers(pid: int) -> tuple[list[str], list[str]]:
    """Namespaces and agent processes of the run with coordinator ``pid`` still around."""
    prefix = f"mrc-mb{pid}_"
    try:
        ns = [n for n in os.listdir("/run/netns") if n.startswith(prefix)]
    except FileNotFoundError:
        ns = []
    procs = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "mrc.lab.bench.agent" in cmd and f"mb{pid}_" in cmd:
            procs.append(f"{d.name}: {cmd}")
    return ns, procs


@pytest.mark.skipif(os.geteuid() != 0, reason="mrc-bench needs root (network namespaces)")
def test_quick_run_every_workload_and_transport_verified(tmp_path: Path) -> None:
    table = tmp_path / "table.md"
    plots = tmp_path / "plots"
    argv = [
        str(BIN / "mrc-bench"),
        "--quick",
        "--json",
        "--table",
        str(table),
        "--plots",
        str(plots),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"mrc-bench --quick did not finish in 120 s; stderr: {err[-3000:]}")
    took = time.monotonic() - t0
    assert proc.returncode == 0, f"exit {proc.returncode}; stderr: {err[-3000:]}"
    assert took < 60, f"--quick took {took:.1f} s"
    doc = json.loads(out)  # one JSON object, nothing else on stdout
    schema = json.loads((REPO / "docs" / "schemas" / "mrc-bench.schema.json").read_text())
    jsonschema.validate(doc, schema)  # key for key what docs/schemas/ says

    cfg = doc["config"]
    assert doc["machine"]["cpus"] >= 1
    hosts, size, pair_size, steps = cfg["hosts"], cfg["size"], cfg["pair_size"], cfg["steps"]
    rows = {(r["workload"], r["condition"], r["transport"]): r for r in doc["results"]}
    assert len(rows) == len(doc["results"]), "duplicate rows"
    for workload in WORKLOADS:
        for transport in TRANSPORTS:
            r = rows.get((workload, "clean", transport))
            assert r is not None, f"no row for {workload}/{transport}: {sorted(rows)}"
            what = f"{workload}/{transport}"
            expected = steps * _expected_per_step(workload, hosts, size, pair_size)
            assert r["steps"] == steps == len(r["step_ms"]), what
            assert r["failed_steps"] == 0, f"{what}: {r['errors']}"
            assert r["bytes_expected"] == expected, what
            assert r["bytes_verified"] == expected, f"{what}: {r['errors']}"
            assert r["sha256_ok"] is True, what
            assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p100_ms"], what
            assert r["p100_ms"] == max(r["step_ms"]), what
            assert r["goodput_bps"] > 0, what
    # the other conditions --quick runs (those this machine can run): every step either
    # failed or moved exactly its bytes intact; and the link failure really happened
    for (workload, condition, transport), r in rows.items():
        if condition == "clean":
            continue
        what = f"{workload}/{condition}/{transport}"
        per_step = _expected_per_step(workload, hosts, size, pair_size)
        assert r["steps"] == len(r["step_ms"]) >= steps, what
        assert r["bytes_expected"] == r["steps"] * per_step, what
        assert r["bytes_verified"] == (r["steps"] - r["failed_steps"]) * per_step, what
        assert r["sha256_ok"] is (r["failed_steps"] == 0), what
        if condition == "link_down":
            f = r["fault"]
            assert f["outage_ms"] >= cfg["outage"] * 1e3 * 0.9, f"{what}: {f}"
            assert f["up_s"] > f["down_s"], what
    assert set(cfg["conditions"]) == {c for _, c, _ in rows} | {
        s["condition"] for s in doc["skipped"]
    }
    text = table.read_text()
    assert text.startswith("| workload |") and text.count("\n|") >= len(rows)
    # three steps judge no aim: each says so, none is "NOT met"
    assert [a["pass"] for a in doc["aims"]] == [None] * len(doc["aims"])
    assert "NOT met" not in text and "not judged (--quick: too short)" in text
    assert any("process_cpu_ms" in (r.get("transport_stats") or {}) for r in doc["results"])
    for r in doc["results"]:  # no more EV retirements judged false than made, unexplained
        st = r.get("transport_stats") or {}
        # the hosts' processes did work over the series: their CPU is there, and below what
        # the machine's cores give over the series' wall time
        if st:
            wall_ms = sum(r["step_ms"])
            assert 0 < st["process_cpu_ms"] <= (os.cpu_count() or 1) * wall_ms + 1000, r
        if (st.get("evs_assumed_bad_false") or 0) > (st.get("evs_assumed_bad") or 0):
            assert "retired before this series" in text
    # "done in X s" is the time when it is said, as its line's stamp shows
    (done,) = [line for line in err.splitlines() if "] done in " in line]
    stamp, said = (float(x) for x in re.findall(r"\[\s*([\d.]+)s\] done in ([\d.]+) s", done)[0])
    assert abs(stamp - said) < 1.0 and said <= took + 1, done
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert "steps-alltoall-clean.png" in pngs and "cdf-alltoall-clean.png" in pngs, pngs

    ns, procs = _leftovers(proc.pid)
    assert ns == [] and procs == [], f"left behind: {ns} {procs}"
