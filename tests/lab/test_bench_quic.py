"""bench_qp's aioquic reference (mrc.lab.harness.quic_peer): a real stream on loopback whose
bytes the receiver hashes, the reference's place in bench_qp's summary, table and schema, and
the one line a machine without aioquic gets.

The loopback transfer needs no root; bench_qp runs the same two processes inside its two
namespaces (tests/cli/test_json_schemas.py runs bench_qp itself).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import blake3
import jsonschema
import pytest

from lab import test_bench_qp as tbq
from lab.peer_pair import run_pair
from mrc.lab.bench import qp
from mrc.lab.bench.qp_report import table
from mrc.lab.harness import quic_peer

pytest.importorskip("aioquic")

SIZE = (4 << 20) + 12345  # four whole chunks and a short one
SEED = 38


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind(("::1", 0))
        port: int = s.getsockname()[1]
        return port


def _expected_digest(size: int, seed: int) -> str:
    """BLAKE3 of the stream the sender makes from ``seed``, made here without it."""
    base = quic_peer.seed_bytes(seed)
    h = blake3.blake3()
    index = done = 0
    while done < size:
        chunk = quic_peer.chunk_data(index, base, min(quic_peer.CHUNK, size - done))
        h.update(chunk)
        done += len(chunk)
        index += 1
    return h.hexdigest()


def test_a_stream_on_loopback_arrives_whole_and_hashed() -> None:
    port = _free_udp_port()
    peer = [sys.executable, "-m", "mrc.lab.harness.quic_peer"]
    common = ["--port", str(port), "--dgram", "8220"]
    recv, send = run_pair(
        [*peer, "recv", *common, "--wait", "15"],
        [*peer, "send", *common, "--to", "::1", "--size", str(SIZE), "--seed", str(SEED)],
        timeout=20,
    )
    assert send.returncode == 0, send.stderr
    assert recv.returncode == 0, recv.stderr
    out = recv.stdout
    sent = json.loads(send.stdout.splitlines()[-1])
    got = json.loads(out.splitlines()[-1])
    expected = _expected_digest(SIZE, SEED)
    assert sent["bytes"] == got["bytes"] == SIZE
    assert sent["digest"] == got["digest"] == sent["receiver_digest"] == expected
    assert sent["ok"] is True
    assert got["bps"] == pytest.approx(SIZE * 8 / got["seconds"])
    assert got["cpu_seconds"] > 0 and sent["cpu_seconds"] > 0


def test_chunks_differ_by_their_index() -> None:
    """A chunk delivered in another's place changes the hash."""
    base = quic_peer.seed_bytes(SEED)
    assert quic_peer.chunk_data(0, base, 64) != quic_peer.chunk_data(1, base, 64)
    assert quic_peer.chunk_data(1, base, 64)[8:] == base[8:64]
    assert len(quic_peer.chunk_data(2, base, 5)) == 5


def _quic_run(gbps: float, send_cpu: float, recv_cpu: float) -> dict[str, Any]:
    """One run as Bench.quic_run records it."""
    seconds = tbq.GIB * 8 / (gbps * 1e9)
    return {
        "bytes": tbq.GIB,
        "bps": gbps * 1e9,
        "payload_bps": gbps * 1e9,
        "pps": None,
        "seconds": seconds,
        "datagram_bytes": 8220,
        "digest": "ab" * 32,
        "send_seconds": seconds + 0.01,
        "send_cpu_s_per_gib": send_cpu,
        "recv_cpu_s_per_gib": recv_cpu,
    }


def test_summary_table_and_schema_carry_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [_quic_run(0.40, 9.0, 11.0), _quic_run(0.50, 8.0, 10.0), _quic_run(0.45, 8.5, 12.0)]
    made_up = tbq._results

    def results(a: Any, tcp: list[dict[str, Any]] | None = None) -> dict[str, list[Any]]:
        return {**made_up(a, tcp), "aioquic": runs, "aioquic_errors": []}

    monkeypatch.setattr(tbq, "_results", results)
    a = tbq._args("--compare", "tcp,aioquic")
    out = tbq._out(a)  # validated against docs/schemas/bench_qp.schema.json there
    (row,) = out["results"]
    ref = row["aioquic"]
    assert ref["payload_bps_median"] == 0.45e9
    assert (ref["send_cpu_s_per_gib_median"], ref["recv_cpu_s_per_gib_median"]) == (8.5, 11.0)
    assert row["mrc_vs_aioquic"] == round(3.1 / 0.45, 3)
    assert row["mrc_vs_tcp"] == round(3.1 / 15.5, 3)
    text = table(out)
    assert "aioquic Gbit/s" in text and "aioquic CPU snd/rcv" in text
    assert "     8.50/11.00" in text
    broken = json.loads(json.dumps(out))
    broken["results"][0]["aioquic"]["runs"][0]["digest"] = "not hex"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, tbq.SCHEMA)


def test_compare_defaults_leave_aioquic_out() -> None:
    assert tbq._args().compare == list(qp.DEFAULT_PEERS) == ["raw", "gso", "tcp"]
    assert tbq._args("--compare", "aioquic,tcp").compare == ["aioquic", "tcp"]


def test_without_aioquic_compare_aioquic_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "aioquic", None)  # import aioquic raises ImportError
    assert quic_peer.missing() is not None
    assert tbq._tool().main(["--compare", "tcp,aioquic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aioquic" in err and "Traceback" not in err
    assert err.startswith("bench_qp.py: error: --compare aioquic needs aioquic")
