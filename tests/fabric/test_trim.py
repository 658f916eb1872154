"""``mrc-fabric up --trim``: packet trimming on the routers (tc eBPF), end to end.

One shaped fabric (1 plane, 2 spines, 2 leaves, 4 hosts: h0,h1 on leaf 0, h2,h3 on leaf 1, every
link 50 Mbit/s) with trimming, one without.  Senders blast MRC-shaped UDP datagrams
(``wire.pack_data`` + payload) well over a link's rate for ~0.5 s and the receiver reads them
with a plain UDP socket, while an AF_PACKET socket captures the frames for checksum checks.

Host NICs have transmit checksum offload turned off on a --trim fabric, so every UDP checksum
is real and the receiving kernel verifies it: a trimmed datagram that reaches the socket has a
valid checksum (``test_receiver_verifies_checksums`` proves the receiver really checks).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from fabric.fabric_helpers import (
    REPO,
    SKIP_REASON,
    needs_netns,
    run_cli,
    running_fabric,
    unique_name,
)

from mrc import wire
from mrc.lab.fabric import Fabric, FabricSpec, Topology, load_topology, netns
from mrc.lab.fabric.pathsock import open_path_socket
from mrc.lab.fabric.trim import read_router, router_pin_dir, unavailable_reason
from mrc.security.handshake import new_nonce, session_keys, transcript
from mrc.security.packet import DATA_OVERHEAD, SEC_BLOCK_LEN, Mode, Opener, Sealer
from mrc.srv6.paths import default_path, path_via
from mrc.topology.model import SRV6_MODES, topology_path
from mrc.transport.gso import UDP_SEGMENT
from mrc.transport.sockets import SO_RCVBUFFORCE

TRIM_REASON = unavailable_reason() if SKIP_REASON is None else SKIP_REASON
needs_trim = pytest.mark.skipif(
    TRIM_REASON is not None, reason=f"trimming unavailable: {TRIM_REASON}"
)

if TYPE_CHECKING:
    from pathlib import Path
pytestmark = [needs_netns, needs_trim, pytest.mark.netns]

RATE = "50mbit"
# one direction's keys for the protected flows (integrity mode: payload in clear)
KEYS = session_keys(bytes(32), transcript(new_nonce(), new_nonce(), b"trim test"))[0]
SEALER = Sealer(KEYS, Mode.INTEGRITY)
PAY = 1400  # UDP payload 1428: a 1476-byte IPv6 packet, fits MTU 1500
PAY_SRH = 1360  # + a 40-byte SRH (2 segments) still fits
PPS = 3600  # per sender: ~43 Mbit/s, just under the 50 Mbit/s of its own NIC
PORT = 7300
ETH_P_IPV6 = 0x86DD
T, L = wire.BTH_TRIMMED, wire.BTH_LASTHOP


def _spec(tag: str, trim: bool, srv6: str = "usid") -> FabricSpec:
    return FabricSpec(
        name=unique_name(tag),
        planes=1,
        spines=2,
        leaves=2,
        hosts=4,
        rate=RATE,
        trim=trim,
        srv6=srv6,
    )


@pytest.fixture(scope="module", params=SRV6_MODES)
def tfab(request: pytest.FixtureRequest) -> Iterator[Topology]:
    """The trimming fabric with each kind of route: the program reads IPv6-in-IPv6 to uSID
    containers and SRHs alike."""
    with running_fabric(_spec("r", trim=True, srv6=request.param)) as topo:
        yield topo


# --- traffic --------------------------------------------------------------------------------


def payload(qpn: int, psn: int, size: int) -> bytes:
    return bytes([(qpn * 31 + psn) & 0xFF]) * size


def mrc_packet(qpn: int, psn: int, size: int, imm: bool = False) -> bytes:
    hdr = wire.pack_data(qpn, psn, psn * size, 0x1234, size, False, 0xABCD if imm else None)
    return hdr + payload(qpn, psn, size)


@dataclass
class Flow:
    """One sender: host ``src`` to the receiver, by plain routing or ``via`` a spine."""

    src: str
    qpn: int
    via: str | None = None
    kind: str = "write"  # write | imm | junk | gso | secure | secure_imm
    sent: int = 0
    sealed: dict[int, bytes] = field(default_factory=dict)  # secure kinds: PSN -> datagram

    @property
    def header_len(self) -> int:
        """What a trim keeps: BTH + RETH (+ ImmDt) (+ the security block)."""
        hdr = wire.DATA_IMM_HDR_LEN if self.kind.endswith("imm") else wire.DATA_HDR_LEN
        return hdr + (SEC_BLOCK_LEN if self.kind.startswith("secure") else 0)

    def packet(self, n: int) -> bytes:
        size = PAY_SRH if self.via else PAY
        if self.kind.startswith("secure"):  # sealed once per PSN: the counter moves on
            if n not in self.sealed:
                size -= DATA_OVERHEAD
                imm = 0xABCD if self.kind == "secure_imm" else None
                hdr = wire.pack_data(self.qpn, n, n * size, 0x1234, size, False, imm)
                parts = SEALER.seal(hdr, payload(self.qpn, n, size))
                self.sealed[n] = b"".join(bytes(p) for p in parts)
            return self.sealed[n]
        if self.kind == "junk":  # not MRC: first byte anything but 0x0A / 0x0B
            first = 0x0C + (n % 200)
            return bytes([first]) + payload(self.qpn, n, wire.DATA_HDR_LEN + size - 1)
        return mrc_packet(self.qpn, n, size, imm=self.kind == "imm")


@dataclass
class Result:
    got: list[bytes] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)

    def of(self, qpn: int) -> list[bytes]:
        return [d for d in self.got if int.from_bytes(d[5:8], "big") == qpn]

    def trimmed(self) -> list[bytes]:
        return [d for d in self.got if d[4] & T]


def _send(topo: Topology, flow: Flow, dst: str, dur: float) -> None:
    if flow.via:
        path = path_via(topo, flow.src, dst, flow.via)
    else:
        path = default_path(topo, flow.src, dst, 0)
    sock = open_path_socket(path)
    addr = (path.dst_address, PORT)
    try:
        if flow.kind == "gso":  # UDP_SEGMENT super-packets of 8 MRC packets each
            seg = wire.DATA_HDR_LEN + PAY
            sock.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, seg)
        t0 = time.monotonic()
        n = 0
        while (now := time.monotonic() - t0) < dur:
            while n < int(now * PPS):
                try:
                    if flow.kind == "gso":
                        sock.sendto(b"".join(flow.packet(n + i) for i in range(8)), addr)
                        n += 8
                    else:
                        sock.sendto(flow.packet(n), addr)
                        n += 1
                except OSError:
                    n += 1
            time.sleep(0.0005)
        flow.sent = n
    finally:
        sock.close()


def blast(topo: Topology, flows: list[Flow], dst: str = "h2", dur: float = 0.5) -> Result:
    """Run ``flows`` at once towards ``dst``; return what its socket and NIC saw."""
    nic = topo.host(dst).nic(0)
    with netns.entered(topo.netns_of(dst)):
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IPV6))
    res = Result()
    stop = threading.Event()
    try:
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        cap.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
        rx.bind((nic.address, PORT))
        cap.bind((nic.nic, ETH_P_IPV6))
        rx.settimeout(0.2)
        cap.settimeout(0.2)

        def drain(sock: socket.socket, into: list[bytes]) -> None:
            while True:
                try:
                    into.append(sock.recv(65535))
                except TimeoutError:
                    if stop.is_set():
                        return

        readers = [
            threading.Thread(target=drain, args=(rx, res.got)),
            threading.Thread(target=drain, args=(cap, res.frames)),
        ]
        senders = [threading.Thread(target=_send, args=(topo, f, dst, dur)) for f in flows]
        for t in readers + senders:
            t.start()
        for t in senders:
            t.join()
        time.sleep(0.3)  # let the queues drain
        stop.set()
        for t in readers:
            t.join()
    finally:
        rx.close()
        cap.close()
    return res


# --- reading the fabric ----------------------------------------------------------------------


def port_counters(topo: Topology) -> dict[str, dict[str, Any]]:
    """{"<router>:<port>": trim counters of that port as an egress}."""
    out = {}
    for lk in Fabric.status(topo)["links"]:
        for node, end in ((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"])):
            if "trim" in end:
                out[f"{node}:{end['ifname']}"] = end["trim"]
    return out


def trims(topo: Topology) -> dict[str, int]:
    return {k: v["trimmed"] for k, v in port_counters(topo).items()}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


def qdisc_drops(topo: Topology, routers: bool) -> int:
    total = 0
    for lk in Fabric.status(topo)["links"]:
        for node, end in ((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"])):
            if (node.startswith("h")) != routers:
                total += end["qdisc_drops"]
    return total


def _router(topo: Topology, router: str) -> dict[str, Any]:
    """read_router of a router of a running fabric (None only for one without pins)."""
    st = read_router(topo.name, router)
    assert st is not None, f"{router} has no pinned maps"
    return st


def udp_checksum_ok(frame: bytes) -> bool:
    """Recompute the UDP checksum of a captured frame with scapy."""
    from scapy.layers.inet import UDP
    from scapy.layers.l2 import Ether

    pkt = Ether(frame)
    orig = pkt[UDP].chksum
    del pkt[UDP].chksum
    ok: bool = Ether(bytes(pkt))[UDP].chksum == orig
    return ok


def short_udp_frames(frames: list[bytes], nh: int = socket.IPPROTO_UDP) -> list[bytes]:
    """Captured IPv6 frames whose first next header is ``nh`` (UDP; 43 behind an SRH; 41 in
    IPv6-in-IPv6) too short to carry a payload."""
    return [f for f in frames if len(f) < 200 and f[14 + 6] == nh]


_T = TypeVar("_T")


def sample(items: list[_T], n: int = 400) -> list[_T]:
    step = max(1, len(items) // n)
    return items[::step]


def assert_counts_match(counted: int, arrived: int) -> None:
    """Every trimmed arrival was counted by a router; (nearly) every counted trim arrived (a
    badly starved receiver thread may lose a few datagrams in its socket buffer)."""
    assert counted >= arrived and arrived >= 0.98 * counted - 2, (counted, arrived)


def check_trimmed(res: Result, flows: list[Flow]) -> None:
    """Every trimmed datagram is exactly the sent headers, marked; every whole one intact."""
    kinds = {f.qpn: f for f in flows}
    for d in res.got:
        qpn, psn = int.from_bytes(d[5:8], "big"), int.from_bytes(d[9:12], "big")
        f = kinds[qpn]
        sent = f.packet(psn)
        if d[4] & T:
            keep = f.header_len
            assert len(d) == keep, (f, len(d))
            assert d[4] & ~(T | L) == 0
            assert d[:4] + d[5:] == sent[:4] + sent[5:keep], "trimmed headers changed"
        else:
            assert d == sent, f"untrimmed datagram of {f} damaged"


# --- tests -----------------------------------------------------------------------------------


def test_trim_fabric_setup(tfab: Topology) -> None:
    """Pins per router, the program on every router port's ingress, host USO/csum off."""
    assert load_topology(tfab.name).trim is True
    for r in tfab.routers:
        d = router_pin_dir(tfab.name, r.name)
        assert sorted(os.listdir(d)) == ["egress", "prog", "rstats"]
    from pyroute2.ethtool.ioctl import IoctlEthtool

    with netns.entered(tfab.netns_of("h0")):
        et = IoctlEthtool()
    try:
        et.change_ifname("p0")
        feats = et.get_features()
        assert not feats.is_active("tx-udp-segmentation")
        assert not feats.is_active("tx-checksum-ip-generic")
    finally:
        et.close()
    cfg = port_counters(tfab)
    assert cfg["p0l1:h2"]["lasthop"] and not cfg["p0l0:s0"]["lasthop"]
    assert not cfg["p0s0:l1"]["lasthop"]
    assert 0 < cfg["p0l1:h2"]["limit"] < cfg["p0l1:h2"]["hard_limit"]


