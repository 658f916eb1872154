"""tools/sim_alltoall.py: the simulator's all-to-all with a failed spine link runs, finishes
every step and gives the same line for the same arguments (it is seeded)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_alltoall.py"
ARGS = ["--steps", "3", "--size", "262144", "--fail-at", "0.02"]


def _run(*extra: str) -> str:
    out = subprocess.run(
        [sys.executable, str(TOOL), *ARGS, *extra], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_every_step_finishes_and_a_seed_gives_the_same_line() -> None:
    line = _run("--cc", "fixed", "--window", "4")
    m = re.search(r"steps\(ms\) ((?:\d+ ?){3}) timeouts (\d+) tlp (\d+) retransmits (\d+)", line)
    assert m is not None, line
    assert all(int(t) > 0 for t in m.group(1).split())
    assert int(m.group(4)) > 0  # the failed link cost retransmissions
    assert _run("--cc", "fixed", "--window", "4") == line


def test_a_bad_qp_field_is_one_line_exit_2() -> None:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--qp", "cc.gain=x"], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1


def _tool() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sim_alltoall", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_tool(*argv: str) -> dict[str, Any]:
    """The tool's result (JSON-like, so each value is read as what the test knows it is)."""
    tool = _tool()
    # (calibrated on the law that was the default then: route fate and the target of its own
    # packets were measured with it; UET's NSCC, the default now, is in tools/sim_cc.py)
    args = ["--size", "524288", "--steps", "4", "--cc", "nscc-mrc", *argv]
    result: dict[str, Any] = tool.run(tool.parser().parse_args(args))
    return result


def test_a_dead_route_takes_its_evs_out_together() -> None:
    """A spine link of plane 0 dies at 0.1 s. With route fate (route_dead_evs=2, the default)
    the route's other EVs leave the rotation once two of them lost packets; without it every
    one of them must lose a packet first, each loss a tail probe or an RTO."""
    shared = _run_tool("--fail-at", "0.1")
    alone = _run_tool("--fail-at", "0.1", "--qp", "route_dead_evs=0")
    assert shared["route_down_transitions"] > 0 and alone["route_down_transitions"] == 0
    # measured: worst step 219 vs 375 ms, tail probes 38 vs 365; timeouts 0 and 0 since the
    # ACK of a tail loss probe goes twice (P), 2 vs 39 before. (With the spine picked by a
    # hash of the EV, before the simulator pinned EVs to SRv6 routes: 200 vs 324 ms, 31 vs 249)
    # Since held and late losses ask their routes (docs/EV_HEALTH.md, "asked"): 251 vs 354 ms
    # on this seed, whose worst step moved 225 -> 251; over seeds 1-8 its median 231 against
    # 228 without asking
    assert max(shared["steps_ms"]) < 0.75 * max(alone["steps_ms"])
    assert shared["timeouts"] <= alone["timeouts"]
    assert shared["tlp"] * 2 < alone["tlp"]


def test_no_failure_takes_no_route_down() -> None:
    quiet = _run_tool("--fail-at", "99")
    assert quiet["route_down_transitions"] == 0
    # a tail drop in the simulator's 120 kB queues is a real loss, but one after the delay
    # rose is not held against its EV: 0 here (3 before delay evidence, all proved false)
    assert quiet["evs_assumed_bad"] <= 2 and quiet["timeouts"] == 0
    assert quiet["evs_assumed_bad_false"] == quiet["evs_assumed_bad"]  # nothing failed


def test_the_target_of_two_own_packets_keeps_the_slow_links_busy() -> None:
    """At 100 Mbit/s an 8 KiB packet takes 0.66 ms on a link and three flows share each
    receiver's last hop: a 0.5 ms target alone holds every window at about a packet
    (measured: steps of 126-187 ms against 84-94 with cc.target_packets=2; off by default, as
    it did not help on the netns fabric)."""
    new = _run_tool("--fail-at", "99", "--qp", "cc.target_packets=2")
    old = _run_tool("--fail-at", "99")
    assert max(new["steps_ms"]) < 0.7 * max(old["steps_ms"])
    assert new["timeouts"] == 0 and new["evs_assumed_bad"] <= 2
    assert new["evs_assumed_bad_false"] == new["evs_assumed_bad"]
