"""mrc-send -> mrc-recv between two namespaces joined by two veth links (two planes)."""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import MrcTools, Result, Running

    from mrc.lab.testbed import TwoHosts

pytestmark = pytest.mark.netns

PORT = 4791
MiB = 1 << 20


def rx_bytes(ns: str) -> dict[str, int]:
    """The kernel's rx_bytes of every interface in ``ns`` (bytes, not packets: a GSO burst
    crosses a veth as one packet)."""
    res = subprocess.run(
        ["ip", "-n", ns, "-s", "-j", "link", "show"], capture_output=True, text=True, check=True
    )
    return {i["ifname"]: i["stats64"]["rx"]["bytes"] for i in json.loads(res.stdout)}


def receiver_on_both_planes(h: TwoHosts, mrc_tools: MrcTools, *extra: str) -> Running:
    """mrc-recv --discard --json in B, listening on its address in each plane, ready;
    ``extra``: more of its options."""
    recv = mrc_tools.start(
        "mrc-recv",
        *("--listen", f"[{h.b_addrs[0]}]:{PORT}", "--listen", f"[{h.b_addrs[1]}]:{PORT}"),
        *("--discard", "--json", *extra),
        ns=h.b,
    )
    recv.wait_listening(PORT)
    return recv


def send_over_both_planes(h: TwoHosts, mrc_tools: MrcTools, *args: str) -> Running:
    """mrc-send --json from A to B over both planes with ``args``, started (not awaited)."""
    return mrc_tools.start(
        "mrc-send",
        *("--to", f"[{h.b_addrs[0]}]:{PORT}", "--from", h.a_addrs[0], "--from", h.a_addrs[1]),
        *("--json", *args),
        ns=h.a,
    )


def finish(send: Running, recv: Running) -> tuple[Result, Result]:
    """Both ends' JSON, once both ended well."""
    s, r = send.wait(60), recv.wait(30)
    assert s.returncode == 0, s.describe()
    assert r.returncode == 0, r.describe()
    return s, r


def _fragments_made(ns: str) -> int:
    """Ip6FragCreates of ``ns``: fragments its kernel made of datagrams too big for a link."""
    res = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", "/proc/net/snmp6"],
        capture_output=True,
        text=True,
        check=True,
    )
    counters = dict(line.split() for line in res.stdout.splitlines() if line.strip())
    return int(counters["Ip6FragCreates"])


def test_64mib_over_two_planes(two_hosts: TwoHosts, mrc_tools: MrcTools) -> None:
    h = two_hosts
    planes = [h.link_names(p)[1] for p in range(2)]  # B's end of each link
    recv = receiver_on_both_planes(h, mrc_tools)
    before = rx_bytes(h.b)
    send = mrc_tools.run(
        "mrc-send",
        "--size",
        "64M",
        "--to",
        f"[{h.b_addrs[0]}]:{PORT}",
        "--from",
        h.a_addrs[0],
        "--from",
        h.a_addrs[1],
        "--payload",
        "8192",
        "--json",
        ns=h.a,
        timeout=60,
    )
    r = recv.wait(30)
    after = rx_bytes(h.b)
    assert send.returncode == 0, send.describe()
    assert r.returncode == 0, r.describe()
    s, rv = send.json, r.json

    assert s["ok"] is True and rv["ok"] is True
    assert s["bytes"] == rv["bytes"] == rv["bytes_placed"] == 64 * MiB
    assert s["digest"] == s["digest_receiver"] == rv["digest"] == rv["digest_sender"]
    assert rv["from"] == h.a_addrs[0]

    # spraying: every EV is a distinct source port, half on each plane
    rows = s["evs"]
    evs = rows[:128]  # the active EVs; the backup pool (equal per plane) follows them
    assert len(rows) >= 128 and s["planes"] == 2
    assert sorted(e["plane"] for e in evs) == [0] * 64 + [1] * 64
    backups = rows[128:]
    assert sum(e["plane"] == 0 for e in backups) == sum(e["plane"] == 1 for e in backups)
    counts = [e["packets"] for e in evs]
    assert sum(1 for c in counts if c) >= 64
    fair = sum(counts) / len(counts)
    burst = s["data_packets"] / s["bursts"]  # an EV takes a whole burst at a time
    assert max(counts) <= 3 * fair + 2 * burst, (max(counts), fair, burst, s["retransmits"])
    per_plane = [sum(e["packets"] for e in evs if e["plane"] == p) for p in (0, 1)]
    # (the neighbours are pinned and veth does not drop: any retransmission here is spurious)
    why = f"per plane {per_plane}, retransmits {s['retransmits']}"
    assert min(per_plane) >= 0.3 * sum(per_plane), why

    # the kernel agrees: each plane's interface in B received its share of the bytes
    got = {ifname: after[ifname] - before[ifname] for ifname in planes}
    assert sum(got.values()) >= 64 * MiB, (got, s["data_packets"])
    for ifname in planes:
        assert got[ifname] >= 0.3 * sum(got.values()), (got, s["retransmits"])


def test_the_default_payload_fits_the_path_mtu(
    two_hosts_1500: TwoHosts, mrc_tools: MrcTools
) -> None:
    """Without --payload, mrc-send asks the kernel for the path MTU of each plane's route and
    sends the largest payload that fits the smallest (8 KiB at most), and says so with -v:
    1500 - 40 (IPv6) - 8 (UDP) - 32 (MRC headers) = 1420 bytes, no datagram fragmented."""
    h = two_hosts_1500
    recv = receiver_on_both_planes(h, mrc_tools)
    frags = _fragments_made(h.a)
    send, r = finish(send_over_both_planes(h, mrc_tools, "--size", "4M", "-v"), recv)
    s, rv = send.json, r.json
    assert s["payload"] == 1500 - 40 - 8 - 32 == 1420
    assert "payload 1420 bytes per packet (path MTU 1500 to" in send.stderr, send.stderr
    assert s["digest"] == s["digest_receiver"] == rv["digest"] and rv["bytes"] == 4 * MiB
    # datagrams that fit go whole: the sender's kernel cut none into fragments
    assert "exceed what the path MTU leaves" not in send.stderr
    assert _fragments_made(h.a) == frags
