"""mrc-bench without a fabric: argument errors, workloads, the table and the aims."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

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


def test_not_root_is_one_line_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
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


def _row(w: str, c: str, t: str, p100: float, failed: int = 0, **extra: object) -> dict[str, Any]:
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


def test_a_quick_run_judges_no_aim() -> None:
    """--quick's three steps and 1 s outage are too few to call an aim met or not."""
    rows = [
        _row("alltoall", "clean", "mrc", 100.0),
        _row("alltoall", "clean", "tcp", 300.0),
        _row("alltoall", "link_down", "mrc", 160.0),
    ]
    judged = aims(rows, judged=False)
    assert [a["pass"] for a in judged] == [None] * 4
    assert judged[1]["measured"]["ratio"] == 1.6  # what was measured is still there
    md = table({"config": {"quick": True}, "results": rows, "aims": judged})
    assert "NOT met" not in md and "| met |" not in md
    assert md.count("| not judged (--quick: too short) |") == 4
    full = table({"config": {"quick": False}, "results": rows, "aims": aims(rows)})
    assert "| NOT met |" in full and "| not measured |" in full


@pytest.mark.parametrize(
    ("bad", "false", "note"),
    [
        (10, 3, "EVs bad 10 (3 false)"),
        (10, 0, "EVs bad 10"),
        (10, 13, "EVs bad 10, 13 judged false (3+ of them retired before this series)"),
        (0, 2, "EVs bad 0, 2 judged false (2+ of them retired before this series)"),
    ],
)
def test_ev_counts_add_up(bad: int, false: int, note: str) -> None:
    """A retirement is judged false when its probe answers, possibly in a later series than
    the one it was made in: the note never shows more false than bad without saying why."""
    row = _row(
        "alltoall",
        "clean",
        "mrc",
        100.0,
        transport_stats={"evs_assumed_bad": bad, "evs_assumed_bad_false": false},
    )
    md = table({"results": [row], "aims": []})
    assert f"| {note} |" in md, md


def test_setup_notes_print_no_python_reprs() -> None:
    from mrc.lab.bench.report import setup_note

    note = setup_note({"evs_per_qp": [128], "routes": ["p0s0", "p1s0"], "window": 64})
    assert note == "evs per qp 128, routes p0s0/p1s0, window 64"
    note = setup_note({"subflows": {"h0": {"1": 2, "2": None}, "h1": {"0": 2}}})
    assert note == "subflows h0:(1:2 2:-) h1:(0:2)"
    assert not any(c in note for c in "{}[]'")


def test_done_in_is_the_time_at_the_moment_it_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """mrc-bench prints "done in X s" after its table and plots: X counts them too."""
    from types import SimpleNamespace

    from mrc.lab.bench.coordinator import Bench
    from mrc.lab.cli import bench

    clock = [100.0]
    monkeypatch.setattr("mrc.lab.cli.bench.time.monotonic", lambda: clock[0])
    said: list[str] = []

    def progress(msg: str) -> None:
        said.append(msg)

    class Cfg:
        quick = True

    fake = SimpleNamespace(cfg=Cfg(), rows=[], skipped=[])
    monkeypatch.setattr("mrc.lab.bench.coordinator.config_dict", lambda cfg: {"quick": True})
    monkeypatch.setattr(
        "mrc.lab.harness.machine.machine_info", lambda load: {"cpus": 1, "load": list(load)}
    )

    def slow_table(doc: dict[str, object]) -> str:
        clock[0] += 7.5  # the report takes 7.5 s (plots, say)
        return "| table |\n"

    monkeypatch.setattr("mrc.lab.bench.report.table", slow_table)
    args = SimpleNamespace(table=None, plots=None, json=False)
    t0 = 68.2  # the run began 31.8 s before the report
    # stand-ins holding only what _report reads
    report_args, report_bench = cast(argparse.Namespace, args), cast(Bench, fake)
    assert bench._report(report_args, report_bench, (0.0, 0.0, 0.0), t0, progress, {}) == 0
    assert said == ["done in 39.3 s (the run 31.8 s, then its report)"]
