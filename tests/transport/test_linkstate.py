"""Link-state failover: a plane whose NIC loses its link is out at once, on both ends.

Units: the netlink parser (every message kind, truncation, alignment) and the address ->
interface lookup. End to end: two namespaces joined by two veth links, a transfer over both
planes, and the receiver's plane-1 end set down mid-transfer. The sender's end loses its
carrier: its sends still "succeed" (the kernel drops them silently, as a NIC whose cable was
pulled would), so only the link state can tell. The sender takes plane 1 out with the reason
"its NIC lost its link", before any loss, and resends what was in flight there at once: no
retransmission waits for a timeout. The receiver takes the plane out too (by link or by the
send errors of its ACKs, whichever its event loop meets first). What the resend does, packet
by packet, tests/core/test_link_down.py shows without a race.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from transport.test_netns import finish, receiver_on_both_planes, rx_bytes, send_over_both_planes

if TYPE_CHECKING:
    from conftest import MrcTools

    from mrc.lab.testbed import TwoHosts

from mrc.transport.linkstate import (
    IFF_LOWER_UP,
    IFF_UP,
    IFINFOMSG,
    NLMSG_HDR,
    RTM_DELLINK,
    RTM_NEWLINK,
    interface_of,
    parse_link_messages,
)


def _msg(kind: int, index: int, flags: int, pad_to: int = 0) -> bytes:
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 1, index, flags, 0xFFFFFFFF) + bytes(pad_to)
    length = NLMSG_HDR.size + len(body)
    raw = NLMSG_HDR.pack(length, kind, 0, 0, 0) + body
    return raw + bytes(-len(raw) % 4)


def test_link_messages_say_which_links_are_usable() -> None:
    data = (
        _msg(RTM_NEWLINK, 3, IFF_UP | IFF_LOWER_UP)
        + _msg(RTM_NEWLINK, 4, IFF_UP, pad_to=5)  # carrier lost; odd attribute bytes
        + _msg(RTM_NEWLINK, 5, IFF_LOWER_UP)  # administratively down
        + struct.pack("=IHHII", 20, 3, 0, 0, 0)  # NLMSG_DONE-like, not a link message
        + bytes(4)
        + _msg(RTM_DELLINK, 6, IFF_UP | IFF_LOWER_UP)  # gone
    )
    assert parse_link_messages(data) == [(3, True), (4, False), (5, False), (6, False)]


@pytest.mark.parametrize("cut", [1, 15, 16, 20, 31])
def test_a_truncated_message_ends_the_parse(cut: int) -> None:
    whole = _msg(RTM_NEWLINK, 3, IFF_UP | IFF_LOWER_UP)
    data = whole + _msg(RTM_NEWLINK, 4, IFF_UP)[:cut]
    assert parse_link_messages(data) == [(3, True)]
    bogus = struct.pack("=IHHII", 4, RTM_NEWLINK, 0, 0, 0)  # shorter than its own header
    assert parse_link_messages(bogus + whole) == []


def test_the_interface_of_an_address() -> None:
    assert interface_of("::1") == socket.if_nametoindex("lo")
    assert interface_of("fd00:dead::1") is None  # not on this host
    assert interface_of("127.0.0.1") is None and interface_of("nonsense") is None


def _ev_log(path: str) -> list[dict[str, object]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.netns
def test_a_nic_that_loses_its_link_takes_its_plane_out_on_both_ends(
    two_hosts: TwoHosts, mrc_tools: MrcTools, tmp_path: Path
) -> None:
    h = two_hosts
    send_log, recv_log = tmp_path / "send.jsonl", tmp_path / "recv.jsonl"
    recv = receiver_on_both_planes(h, mrc_tools, "--ev-log", str(recv_log))
    send = send_over_both_planes(h, mrc_tools, "--time", "3", "--ev-log", str(send_log))
    # down with the link once plane 1 carries data (an event, not a fixed sleep)
    b_end = h.link_names(1)[1]
    start = rx_bytes(h.b)[b_end]
    deadline = time.monotonic() + 30
    while rx_bytes(h.b)[b_end] < start + (8 << 20):
        assert time.monotonic() < deadline, "plane 1 never carried 8 MiB"
        assert send.proc.poll() is None, "the sender ended before plane 1 carried data"
        time.sleep(0.02)
    subprocess.run(["ip", "-n", h.b, "link", "set", "dev", b_end, "down"], check=True)
    s_res, r_res = finish(send, recv)
    s, rv = s_res.json, r_res.json
    assert s["ok"] is True and rv["ok"] is True
    assert s["digest"] == s["digest_receiver"] == rv["digest"]

    reason = "plane 1 down: this host's NIC lost its link"
    rows = _ev_log(str(send_log))
    link = [r for r in rows if r["reason"] == reason]
    assert link, f"the sender never took plane 1 out for its link: {rows[:5]}"
    assert {r["plane"] for r in link} == {1}, link
    # ... and not after losses first: no EV of plane 1 was retired before
    first = min(float(str(r["t"])) for r in link)
    earlier = [
        r for r in rows if r["plane"] == 1 and r["to"] != "GOOD" and float(str(r["t"])) < first
    ]
    assert earlier == [], earlier
    assert s["planes_lost"] == 1 and rv["planes_lost"] == 1
    assert [r["plane"] for r in _ev_log(str(recv_log)) if r["to"] != "GOOD"][:1] == [1]
    # no retransmission waited for a timeout: what plane 1 lost after the link went (often
    # nothing on a veth) went again at once by the link, or, when the event loop met SACK
    # evidence or a probe's silence first (an ACK that had left on plane 1), by those
    assert s["retransmits_timeout"] == 0, s
