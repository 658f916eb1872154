"""The kernel TCP reference of bench_qp (mrc.lab.harness.peers tcp-recv / tcp-send), run for
real over loopback: the bytes each side reports, and the CPU seconds it spent moving them."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from lab.peer_pair import run_pair

PEERS = [sys.executable, "-m", "mrc.lab.harness.peers"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        return int(s.getsockname()[1])


def test_tcp_peers_report_bytes_and_the_cpu_spent_moving_them() -> None:
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        pytest.skip("no IPv6")
    port = _free_port()
    recv, send = run_pair(
        [*PEERS, "tcp-recv", "--port", str(port), "--duration", "0.5", "--wait", "10"],
        [*PEERS, "tcp-send", "--port", str(port), "--duration", "1.5", "--targets", "::1/::1"],
        timeout=30,
    )
    assert recv.returncode == 0, recv.stderr
    assert send.returncode == 0, send.stderr
    rj = json.loads(recv.stdout.splitlines()[-1])
    sj = json.loads(send.stdout)
    # the receiver counted from its first byte for 0.5 s; the sender stopped when it closed
    assert 0.45 <= rj["seconds"] <= 1.0
    assert rj["bytes"] >= 1 << 20 and rj["bps"] == pytest.approx(rj["bytes"] * 8 / rj["seconds"])
    assert sj["bytes"] >= rj["bytes"] and sj["bytes"] % (1 << 20) == 0
    # one thread each: busy at most as long as the span it counted, and not idle all of it
    assert 0 < rj["cpu_seconds"] <= rj["seconds"] + 0.05
    assert 0 < sj["cpu_seconds"] <= sj["seconds"] + 0.1