def test_receiver_verifies_checksums(tfab: Topology) -> None:
    """On a --trim fabric the receiving kernel checks UDP checksums: a datagram with a bad one
    is not delivered, so 'a trimmed packet reached the socket' means 'its checksum is valid'."""
    src, dst = tfab.host("h0").nic(0).address, tfab.host("h2").nic(0).address
    with netns.entered(tfab.netns_of("h2")):
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    with netns.entered(tfab.netns_of("h0")):
        raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    with rx, raw:
        rx.bind((dst, PORT + 1))
        rx.settimeout(0.5)
        data = b"checksum probe"
        ulen = 8 + len(data)
        pseudo = (
            socket.inet_pton(socket.AF_INET6, src)
            + socket.inet_pton(socket.AF_INET6, dst)
            + struct.pack("!IxxxB", ulen, socket.IPPROTO_UDP)
        )

        def csum(b: bytes) -> int:
            b += b"\0" * (len(b) & 1)
            s = sum(struct.unpack(f"!{len(b) // 2}H", b))
            while s >> 16:
                s = (s & 0xFFFF) + (s >> 16)
            return (~s & 0xFFFF) or 0xFFFF

        good = csum(pseudo + struct.pack("!HHHH", 5555, PORT + 1, ulen, 0) + data)
        for check in (good ^ 0x0101, good):
            raw.sendto(struct.pack("!HHHH", 5555, PORT + 1, ulen, check) + data, (dst, 0))
        assert rx.recv(100) == data  # only the good one
        with pytest.raises(TimeoutError):
            rx.recv(100)


