"""mrc-send's iperf3/perftest habits on loopback: --time, --interval, --parallel and the
ib_write_bw summary table, against a real mrc-recv."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema
import pytest

from mrc.app.timed import SLOT

if TYPE_CHECKING:
    from conftest import MrcTools, Result

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs/schemas/mrc-send.schema.json").read_text()
)


def test_time_sends_verified_rounds_for_the_duration_with_intervals(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json")
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run(
        "mrc-send",
        *("--time", "1", "--interval", "0.25", "--to", f"[::1]:{mrc_port}", "--json"),
        *("--payload", "8192"),
    )
    got = recv.wait()
    assert sent.returncode == 0, sent.describe()
    assert got.returncode == 0, got.describe()
    out, rcv = sent.json, got.json
    jsonschema.validate(out, SCHEMA)
    assert out["ok"] and rcv["ok"] and out["time"] == 1.0
    # whole rounds, every one hashed by the receiver, which counts the same bytes
    assert out["bytes"] > 0 and out["bytes"] % SLOT == 0
    assert rcv["bytes"] == out["bytes"]
    assert out["checksum"] == rcv["checksum"] == "blake3"  # the default, each round too
    assert out["digest"] == out["digest_receiver"] == rcv["digest"] == rcv["digest_sender"]
    assert 1.0 <= out["seconds"] < 6.0
    assert out["peak_bps"] >= out["goodput_bps"] > 0
    # iperf3's intervals: back to back from 0, a quarter second each but for the last
    # (the rounds in flight when the time was up and the verdict), adding up to the total
    ivs = out["intervals"]
    assert ivs[0]["start"] == 0
    assert all(a["end"] == b["start"] for a, b in zip(ivs, ivs[1:], strict=False))
    assert all(abs(iv["end"] - 0.25 * (i + 1)) < 0.15 for i, iv in enumerate(ivs[:-1]))
    assert 0 < ivs[-1]["end"] - ivs[-1]["start"] < 0.4
    assert len(ivs) >= 4 and ivs[-1]["end"] >= out["seconds"]
    assert sum(iv["bytes"] for iv in ivs) == out["bytes"]
    assert sum(iv["retransmits"] for iv in ivs) == out["retransmits"]
    assert all(sum(iv["evs"].values()) == len(out["evs"]) for iv in ivs)


def _parallel(
    mrc_tools: MrcTools, mrc_port: int, streams: int, size: int, evs: int
) -> tuple[Result, Result]:
    """mrc-send --parallel STREAMS into mrc-recv --count STREAMS; both finished and ok."""
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--count", str(streams), "--json"
    )
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run(
        "mrc-send",
        *("--size", str(size), "--parallel", str(streams), "--evs", str(evs)),
        *("--to", f"[::1]:{mrc_port}", "--json"),
    )
    got = recv.wait()
    assert sent.returncode == 0, sent.describe()
    assert got.returncode == 0, got.describe()
    return sent, got


def test_parallel_streams_are_each_verified(mrc_tools: MrcTools, mrc_port: int) -> None:
    size = 3 << 20
    sent, got = _parallel(mrc_tools, mrc_port, 2, size, 8)
    out = sent.json
    jsonschema.validate(out, SCHEMA)
    assert out["ok"] and out["bytes"] == 2 * size and "intervals" not in out
    streams = out["streams"]
    assert [s["stream"] for s in streams] == [0, 1]
    # the same data on two QPs: two receptions, each hashed to what was sent
    assert len(got.objects) == 2 and all(r["ok"] and r["bytes"] == size for r in got.objects)
    assert {r["digest"] for r in got.objects} == {out["digest"]}
    assert all(s["ok"] and s["digest"] == s["digest_receiver"] == out["digest"] for s in streams)
    assert {r["checksum"] for r in got.objects} == {"blake3"} == {s["checksum"] for s in streams}
    assert out["checksum"] == "blake3"
    assert out["data_packets"] == sum(s["data_packets"] for s in streams)
    assert sorted({e["stream"] for e in out["evs"]}) == [0, 1]
    assert sum(1 for e in out["evs"] if e["stream"] == 1) == len(out["evs"]) // 2


def test_sixty_four_streams_into_one_receiver_all_verify(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    """64 QPs from one process into one receiver (issue 21 saw 0 of 64 complete, "retry
    budget exhausted ... peer unreachable or gone", with the receiver alive): each one
    completes and is hashed to what was sent."""
    size = 1 << 20
    sent, got = _parallel(mrc_tools, mrc_port, 64, size, 16)
    streams = sent.json["streams"]
    assert len(streams) == 64
    assert all(s["ok"] and s["digest"] == s["digest_receiver"] for s in streams)
    assert len(got.objects) == 64
    assert all(r["ok"] and r["bytes"] == size for r in got.objects)
    assert {r["digest"] for r in got.objects} == {sent.json["digest"]}


def test_parallel_streams_share_the_receiver_fairly(mrc_tools: MrcTools, mrc_port: int) -> None:
    """16 QPs into one host: each a fair share. Before the QPs of one process shared their
    base RTT, the last to start took the others' queue for their own path, kept their
    windows and finished first: in 0.5 s where others took 15 s (Jain's index 0.2-0.8)."""
    size = 16 << 20
    sent, _got = _parallel(mrc_tools, mrc_port, 16, size, 16)
    streams = sent.json["streams"]
    assert all(s["ok"] for s in streams)
    rates = [s["bytes"] / s["seconds"] for s in streams]
    jain = sum(rates) ** 2 / (len(rates) * sum(r * r for r in rates))
    finish = [s["seconds"] for s in streams]
    # a quiet machine gives 0.99 and finish times within 1.5x; before, 0.2-0.8 and 30x
    assert jain >= 0.8, (jain, sorted(finish))
    assert max(finish) <= 4 * min(finish), sorted(finish)


def test_parallel_beyond_what_the_receiver_takes_is_one_line(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard")
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run("mrc-send", "--size", "1M", "--parallel", "2", "--to", f"[::1]:{mrc_port}")
    assert sent.returncode == 1, sent.describe()
    assert sent.stderr.count("\n") == 1
    assert sent.stderr.startswith("mrc-send: error: stream 2 of 2: connection refused")
    assert "mrc-recv --count" in sent.stderr


def test_human_output_has_interval_lines_and_the_summary_table(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    size = 2 << 20
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--count", "2")
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run(
        "mrc-send",
        *("--size", str(size), "--parallel", "2", "--interval", "0.02"),
        *("--to", f"[::1]:{mrc_port}", "--payload", "1000"),
    )
    assert sent.returncode == 0, sent.describe()
    assert recv.wait().returncode == 0
    lines = sent.stdout.splitlines()
    assert lines[0].split()[:3] == ["interval", "[s]", "transfer"]
    ok = next(i for i, line in enumerate(lines) if line.startswith("ok: sent 4.0 MiB"))
    assert ok >= 2  # at least one interval line before the result
    assert all(re.match(r"\s+\d+\.\d\d-\d+\.\d\d\s", line) for line in lines[1:ok])
    head, row = lines[ok + 2].split(), lines[ok + 3].split()
    assert head[:2] == ["#bytes", "#iterations"] and "MsgRate[Mpps]" in head
    # bytes of both streams; iterations: 2048 packets of 1000 bytes (+ 1 short one) and the
    # empty WRITE_IMM that ends it, per stream
    assert int(row[0]) == 2 * size
    assert int(row[1]) == 2 * (math.ceil(size / 1000) + 1)
    peak, average, rate = (float(x) for x in row[2:5])
    assert peak >= average > 0 and rate > 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--time", "1", "--size", "1M"], "argument --size: not allowed with argument --time"),
        (["somefile", "--time", "1"], "argument --time: not allowed with argument FILE"),
        (["--time", "0", "--size", "1M"], "argument --time: must be more than 0"),
        (["--size", "1M", "--interval", "-1"], "argument --interval: must be more than 0"),
        (["--size", "1M", "--parallel", "0"], "argument --parallel: must be at least 1"),
        (["--size", "1M", "--parallel", "257"], "--parallel: at most 256 streams, not 257"),
    ],
)
def test_bad_combinations_are_one_line_usage_errors(
    mrc_tools: MrcTools, args: list[str], says: str
) -> None:
    res = mrc_tools.run("mrc-send", *args, "--to", "[::1]:9")
    assert res.returncode == 2, res.describe()
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"mrc-send: error: {says}")
