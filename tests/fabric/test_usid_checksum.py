"""What carries a UDP datagram over SRv6 uSID hops on this kernel (issue 22, item 2), pinned
before mrc-fabric builds on it.

A chain of namespaces, A - R1 - R2 - B, with the uSID block fcbb:bb00::/32: R1's uN is 0100
(End with the next-csid flavour, 32-bit locator block and 16-bit micro-SIDs: it shifts the
destination's micro-SIDs left and forwards), R2's 0200 likewise, B's address fd00:b::2.

* **Straight to a uSID container** (destination fcbb:bb00:100:200:300::, B owning the 0300
  uN address): the UDP checksum covers the destination the sender wrote, the routers change
  it in flight, and B's kernel drops the datagram (Udp6InCsumErrors). A namespace test hides
  this if the sender's kernel leaves the checksum to "hardware": veth never computes or
  checks it. Here the datagram is built with scapy, its checksum computed in full.
* **Zero checksum**: delivered only to a socket with UDP_NO_CHECK6_RX set (and sent with
  UDP_NO_CHECK6_TX); every other receiver drops it, as RFC 8200 says it must.
* **Encapsulation at the sender's kernel** (``encap seg6 mode encap.red`` with one container:
  IPv6-in-IPv6, no routing header) and a decapsulating micro-SID at the last router
  (R2's f200, End.DX6 to B): B receives plain UDP to its own address, checksum valid, with the
  flow label the sending socket set for that datagram (IPV6_FLOWINFO_SEND, no lease needed),
  which is also the outer header's label on every fabric link.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fabric.fabric_helpers import SKIP_REASON

from mrc.lab.testbed import leftover_namespaces

pytestmark = pytest.mark.netns

PORT = 9000
LABELS = (0x12345, 0xABCDE, 0x00001)
_chains = itertools.count()


@dataclass
class Chain:
    prefix: str

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def ip(self, node: str, *args: str) -> None:
        subprocess.run(["ip", "-n", self.ns(node), *args], check=True, capture_output=True)

    def run(self, node: str, *args: str, timeout: float = 60) -> str:
        res = subprocess.run(
            ["ip", "netns", "exec", self.ns(node), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return res.stdout

    def snmp6(self, node: str, name: str) -> int:
        for line in self.run(node, "cat", "/proc/net/snmp6").splitlines():
            fields = line.split()
            if fields and fields[0] == name:
                return int(fields[1])
        raise KeyError(name)


@pytest.fixture
def chain() -> Iterator[Chain]:
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    c = Chain(f"mrcu{os.getpid()}-{next(_chains)}")
    try:
        for node in ("A", "R1", "R2", "B"):
            subprocess.run(["ip", "netns", "add", c.ns(node)], check=True)
            c.ip(node, "link", "set", "lo", "up")
            c.run(node, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0")
            c.run(node, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
        for left, right, lname, rname in (
            ("A", "R1", "a0", "r1a"),
            ("R1", "R2", "r1b", "r2a"),
            ("R2", "B", "r2b", "b0"),
        ):
            subprocess.run(
                ["ip", "link", "add", lname, "netns", c.ns(left), "type", "veth"]
                + ["peer", "name", rname, "netns", c.ns(right)],
                check=True,
            )
            c.ip(left, "link", "set", lname, "up")
            c.ip(right, "link", "set", rname, "up")
        for router in ("R1", "R2"):
            c.run(router, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        for node, addr, dev in (
            ("A", "fd00:1::1/64", "a0"),
            ("R1", "fd00:1::2/64", "r1a"),
            ("R1", "fd00:2::1/64", "r1b"),
            ("R2", "fd00:2::2/64", "r2a"),
            ("R2", "fd00:3::1/64", "r2b"),
            ("B", "fd00:3::2/64", "b0"),
            ("B", "fd00:b::2/128", "lo"),
        ):
            c.ip(node, "addr", "add", addr, "dev", dev, "nodad")
        usid = ["flavors", "next-csid", "lblen", "32", "nflen", "16"]
        c.ip("R1", "-6", "route", "add", "fcbb:bb00:100::/48", "encap", "seg6local", "action",
             "End", *usid, "dev", "r1a")  # fmt: skip
        c.ip("R2", "-6", "route", "add", "fcbb:bb00:200::/48", "encap", "seg6local", "action",
             "End", *usid, "dev", "r2a")  # fmt: skip
        c.ip("R2", "-6", "route", "add", "fcbb:bb00:f200::/48", "encap", "seg6local", "action",
             "End.DX6", "nh6", "fd00:3::2", "dev", "r2b")  # fmt: skip
        c.ip("A", "-6", "route", "add", "default", "via", "fd00:1::2")
        for node, prefix, via in (
            ("R1", "fcbb:bb00:200::/48", "fd00:2::2"),
            ("R1", "fcbb:bb00:300::/48", "fd00:2::2"),
            ("R1", "fcbb:bb00:f200::/48", "fd00:2::2"),
            ("R2", "fcbb:bb00:300::/48", "fd00:3::2"),
            ("R1", "fd00:3::/64", "fd00:2::2"),
            ("R1", "fd00:b::/64", "fd00:2::2"),
            ("R2", "fd00:1::/64", "fd00:2::1"),
            ("B", "default", "fd00:3::1"),
        ):
            c.ip(node, "-6", "route", "add", prefix, "via", via)
        yield c
    finally:
        for node in ("A", "R1", "R2", "B"):
            subprocess.run(["ip", "netns", "del", c.ns(node)], capture_output=True)
        assert leftover_namespaces(c.prefix + "-") == []


_RECEIVER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    if sys.argv[2] == "1":
        s.setsockopt(socket.IPPROTO_UDP, 102, 1)  # UDP_NO_CHECK6_RX
    s.setsockopt(socket.IPPROTO_IPV6, 11, 1)  # IPV6_FLOWINFO: the label as ancillary data
    s.bind(("::", int(sys.argv[1])))
    print("ready", flush=True)
    while True:
        data, anc, _flags, addr = s.recvmsg(2048, 256)
        if data == b"stop" and addr[0] == "::1":
            break
        label = [int.from_bytes(d, "big") & 0xFFFFF for _l, t, d in anc if t == 11]
        print(len(data), label[0] if label else -1, flush=True)
    """
)