def test_incast_trims_at_last_hop_and_on_the_spine_uplink(tfab: Topology) -> None:
    """h0, h1, h3 -> h2 by plain routing: h0+h1 share leaf 0's uplink to spine 0 (trimmed
    there: TRIMMED only), and all three meet at leaf 1's port into h2 (TRIMMED|LASTHOP)."""
    flows = [Flow("h0", 1), Flow("h1", 2, kind="imm"), Flow("h3", 3)]
    before = trims(tfab)
    rdrops0, hdrops0 = qdisc_drops(tfab, routers=True), qdisc_drops(tfab, routers=False)
    res = blast(tfab, flows)
    d = delta(trims(tfab), before)

    trimmed = res.trimmed()
    assert len(trimmed) > 200, f"expected trims, got {len(trimmed)} of {len(res.got)}"
    check_trimmed(res, flows)
    assert {len(x) for x in res.of(2) if x[4] & T} == {wire.DATA_IMM_HDR_LEN}
    assert {len(x) for x in res.of(1) if x[4] & T} == {wire.DATA_HDR_LEN}
    lasthop = [x for x in trimmed if x[4] & L]
    assert lasthop and len(lasthop) < len(trimmed), "both last-hop and uplink trims expected"
    # the fabric's counters match what arrived
    assert set(d) <= {"p0l1:h2", "p0l0:s0"}, d
    assert_counts_match(d.get("p0l1:h2", 0), len(lasthop))
    assert_counts_match(d.get("p0l0:s0", 0), len(trimmed) - len(lasthop))
    # trimmed, not dropped: no router queue overflowed; what entered the fabric arrived
    assert qdisc_drops(tfab, routers=True) == rdrops0
    entered = sum(f.sent for f in flows) - (qdisc_drops(tfab, routers=False) - hdrops0)
    assert len(res.got) >= 0.99 * entered - 2, (len(res.got), entered)
    # scapy agrees the trimmed datagrams' UDP checksums are valid (a sample: scapy is slow)
    short = short_udp_frames(res.frames)
    assert len(short) >= len(trimmed)
    assert all(udp_checksum_ok(f) for f in sample(short))


