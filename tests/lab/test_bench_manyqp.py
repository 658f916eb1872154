"""tools/bench_manyqp.py, run for real on loopback: many QPs into one receiver, and one QP
moving the same bytes beside them.

No root needed (mrc-send and mrc-recv on [::1]); the run is kept small (8 streams of 256 KiB,
one run) because the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mrc.lab.bench import manyqp
from mrc.lab.bench.manyqp import Bench, Shape, sender_streams

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_manyqp.py"


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=timeout
    )


def test_many_qps_into_one_receiver_all_complete_beside_one_qp() -> None:
    res = bench("--procs", "2", "--parallel", "4", "--size", "256K", "--runs", "1", "--json")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # --json: JSON only, no table, no progress
    out: dict[str, Any] = json.loads(res.stdout)
    assert out["tool"] == "bench_manyqp" and out["machine"]["cpus"] >= 1
    assert len(out["machine"]["loadavg_start"]) == 3
    (run,) = out["results"]
    many, one = run["many"], run["one"]
    assert many["ok"] and many["streams_ok"] == many["streams"] == 8, many["errors"]
    assert many["bytes"] == 8 * 256 * 1024 and many["recv_exit_code"] == 0
    assert many["recv_transfers"] == many["recv_ok"] == 8 and many["send_exit_codes"] == [0, 0]
    assert 0 < many["jain"] <= 1 and many["goodput_bps"] > 0
    assert many["finish_min"] <= many["finish_median"] <= many["finish_max"]
    assert many["data_packets"] > 0 and many["acks_sent"] > 0
    # the single-QP reference moved the same bytes, in the same run, to a receiver of its own
    assert one["ok"] and (one["streams"], one["streams_ok"]) == (1, 1), one["errors"]
    assert one["bytes"] == many["bytes"] and one["jain"] == 1.0
    assert run["ratio"] == round(many["goodput_bps"] / one["goodput_bps"], 3)
    summary = out["summary"]
    assert summary["many"]["runs_ok"] == summary["one"]["runs_ok"] == 1
    assert summary["ratio_median"] == run["ratio"]


def test_a_bad_argument_is_one_line_and_status_2() -> None:
    res = bench("--parallel", "0", timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("bench_manyqp.py: error: argument --parallel:"), res.stderr


def test_a_run_past_its_timeout_is_stopped_and_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timeout no sender can meet (their start-up alone takes longer): the phase is failed
    and every child stopped, well within the grace of the harness."""
    monkeypatch.setattr(manyqp, "run_timeout", lambda total_bytes: 0.05)
    args = argparse.Namespace(evs=16, extra=[], port=None)
    t0 = time.monotonic()
    got = Bench(args, lambda msg: None).phase(Shape(procs=1, parallel=2, size=64 << 10))
    assert time.monotonic() - t0 < 20
    assert not got["ok"] and got["timed_out"], got
    assert got["errors"][0] == "stopped after 0 s: not finished"
    assert got["recv_exit_code"] != 0 and got["send_exit_codes"] != [0]


def test_a_sender_of_one_qp_is_its_one_stream() -> None:
    """A sender's object without a streams list is its one stream."""
    assert sender_streams({"ok": True, "bytes": 3, "seconds": 1.0}) == [
        {"ok": True, "bytes": 3, "seconds": 1.0}
    ]
    assert sender_streams({"streams": [{"stream": 0}, {"stream": 1}]}) == [
        {"stream": 0},
        {"stream": 1},
    ]
