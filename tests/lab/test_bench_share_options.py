"""tools/bench_share.py's options for issue 39 (``--no-trim``, ``--reshape``, ``--fail-at``,
``--size``, ``--library``): what they parse to, a one-line usage error for every bad value,
and the figures the runs' records turn into. No fabric, no root.

The benchmark itself, with a reshaped last hop and a link that dies, is run for real in
tests/lab/test_bench_share_reshape.py (netns).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mrc.lab.bench import share
from mrc.lab.bench.share import (
    Failure,
    Watch,
    longest_stall,
    retire_reasons,
    retirements,
    summarize,
    table,
)

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_share.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_share_tool", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse(*argv: str) -> argparse.Namespace:
    ns: argparse.Namespace = _tool().parse_args(list(argv))
    return ns


def test_defaults_are_as_before() -> None:
    a = parse()
    assert a.senders == [2, 4] and a.cc == ["nscc"] and a.time == 6.0 and a.size is None
    assert a.rate == "100mbit" and a.planes == 4 and a.spines == 4 and a.runs == 1
    assert a.no_trim is False and a.reshape is None and a.reshape_queue is None
    assert a.fail_at is None and a.library is None


def test_the_issue_row_parses() -> None:
    a = parse(
        "--senders", "2,4,8", "--size", "64M", "--rate", "200mbit", "--no-trim",
        "--reshape", "50mbit", "--fail-at", "2",
    )  # fmt: skip
    assert a.senders == [2, 4, 8] and a.size == 64 << 20 and a.time is None
    assert a.no_trim and a.reshape == "50mbit" and a.reshape_queue == 9.0 and a.fail_at == 2.0
    b = parse("--no-trim", "--reshape", "25mbit", "--reshape-queue", "4.5", "--time", "3")
    assert b.reshape_queue == 4.5 and b.time == 3.0 and b.size is None


def test_library_is_a_checkout_made_absolute(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "mrc").mkdir()
    (tmp_path / "mrc" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path.parent)
    assert parse("--library", tmp_path.name).library == str(tmp_path.resolve())


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--reshape", "50mbit"], "--reshape needs --no-trim"),
        (["--no-trim", "--reshape", "50foo"], "argument --reshape: bad rate unit"),
        (["--reshape-queue", "9"], "--reshape-queue needs --reshape"),
        (["--no-trim", "--reshape", "50mbit", "--reshape-queue", "0"], "more than 0"),
        (["--size", "64M", "--time", "3"], "--size and --time exclude each other"),
        (["--size", "0"], "--size must be at least 1 byte"),
        (["--size", "64Q"], "unknown size unit"),
        (["--fail-at", "6"], "--fail-at 6 must be less than --time 6"),
        (["--fail-at", "-1"], "argument --fail-at"),
        (["--library", "/nonexistent/x"], "no mrc package there"),
    ],
)
def test_bad_values_are_one_line_usage_errors(argv: list[str], says: str) -> None:
    res = subprocess.run(
        [sys.executable, str(TOOL), *argv], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_share.py: error: "), res.stderr
    assert says in lines[0], lines[0]
    assert res.stdout == ""


def test_help_explains_the_new_options() -> None:
    res = subprocess.run(
        [sys.executable, str(TOOL), "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0
    for opt in ("--no-trim", "--reshape RATE", "--reshape-queue MS", "--fail-at SECONDS"):
        assert opt in res.stdout, opt
    assert "behind the tools' back" in res.stdout and "--library DIR" in res.stdout


# ---- what the records say ----------------------------------------------------------------------


def _iv(start: float, nbytes: int) -> dict[str, Any]:
    return {"start": start, "end": round(start + 0.05, 2), "bytes": nbytes}


def test_longest_stall_is_the_longest_run_of_intervals_without_bytes() -> None:
    ivs = [_iv(0.0, 10), _iv(0.05, 0), _iv(0.1, 0), _iv(0.15, 5), _iv(0.2, 0), _iv(0.25, 7)]
    assert longest_stall(ivs) == pytest.approx(0.1)
    assert longest_stall(ivs, after=0.16) == pytest.approx(0.05)  # only stalls ending later
    assert longest_stall([_iv(0.0, 1)]) == 0.0 and longest_stall([]) is None


def test_retirements_split_the_dead_routes_from_the_others(tmp_path: Path) -> None:
    fail = Failure("p0s0", "p0l2", 0, 1.0)
    log = tmp_path / "ev.jsonl"
    rows = [
        {"t": 99.0, "plane": 0, "route": "p0s0", "to": "ASSUMED_BAD"},  # before: not its
        {"t": 100.03, "plane": 0, "route": "p0s0", "to": "ASSUMED_BAD"},
        {"t": 100.02, "plane": 0, "route": "p0s0", "to": "ASSUMED_BAD"},
        {"t": 100.5, "plane": 0, "route": "p0s0", "to": "GOOD"},
        {"t": 100.04, "plane": 1, "route": "p1s0", "to": "ASSUMED_BAD"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    got = retirements(log, fail, 100.0)
    assert got == {"dead_route": 2, "other": 2, "first_s": 0.02, "last_s": 0.03}
    assert retirements(tmp_path / "missing", fail, 100.0)["dead_route"] == 0


def test_retire_reasons_count_by_phrase_without_its_numbers(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    rows = [
        {"to": "ASSUMED_BAD", "reason": "timeout"},
        {"to": "ASSUMED_BAD", "reason": "route down: 3 of its EVs lost packets"},
        {"to": "ASSUMED_BAD", "reason": "route down: 5 of its EVs lost packets"},
        {"to": "GOOD", "reason": "resurrected: 2 probes answered"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert retire_reasons(log) == {"route down: N of its EVs lost packets": 2, "timeout": 1}
    assert retire_reasons(tmp_path / "missing") == {}


def test_the_last_hop_rate_comes_from_its_counter_samples() -> None:
    w = Watch.__new__(Watch)  # no fabric: only its samples
    w.samples = [(10.0, 0), (10.1, 625_000), (10.2, 1_250_000), (10.3, 1_250_000)]
    assert w.bytes_at(10.05) == pytest.approx(312_500)
    assert w.rate(10.0, 10.2) == pytest.approx(50e6)
    assert w.rate(10.0, 10.1) is None  # under two samples long
    assert w.peak() == pytest.approx(50e6)


def _run(n: int, old: bool, fail: bool) -> dict[str, Any]:
    r: dict[str, Any] = {
        "cc": "nscc", "senders": n, "window": None, "jain": 0.99, "utilization": 0.9,
        "utilization_span": 0.85, "overlap": 0.9, "goodput_bps": 180e6, "timeouts": 3,
        "retransmits": 40, "fabric_trims": 0, "fabric_trims_lasthop": 0, "fabric_drops": 30,
        "payload_ceiling": 0.98, "sha256_ok": True, "evs_assumed_bad": 12,
        "evs_assumed_bad_false": 9, "ev_losses_delayed": None if old else 25,
        "evs_assumed_bad_ack": 2, "evs_assumed_bad_false_ack": 1,
        "ev_losses_delayed_ack": None if old else 4, "lasthop_utilization": 0.93,
        "lasthop_peak_bps": 205e6, "max_stall_s": 0.1,
        "retired_reasons": {"lost: later packets arrived": 10, "timeout": 2},
        "retired_reasons_ack": {},
    }  # fmt: skip
    if fail:
        r.update(
            {
                "fail_link": "p0s0-p0l2", "fail_evs_retired": 80, "fail_evs_retired_other": 1,
                "fail_retire_first_s": 0.03, "fail_retire_last_s": 0.07,
                "fail_ack_evs_retired": 10, "fail_ack_retire_first_s": 0.05,
                "fail_max_stall_s": 0.05, "fail_utilization_before": 0.9,
                "fail_utilization_during": 0.85,
            }
        )  # fmt: skip
    return r


def _out(old: bool, fail: bool) -> dict[str, Any]:
    return {
        "config": {
            "planes": 4, "spines": 4, "rate": "200mbit", "trim": False, "mtu": 9000,
            "receiver": "h2", "time": None, "size": 64 << 20, "runs": 2, "reshape": "50mbit",
            "reshape_queue_ms": 9.0, "capacity_bps": 200e6, "fail_at": 2.0 if fail else None,
            "fail_link": "p0s0-p0l2" if fail else None,
        },
        "results": [summarize([_run(2, old, fail), _run(2, old, fail)])],
        "machine": {"cpus": 2, "loadavg_start": [1.0], "loadavg_end": [1.5]},
        "seconds": 30.0,
    }  # fmt: skip


def test_summary_medians_the_new_figures_and_only_fails_with_a_failure() -> None:
    (r,) = _out(old=False, fail=False)["results"]
    assert r["evs_assumed_bad"] == 12 and r["evs_assumed_bad_false"] == 9
    assert r["ev_losses_delayed"] == 25 and r["ev_losses_delayed_ack"] == 4
    assert "fail_evs_retired" not in r
    (f,) = _out(old=True, fail=True)["results"]
    assert f["ev_losses_delayed"] is None  # an older mrc-send does not count it
    assert f["fail_evs_retired"] == 80 and f["fail_retire_first_s"] == 0.03
    assert set(share.FAIL_MEDIAN_KEYS) <= f.keys()
    # reasons are summed over the runs
    assert f["retired_reasons"] == {"lost: later packets arrived": 20, "timeout": 4}


def test_table_says_what_was_built_and_the_ev_figures() -> None:
    text = table(_out(old=True, fail=True))
    assert "reshaped to 50mbit behind the tools' back, tail drop, 9 ms of queue" in text
    assert "no trim" in text and "64.0 MiB each" in text
    row = next(line for line in text.splitlines() if line.startswith("nscc"))
    assert "12/2" in row and "9/1" in row and "-/-" in row and row.endswith("ok")
    assert "p0s0-p0l2 down at 2 s" in text and "first 30 ms after, last 70 ms" in text
    assert "last hop 90% before, 85% during" in text
    assert (
        "data EVs retired, all runs, by reason: lost: later packets arrived 20, timeout 4" in text
    )
    assert "ACK EVs retired" not in text  # none
    assert "machine: 2 cpus" in text.splitlines()[-1]