def test_protected_packets_trim_to_an_authentic_header(tfab: Topology) -> None:
    """With S set the trim keeps the security block: the receiver authenticates every trimmed
    header (its ICV was computed with T/L clear), and every whole datagram in full."""
    flows = [Flow("h0", 21, kind="secure"), Flow("h1", 22, kind="secure_imm"), Flow("h3", 23)]
    res = blast(tfab, flows)
    check_trimmed(res, flows)
    trimmed = [d for d in res.trimmed() if int.from_bytes(d[5:8], "big") in (21, 22)]
    assert len(trimmed) > 100, f"expected trimmed protected packets, got {len(trimmed)}"
    opener = Opener(KEYS, Mode.INTEGRITY)
    authentic = whole = 0
    for d in res.of(21) + res.of(22):
        hdr_len = (
            wire.DATA_IMM_HDR_LEN if d[0] == wire.Opcode.RDMA_WRITE_ONLY_IMM else wire.DATA_HDR_LEN
        )
        ctr = opener.open_headers(memoryview(d), hdr_len)  # raises if not authentic
        if d[4] & T:
            assert len(d) == hdr_len + SEC_BLOCK_LEN
            authentic += 1
        else:
            opener.open_payload(memoryview(d), hdr_len, ctr)
            whole += 1
        opener.accept(ctr)
    assert authentic == len(trimmed) and whole > 0


