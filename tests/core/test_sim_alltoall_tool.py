"""tools/sim_alltoall.py: the simulator's all-to-all with a failed spine link runs, finishes
every step and gives the same line for the same arguments (it is seeded)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
        [sys.executable, str(TOOL), "--qp", "cc_gain=x"], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1
