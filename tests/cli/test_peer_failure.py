"""One side of a running transfer dies: the other exits 1 with one line, promptly."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema

from mrc.app.transfer import IDLE_TIMEOUT
from mrc.transport.sockets import udp6_counters

if TYPE_CHECKING:
    from conftest import MrcTools, Running

EVS = 8
EV_SOCKETS = 1  # the EVs of the one route (loopback) share a socket and differ by flow label


def _start_pair(mrc_tools: MrcTools, port: int) -> tuple[Running, Running]:
    recv = mrc_tools.start(
        "mrc-recv",
        "--listen",
        f"[::1]:{port}",
        "--discard",
        "--json",
        "--evs",
        str(EVS),
        "--timeout",
        "20",
    )
    recv.wait_listening(port)
    recv_base = recv.sockets()
    # one packet in flight at a time: 1 GiB takes far longer than this test
    send = mrc_tools.start(
        "mrc-send",
        "--size",
        "1G",
        "--window",
        "1",
        "--evs",
        str(EVS),
        "--to",
        f"[::1]:{port}",
        "--json",
    )
    # both sides have their EV sockets only once the connection is set up
    send.wait_sockets(EV_SOCKETS + 2)
    recv.wait_sockets(recv_base + EV_SOCKETS + 1)
    # and the transfer has started: data and ACKs cross loopback. A sender killed before its
    # first datagram is one the receiver never took (its listener drops it at the start
    # timeout, silently) and waits on for another, until --timeout: seen once in CI
    _wait_for_datagrams(4)
    return recv, send


def _wait_for_datagrams(count: int) -> None:
    """Until this namespace's kernel has delivered ``count`` more UDP datagrams."""
    start = udp6_counters().get("Udp6InDatagrams", 0)
    deadline = time.monotonic() + 30
    while udp6_counters().get("Udp6InDatagrams", 0) < start + count:
        assert time.monotonic() < deadline, "no datagram crossed loopback in 30 s"
        time.sleep(0.005)


def test_sender_dies_mid_transfer(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv, send = _start_pair(mrc_tools, mrc_port)
    send.kill()
    t0 = time.monotonic()
    res = recv.wait(60)
    # told by the side channel's end, not the --idle-timeout of 30 s (a busy machine may take
    # seconds to run the receiver at all: the bound is the timeout's half, not a fixed few)
    assert time.monotonic() - t0 < IDLE_TIMEOUT / 2
    assert res.returncode == 1, res.describe()
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrc-recv: error: "), res.describe()
    assert "sender went away" in lines[0]
    out = json.loads(res.stdout)
    # a failed transfer's report follows the documented schema too (docs/schemas/)
    schema = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "mrc-recv.schema.json"
    jsonschema.validate(out, json.loads(schema.read_text()))
    assert out["ok"] is False and "sender went away" in out["error"]
    assert out["bytes_placed"] < out["bytes"]


def test_receiver_dies_mid_transfer(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv, send = _start_pair(mrc_tools, mrc_port)
    recv.kill()
    t0 = time.monotonic()
    res = send.wait(60)
    assert time.monotonic() - t0 < IDLE_TIMEOUT / 2  # the side channel's end, as above
    assert res.returncode == 1, res.describe()
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrc-send: error: "), res.describe()
    assert "receiver" in lines[0]