def test_srv6_paths_trim(tfab: Topology) -> None:
    """Source-routed through spine p0s1 (an SRH on the wire, or a uSID container in an outer
    IPv6 header): the leaf 0 uplink to p0s1 and the spine's port to leaf 1 congest; trims there
    carry a checksum over the final destination."""
    flows = [Flow("h0", 11, via="p0s1"), Flow("h1", 12, via="p0s1"), Flow("h3", 13, via="p0s1")]
    before = trims(tfab)
    res = blast(tfab, flows)
    d = delta(trims(tfab), before)
    trimmed = res.trimmed()
    assert len(trimmed) > 200, f"expected trims, got {len(trimmed)} of {len(res.got)}"
    check_trimmed(res, flows)
    assert d.get("p0l0:s1", 0) > 0 and d.get("p0s1:l1", 0) > 0, d
    assert_counts_match(sum(d.values()), len(trimmed))
    short = short_udp_frames(res.frames, 43 if tfab.srv6 == "srh" else 41)
    assert len(short) >= len(trimmed)
    assert all(udp_checksum_ok(f) for f in sample(short))


def test_uplink_trim_is_not_lasthop(tfab: Topology) -> None:
    """h0 -> h2 and h1 -> h3 both turn at spine 0: only leaf 0's uplink congests, so every trim
    is TRIMMED without LASTHOP.  h1 sends UDP_SEGMENT super-packets: the host NIC segments them
    in software (USO off), so the router sees and trims ordinary packets."""
    flows_a = [Flow("h0", 21)]
    flows_b = [Flow("h1", 22, kind="gso")]
    before = trims(tfab)
    gso0 = sum(_router(tfab, r.name)["router"]["gso"] for r in tfab.routers)
    out: dict[str, Result] = {}
    ta = threading.Thread(target=lambda: out.setdefault("a", blast(tfab, flows_a, "h2")))
    tb = threading.Thread(target=lambda: out.setdefault("b", blast(tfab, flows_b, "h3")))
    ta.start()
    tb.start()
    ta.join()
    tb.join()
    d = delta(trims(tfab), before)
    assert set(d) == {"p0l0:s0"}, d
    got = out["a"].trimmed() + out["b"].trimmed()
    assert got and all(x[4] & (T | L) == T for x in got)
    assert len(out["b"].trimmed()) > 0 and len(out["b"].of(22)) > 0
    check_trimmed(out["a"], flows_a)
    check_trimmed(out["b"], flows_b)
    assert_counts_match(d["p0l0:s0"], len(got))
    gso1 = sum(_router(tfab, r.name)["router"]["gso"] for r in tfab.routers)
    assert gso1 == gso0, "GSO super-packets reached a router"