_STOP = (
    "import socket, sys; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"
    ".sendto(b'stop', ('::1', int(sys.argv[1])))"
)


def _udp_seen(c: Chain) -> int:
    """Datagrams B's UDP layer has taken or refused (a bad checksum counts in both
    InErrors and InCsumErrors; a zero checksum refused counts in InErrors alone)."""
    return c.snmp6("B", "Udp6InDatagrams") + c.snmp6("B", "Udp6InErrors")


def _receive(c: Chain, send: list[str], no_check_rx: bool, count: int = 1) -> list[str]:
    """Start a receiver in B, run ``send`` in A (``count`` datagrams), and return what B
    received: one line per datagram, "<length> <flow label>". Once B's UDP layer has seen
    them all, the receiver is stopped by a datagram from B itself."""
    rx = subprocess.Popen(
        ["ip", "netns", "exec", c.ns("B"), sys.executable, "-c", _RECEIVER, str(PORT),
         "1" if no_check_rx else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        seen = _udp_seen(c)
        c.run("A", *send)
        deadline = time.monotonic() + 30
        while _udp_seen(c) < seen + count and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the counter: the kernel signals nothing else
        assert _udp_seen(c) >= seen + count, "the datagrams never reached B's UDP layer"
        c.run("B", sys.executable, "-c", _STOP, str(PORT))
        out, _ = rx.communicate(timeout=30)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    return out.splitlines()


def _scapy_send(dst: str, zero_checksum: bool) -> list[str]:
    code = textwrap.dedent(
        f"""
        from scapy.all import IPv6, UDP, conf, send
        conf.verb = 0
        udp = UDP(sport=40000, dport={PORT})
        if {zero_checksum}:
            udp.chksum = 0
        send(IPv6(src="fd00:1::1", dst="{dst}", fl=0x54321) / udp / (b"y" * 100), iface="a0")
        """
    )
    return [sys.executable, "-c", code]


def _labelled_send(dst: str) -> list[str]:
    """A normal UDP socket in A sends 100 bytes to ``dst`` once per label of LABELS, each
    with its own flow label (IPV6_FLOWINFO_SEND and sin6_flowinfo)."""
    code = textwrap.dedent(
        f"""
        import socket
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IPV6, 33, 1)  # IPV6_FLOWINFO_SEND
        for label in {LABELS!r}:
            s.sendto(b"x" * 100, ("{dst}", {PORT}, label, 0))
        """
    )
    return [sys.executable, "-c", code]


def test_a_checksum_over_the_usid_container_is_dropped_at_the_end(chain: Chain) -> None:
    c = chain
    c.ip("B", "addr", "add", "fcbb:bb00:300::/128", "dev", "lo")  # B's uN, the last shift
    before = c.snmp6("B", "Udp6InCsumErrors")
    got = _receive(c, _scapy_send("fcbb:bb00:100:200:300::", zero_checksum=False), True)
    assert got == []
    assert c.snmp6("B", "Udp6InCsumErrors") == before + 1
    # the same datagram with a zero checksum: only a socket that allows it takes it
    got = _receive(c, _scapy_send("fcbb:bb00:100:200:300::", zero_checksum=True), False)
    assert got == [] and c.snmp6("B", "Udp6InCsumErrors") == before + 2
    got = _receive(c, _scapy_send("fcbb:bb00:100:200:300::", zero_checksum=True), True)
    assert got == [f"100 {0x54321}"]


def test_encapsulated_at_the_sender_and_decapsulated_at_the_last_leaf(chain: Chain) -> None:
    c = chain
    c.ip("A", "-6", "route", "add", "fd00:b::2/128", "encap", "seg6", "mode", "encap.red",
         "segs", "fcbb:bb00:100:f200::", "dev", "a0")  # fmt: skip
    dump = subprocess.Popen(
        ["ip", "netns", "exec", c.ns("R2"), sys.executable, "-c", _DUMP, "r2a", "b0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert dump.stdout is not None and dump.stdout.readline().strip() == "ready"
        errors = c.snmp6("B", "Udp6InCsumErrors")
        got = _receive(c, _labelled_send("fd00:b::2"), False, count=len(LABELS))
    finally:
        dump.terminate()
        seen, _ = dump.communicate(timeout=30)
    assert got == [f"100 {label}" for label in LABELS]
    assert c.snmp6("B", "Udp6InCsumErrors") == errors
    fabric = [line.split() for line in seen.splitlines()]
    # on the R1-R2 link: IPv6-in-IPv6 (41) to the shifted container, no routing header, the
    # datagram's own flow label on the outer header
    assert [(dst, nh, int(label)) for dst, nh, label in fabric] == [
        ("fcbb:bb00:f200::", "41", label) for label in LABELS
    ], fabric


#: what arrives on R2's r2a (from R1), one line per IPv6 datagram but the kernel's own:
#: "<destination> <next header> <flow label>"
_DUMP = textwrap.dedent(
    """
    import ipaddress, socket, sys
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x86DD))
    s.bind((sys.argv[1], 0))
    print("ready", flush=True)
    while True:
        frame, addr = s.recvfrom(4096)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        ip = frame[14:]
        if ip[6] in (0, 58):  # hop-by-hop (MLD) and ICMPv6: the kernel's own
            continue
        label = int.from_bytes(ip[1:4], "big") & 0xFFFFF
        print(ipaddress.IPv6Address(ip[24:40]), ip[6], label, flush=True)
    """
)
