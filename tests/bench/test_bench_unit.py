"""mrc-bench without a fabric: argument errors, workloads, the table and the aims."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrc.lab.bench.report import aims, table
from mrc.lab.bench.workloads import ideal_seconds, transfers

BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workloads", "bogus"], "unknown workload bogus"),
        (["--transports", "udp"], "unknown transport udp"),
        (["--size", "0"], "--size"),
        (["--hosts", "1"], "--hosts"),
        (["--loss", "2"], "--loss"),
        (["--fail-link", "p0l0"], "--fail-link"),
        (["--fail-link", "p9l0-p9s0", "--conditions", "link_down"], "no such nodes"),
        (["--payload", "9000"], "does not fit the MTU"),
        (["--nope"], "unrecognized arguments"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], needle: str) -> None:
    res = subprocess.run(
        [str(BIN / "mrc-bench"), *args], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrc-bench: error: "), res.stderr
    assert needle in lines[0]
    assert res.stdout == ""


def test_not_root_is_one_line_exit_1(monkeypatch, capsys) -> None:
    from mrc.lab.cli import bench

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert bench.main(["--quick"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "mrc-bench: error: needs root (network namespaces, veth links, tc); run it as root\n"
    )


def test_workload_transfers() -> None:
    assert len(transfers("alltoall", 4, 10, 99)) == 12
    assert {(t.src, t.dst) for t in transfers("ring", 4, 10, 99)} == {
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 0),
    }
    assert {(t.src, t.dst) for t in transfers("incast", 4, 10, 99)} == {(1, 0), (2, 0), (3, 0)}
    [p] = transfers("pair", 4, 10, 99)
    assert (p.src, p.dst, p.size) == (0, 3, 99)
    # incast 3 x 1 MiB into one host with 2 planes of 100 Mbit/s: 3 MiB / 200 Mbit/s
    assert ideal_seconds(transfers("incast", 4, 1 << 20, 0), 2, 100_000_000) == pytest.approx(
        3 * (1 << 20) * 8 / 200e6
    )
    assert ideal_seconds(transfers("incast", 4, 1, 0), 2, None) is None


def _row(w: str, c: str, t: str, p100: float, failed: int = 0, **extra) -> dict:
    return {
        "workload": w,
        "condition": c,
        "transport": t,
        "p50_ms": p100,
        "p99_ms": p100,
        "p100_ms": p100,
        "goodput_bps": 1e6,
        "steps": 3,
        "failed_steps": failed,
        "bytes_verified": 3,
        "bytes_expected": 3,
        "sha256_ok": True,
        "step_ms": [p100] * 3,
        **extra,
    }


def test_aims_and_table() -> None:
    rows = [
        _row("alltoall", "clean", "mrc", 100.0),
        _row("alltoall", "clean", "tcp", 300.0),
        _row("alltoall", "clean", "mptcp", 200.0),
        _row("alltoall", "link_down", "mrc", 160.0),
        _row(
            "alltoall",
            "link_down",
            "tcp",
            2500.0,
            fault={"stalled_until_heal": True, "outage_ms": 2000.0},
        ),
        _row("incast", "trim", "mrc", 110.0, ideal_ms=100.0),
    ]
    assert [a["pass"] for a in aims(rows)] == [True, False, True, True]  # 160 > 1.5 x 100
    md = table(
        {
            "results": rows,
            "aims": aims(rows),
            "skipped": [{"condition": "lossy", "reason": "no ip6tables"}],
        }
    )
    assert md.count("| alltoall |") == 5
    assert "**2500.0**" in md and "NOT met" in md and "`lossy` skipped: no ip6tables" in md