def test_non_mrc_is_never_trimmed(tfab: Topology) -> None:
    """UDP whose payload does not start with a data BTH passes whole (tbf drops the excess)."""
    flows = [Flow("h0", 31, kind="junk"), Flow("h1", 32, kind="junk"), Flow("h3", 33, kind="junk")]
    before = trims(tfab)
    rdrops0 = qdisc_drops(tfab, routers=True)
    res = blast(tfab, flows)
    assert res.got
    assert {len(x) for x in res.got} == {wire.DATA_HDR_LEN + PAY}
    assert delta(trims(tfab), before) == {}
    assert qdisc_drops(tfab, routers=True) > rdrops0  # overload became tail drop


def test_status_cli_reports_trim_counters(tfab: Topology) -> None:
    res = run_cli("status", "--name", tfab.name, "--json")
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)
    assert st["trim"] is True and set(st["trim_routers"]) == {r.name for r in tfab.routers}
    ends = {
        f"{lk[s]}:{lk[s + '_end']['ifname']}": lk[s + "_end"] for lk in st["links"] for s in "ab"
    }
    assert ends["p0l1:h2"]["trim"]["trimmed"] > 0
    assert "trim" not in ends["h2:p0"]  # hosts do not trim
    text = run_cli("status", "--name", tfab.name)
    assert text.returncode == 0 and "TRIMS" in text.stdout.splitlines()[0]


def test_without_trim_overload_is_tail_drop() -> None:
    with running_fabric(_spec("n", trim=False)) as topo:
        assert not os.path.exists(f"/sys/fs/bpf/mrc-{topo.name}")
        flows = [Flow("h0", 41), Flow("h1", 42), Flow("h3", 43)]
        res = blast(topo, flows)
        check_trimmed(res, flows)
        assert res.got and not res.trimmed()
        assert {len(x) for x in res.got} == {wire.DATA_HDR_LEN + PAY}
        assert qdisc_drops(topo, routers=True) > 100
        assert len(res.got) < 0.8 * sum(f.sent for f in flows)


def test_down_removes_pins_even_after_a_crash() -> None:
    spec = FabricSpec(
        name=unique_name("c"), planes=1, spines=1, leaves=1, hosts=2, rate="10mbit", trim=True
    )
    pins = f"/sys/fs/bpf/mrc-{spec.name}"
    try:
        topo = Fabric.up(spec)
        assert os.path.isdir(pins)
        # a crash: namespaces and topology file gone, pins left behind
        for node in topo.nodes():
            netns.remove(topo.netns_of(node))
        topology_path(spec.name).unlink()
        assert Fabric.list()[spec.name] == {"namespaces": 0, "topology": None, "bpf_pins": pins}
    finally:
        Fabric.down(spec.name)
    assert not os.path.exists(pins)
    assert spec.name not in Fabric.list()
    Fabric.down(spec.name)  # idempotent


def test_trim_needs_rate_and_tools(tmp_path: Path) -> None:
    res = run_cli("up", "--name", unique_name("e"), "--trim")
    assert res.returncode == 2 and "--trim needs --rate" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # empty object cache and no clang on PATH: one line telling what to install
    env = {**os.environ, "PYTHONPATH": str(REPO), "MRC_FABRIC_DIR": str(tmp_path), "PATH": "/"}
    env.pop("MRC_DEBUG", None)
    name = unique_name("e")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrc.lab.cli.fabric",
            "up",
            "--name",
            name,
            "--rate",
            "1mbit",
            "--trim",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    assert "install clang libbpf-dev (tools/setup.sh does)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert name not in Fabric.list()
