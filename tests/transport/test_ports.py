"""--ports: every UDP socket of a connection inside a range a host firewall lets through.

Both hosts get an ip6tables policy that drops every UDP datagram in or out except those to or
from the range (and the receiver's listening port): a transfer with --ports on both ends
completes, verified, without one datagram meeting the drop rules, while a socket outside the
range is refused by the same rules (they really are in force).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from typing import TYPE_CHECKING

import pytest
from transport.test_netns import PORT, finish, receiver_on_both_planes, send_over_both_planes

if TYPE_CHECKING:
    from conftest import MrcTools

    from mrc.lab.testbed import TwoHosts

pytestmark = pytest.mark.netns


RANGE = (20000, 20399)  # outside the kernel's ephemeral range (32768-60999)
MiB = 1 << 20


def _ip6tables(ns: str, *args: str) -> str:
    res = subprocess.run(
        ["ip", "netns", "exec", ns, "ip6tables", "-w", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout


def _firewall(ns: str) -> None:
    """UDP in to the range or PORT and out of them; every other UDP datagram dropped."""
    lo, hi = RANGE
    for chain, way in (("INPUT", "--dport"), ("OUTPUT", "--sport")):
        _ip6tables(ns, "-A", chain, "-p", "udp", way, f"{lo}:{hi}", "-j", "ACCEPT")
        _ip6tables(ns, "-A", chain, "-p", "udp", way, str(PORT), "-j", "ACCEPT")
        _ip6tables(ns, "-A", chain, "-p", "udp", "-j", "DROP")


def _dropped(ns: str) -> int:
    """Packets the DROP rules of ``ns`` have met, both chains."""
    total = 0
    for chain in ("INPUT", "OUTPUT"):
        for line in _ip6tables(ns, "-L", chain, "-n", "-v", "-x").splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "DROP":
                total += int(fields[0])
    return total


def test_a_transfer_keeps_to_the_port_range(two_hosts: TwoHosts, mrc_tools: MrcTools) -> None:
    if shutil.which("ip6tables") is None:
        pytest.skip("no ip6tables")
    h = two_hosts
    for ns in (h.a, h.b):
        _firewall(ns)
    ports = f"{RANGE[0]}-{RANGE[1]}"
    recv = receiver_on_both_planes(h, mrc_tools, "--ports", ports)
    send, r = finish(send_over_both_planes(h, mrc_tools, "--size", "16M", "--ports", ports), recv)
    s, rv = send.json, r.json
    assert s["digest"] == s["digest_receiver"] == rv["digest"] and rv["bytes"] == 16 * MiB
    # 128 EVs and their backups, each a 32-bit value of its own, through one source port
    # per plane (the EVs of a plane differ by flow label)
    values = [e["value"] for e in s["evs"]]
    assert len(values) == len(set(values)) >= 128
    sports = {e["sport"] for e in s["evs"]}
    assert len(sports) == 2 and all(RANGE[0] <= p <= RANGE[1] for p in sports), sports
    assert s["retransmits"] == 0  # nothing was lost to the firewall either
    assert _dropped(h.a) == _dropped(h.b) == 0

    # the rules are in force: a datagram from a port outside the range does not get out
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        f"s.bind(('{h.a_addrs[0]}', {RANGE[1] + 1}))\n"
        "try:\n"
        f"    s.sendto(b'x', ('{h.b_addrs[0]}', {PORT}))\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    res = subprocess.run(
        ["ip", "netns", "exec", h.a, "python3", "-c", code], capture_output=True, text=True
    )
    assert res.stdout.strip() == "refused", res.stderr
    assert _dropped(h.a) == 1


def test_a_range_too_small_for_a_connection_is_one_line(mrc_tools: MrcTools) -> None:
    """Refused before connecting: the range cannot hold an EV socket and the receive port."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]  # nobody listens there: the check comes first
    res = mrc_tools.run(
        "mrc-send",
        *("--size", "1M", "--to", f"[::1]:{port}", "--ports", "20000-20000", "--evs", "16"),
    )
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "mrc-send: error: the port range 20000-20000 (--ports) holds 1 port; a connection "
        "needs at least 2 (an EV socket per route, and the sender's receive port)"
    ], res.stderr
