"""Congestion signals of a ``--trim`` fabric: CE marks on fabric ports echoed back to senders,
and the strict-priority band that lets trimmed headers overtake queued data.

Topology: 2 planes, ONE spine per plane, 100 Mbit/s links, MTU 9000; h0, h1 (leaf 0) and h2
(leaf 1) write 8 MiB each into h3 (leaf 1) with a fixed window of 24 (test_incast's run).  With
one spine, h0's and h1's traffic shares each plane's leaf-0 uplink: that port between routers
queues (CE marks and trims there), as do the spine's port into leaf 1 and the last hop into h3
(trims, never CE marks: congestion on the port into the destination says nothing about the
path).

The priority band is measured on the wire with kernel timestamps (SO_TIMESTAMPNS on packet
sockets): at leaf p0l0, from a data packet's arrival on a host port to its departure on the
spine port, for packets that leave whole and for those that leave trimmed; and at h0, from a
data packet's last transmission to the NACK that names it.  Both with the band and without it
(``--no-prio-band``: the plain tbf of before).  Figures are printed (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import select
import socket
import statistics
import struct
import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fabric.fabric_helpers import running_fabric, unique_name
from fabric.test_incast import TRIM_REASON, _udp_payload, check_complete, run_incast

from mrc import wire
from mrc.lab.fabric import Fabric, FabricSpec, Topology, netns
from mrc.lab.fabric.kernel import HTB_PRIO_CLASS, NsHandle
from mrc.topology.model import SRV6_MODES
from mrc.transport.sockets import SO_RCVBUFFORCE

pytestmark = [pytest.mark.netns]

RATE = "100mbit"
SIZE = "8M"

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
PACKET_OUTGOING = 4
SNAP = 200  # Ethernet + IPv6 + SRH with two segments + UDP + an ACK: all we parse


@contextlib.contextmanager
def _fabric(prio_band: bool, srv6: str = "usid") -> Iterator[Topology]:
    if TRIM_REASON is not None:
        pytest.skip(TRIM_REASON)
    spec = FabricSpec(
        name=unique_name("g"),
        planes=2,
        spines=1,
        mtu=9000,
        rate=RATE,
        trim=True,
        prio_band=prio_band,
        srv6=srv6,
    )
    with running_fabric(spec) as topo:
        yield topo


@pytest.fixture(scope="module", params=SRV6_MODES)
def band_fabric(request: pytest.FixtureRequest) -> Iterator[Topology]:
    """With each kind of route: CE marks and the band act on uSID and SRH packets alike."""
    with _fabric(prio_band=True, srv6=request.param) as topo:
        yield topo


def port_counters(topo: Topology) -> dict[str, dict[str, Any]]:
    """``router:ifname`` -> the program's counters for that egress, from status --json."""
    out = {}
    for lk in Fabric.status(topo.name)["links"]:
        for node, end in ((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"])):
            if "trim" in end:
                out[f"{node}:{end['ifname']}"] = end["trim"]
    return out


def test_ce_marks_on_fabric_ports_are_echoed(band_fabric: Topology) -> None:
    topo = band_fabric
    before = port_counters(topo)
    run = run_incast(topo, 4821, capture=False, size=SIZE)
    after = port_counters(topo)
    check_complete(run, topo, 8 << 20)
    marks = {k: after[k]["ce_marked"] - before[k]["ce_marked"] for k in after}
    fabric_ports = {k for k, v in after.items() if not v["lasthop"]}
    lasthop_ports = set(after) - fabric_ports
    summary = {
        "ce_marked": {k: v for k, v in marks.items() if v},
        "ce_received": sum(r["ce_received"] for r in run.recvs),
        "ecn_echoes": {h: s["ecn_echoes"] for h, s in run.sends.items()},
        "sacks": {h: s["sacks"] for h, s in run.sends.items()},
    }
    print("\nECN on the fabric:", json.dumps(summary))
    # the leaf-0 uplinks (shared by h0 and h1) queue: marked there
    assert all(marks[f"p{p}l0:s0"] > 0 for p in range(topo.planes)), marks
    # last hops never mark, though their queues went past where a fabric port would have
    assert sum(marks[k] for k in lasthop_ports) == 0, marks
    assert all(after[k]["ecn_limit"] is None for k in lasthop_ports)
    ecn_limit = after["p0l0:s0"]["ecn_limit"]
    assert 0 < ecn_limit < after["p0l0:s0"]["limit"]
    assert max(after[f"p{p}l1:h3"]["max_backlog"] for p in range(topo.planes)) > ecn_limit
    # every packet the senders sent was ECN-capable: the routers saw them as such
    assert after["p0l0:s0"]["ect_pkts"] - before["p0l0:s0"]["ect_pkts"] > 0
    # the receiver read CE and the senders heard of it through BECN
    assert summary["ce_received"] > 0, summary
    for h in ("h0", "h1"):
        assert run.sends[h]["ecn_echoes"] > 0, summary


# ---- the priority band ----------------------------------------------------------------------


def _snap_ipv6(sock: socket.socket) -> None:
    """Classic BPF: IPv6 frames only, and only their first SNAP bytes (no 9 kB copies)."""
    prog = [
        (0x28, 0, 0, 12),  # ldh [12]: EtherType
        (0x15, 0, 1, 0x86DD),  # jeq IPv6
        (0x06, 0, 0, SNAP),  # ret SNAP
        (0x06, 0, 0, 0),  # ret 0
    ]
    insns = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    sock.setsockopt(
        socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", len(prog), ctypes.addressof(insns))
    )


@dataclass
class Tap:
    """Frames seen on interfaces in several namespaces, with the kernel's receive timestamp."""

    ports: list[tuple[str, str]]  # (namespace, ifname)
    frames: list[tuple[int, float, bool, bytes]] = field(default_factory=list)
    socks: list[socket.socket] = field(default_factory=list)

    def open(self) -> None:
        for i, (ns, ifname) in enumerate(self.ports):
            with netns.entered(ns):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            _snap_ipv6(s)
            s.bind((ifname, ETH_P_ALL))
            s.setblocking(False)
            self.socks.append(s)
            assert len(self.socks) == i + 1

    def run(self, stop: threading.Event) -> None:
        space = socket.CMSG_SPACE(16)
        try:
            while not stop.is_set():
                for s in select.select(self.socks, [], [], 0.05)[0]:
                    i = self.socks.index(s)
                    while True:
                        try:
                            frame, anc, _fl, addr = s.recvmsg(SNAP, space)
                        except BlockingIOError:
                            break
                        t = 0.0
                        for level, kind, data in anc:
                            if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
                                sec, nsec = struct.unpack("=qq", data[:16])
                                t = sec + nsec * 1e-9
                        self.frames.append((i, t, addr[2] == PACKET_OUTGOING, frame))
        finally:
            for s in self.socks:
                s.close()


def _mrc(frame: bytes) -> tuple[bytes, bytes, bytes] | None:
    got = _udp_payload(frame)
    if got is None or len(got[2]) < wire.BTH_LEN:
        return None
    return got


def router_sojourns(tap: Tap, ingress: set[int], egress: int) -> dict[str, list[float]]:
    """Per data packet crossing the router: egress tap time - ingress tap time (seconds),
    split by whether it left whole or trimmed.  Retransmissions share a PSN: matched in order."""
    arrived: dict[tuple[bytes, int], deque[float]] = defaultdict(deque)
    out: dict[str, list[float]] = {"whole": [], "trimmed": []}
    for i, t, outgoing, frame in sorted(tap.frames, key=lambda f: f[1]):
        got = _mrc(frame)
        if got is None:
            continue
        src, _dst, pl = got
        if pl[0] not in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM):
            continue
        key = (src, int.from_bytes(pl[9:12], "big"))
        if i in ingress and not outgoing:
            arrived[key].append(t)
        elif i == egress and outgoing and arrived[key]:
            kind = "trimmed" if pl[4] & wire.BTH_TRIMMED else "whole"
            out[kind].append(t - arrived[key].popleft())
    return out


def nack_rtts(tap: Tap) -> list[float]:
    """At a sender's NICs: from a data packet's latest transmission to a trim NACK naming it."""
    sent: dict[int, float] = {}
    rtts = []
    for _i, t, outgoing, frame in sorted(tap.frames, key=lambda f: f[1]):
        got = _mrc(frame)
        if got is None:
            continue
        pl = got[2]
        psn = int.from_bytes(pl[9:12], "big")
        if outgoing and pl[0] in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM):
            sent[psn] = t
        elif not outgoing and pl[0] == wire.Opcode.ACKNOWLEDGE and len(pl) >= wire.ACK_LEN:
            f = wire.ACK_PKT.unpack_from(pl)
            syndrome = f[5] >> 24
            code = syndrome & 0x1F
            if syndrome & 0x60 == wire.AETH_NAK_BASE and code in (16, 17):
                subject = f[6] & wire.PSN_MASK
                if subject in sent:
                    rtts.append(t - sent[subject])
    return rtts


def _ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)


#: trimmed headers, and whole packets that met a queue, a measurement wants before it
#: compares medians
MIN_TRIMMED = 21
#: one full frame at the link rate (seconds): a whole packet that waited longer met a queue
FRAME_S = 9014 * 8 / 100e6
#: incasts a measurement may run to collect them
MAX_ROUNDS = 4


def _one_incast(topo: Topology, port: int) -> tuple[dict[str, list[float]], list[float]]:
    """One incast with taps at leaf p0l0 (host ports in, spine port out) and at h0: the
    router sojourns of the packets it forwarded and h0's NACK round trips."""
    leaf = topo.netns_of("p0l0")
    tap = Tap([(leaf, "h0"), (leaf, "h1"), (leaf, "s0"), (topo.netns_of("h0"), "p0")])
    tap.open()
    stop = threading.Event()
    thread = threading.Thread(target=tap.run, args=(stop,), daemon=True)
    thread.start()
    try:
        run = run_incast(topo, port, capture=False, size=SIZE)
    finally:
        stop.set()
        thread.join(5)
    check_complete(run, topo, 8 << 20)
    soj = router_sojourns(tap, ingress={0, 1}, egress=2)
    h0 = Tap(tap.ports[3:], [f for f in tap.frames if f[0] == 3])
    return soj, nack_rtts(h0)


def _queued(soj: dict[str, list[float]]) -> list[float]:
    """The sojourns of the whole packets that met a queue (waited more than a frame time)."""
    return [t for t in soj["whole"] if t > FRAME_S]


def measure(topo: Topology, port: int) -> dict[str, Any]:
    """Router sojourns and NACK round trips of incasts, run until MIN_TRIMMED headers were
    trimmed (at most MAX_ROUNDS). On a busy machine the two senders start further apart and
    one incast may trim only a few packets: more incasts, not a weaker assertion."""
    soj: dict[str, list[float]] = {"whole": [], "trimmed": []}
    rtts: list[float] = []
    rounds = 0
    while rounds < MAX_ROUNDS and min(len(soj["trimmed"]), len(_queued(soj))) < MIN_TRIMMED:
        one, more = _one_incast(topo, port + 100 * rounds)
        rounds += 1
        for k in soj:
            soj[k] += one[k]
        rtts += more
    return {
        "rounds": rounds,
        "whole": len(soj["whole"]),
        "trimmed": len(soj["trimmed"]),
        "whole_sojourn_ms_p50": _ms(soj["whole"], 0.5),
        "queued": len(_queued(soj)),
        "queued_sojourn_ms_p50": _ms(_queued(soj), 0.5),
        "trimmed_sojourn_ms_p50": _ms(soj["trimmed"], 0.5),
        "trimmed_sojourn_ms_p90": _ms(soj["trimmed"], 0.9),
        "nacks": len(rtts),
        "nack_rtt_ms_p50": _ms(rtts, 0.5),
        "nack_rtt_ms_p90": _ms(rtts, 0.9),
        "raw": soj,
    }


def _prio_class_packets(topo: Topology, router: str, ifname: str) -> int:
    """Packets the htb's priority class (1:10) sent on a router port."""
    h = NsHandle(topo.netns_of(router))
    try:
        for c in h.ipr.get_classes(index=h.index(ifname)):
            if c["handle"] == HTB_PRIO_CLASS:
                return int(c.get("TCA_STATS2").get("TCA_STATS_BASIC")["packets"])
    finally:
        h.close()
    return 0


def test_trimmed_headers_overtake_queued_data(band_fabric: Topology) -> None:
    """With the band a trimmed header leaves leaf p0l0 within a frame time or two of arriving,
    while whole packets wait in the queue; the htb's priority class really carried them (so
    the skb->priority the program set at ingress survived IPv6 forwarding)."""
    topo = band_fabric
    prio_before = _prio_class_packets(topo, "p0l0", "s0")
    prog_before = port_counters(topo)["p0l0:s0"]["prio_pkts"]
    m = measure(topo, 4822)
    prio_sent = _prio_class_packets(topo, "p0l0", "s0") - prio_before
    prog_prio = port_counters(topo)["p0l0:s0"]["prio_pkts"] - prog_before
    print("\nwith the priority band:", json.dumps({k: v for k, v in m.items() if k != "raw"}))
    print(f"p0l0:s0 priority class sent {prio_sent}, program classified {prog_prio}")
    assert m["trimmed"] > 20 and m["whole"] > 100, m
    # skb->priority survived forwarding: the htb class got what the program put there
    assert prog_prio > 0 and prio_sent >= 0.95 * prog_prio, (prio_sent, prog_prio)
    assert m["trimmed_sojourn_ms_p50"] < 2 * FRAME_S * 1000, m  # 0.72 ms a frame
    # against the whole packets that met a queue: on a busy machine the two senders start
    # further apart and most whole packets may meet none (a median of 0.012 ms, once)
    assert m["queued"] >= MIN_TRIMMED, m
    assert m["trimmed_sojourn_ms_p50"] < 0.5 * m["queued_sojourn_ms_p50"], m


def test_without_the_band_trimmed_headers_wait(band_fabric: Topology) -> None:
    """The same run on a fabric with the plain tbf: trimmed headers queue like data, so their
    sojourn and the NACK round trip are longer than with the band (the figures in
    docs/FABRIC.md, "Priority band")."""
    with _fabric(prio_band=False) as plain:
        before = measure(plain, 4823)
    after = measure(band_fabric, 4824)
    table = {
        name: {k: v for k, v in m.items() if k != "raw"}
        for name, m in (("tbf", before), ("band", after))
    }
    print("\ntrimmed header sojourn and NACK RTT, tbf vs band:", json.dumps(table))
    assert before["trimmed"] > 20 and after["trimmed"] > 20, table
    assert before["trimmed_sojourn_ms_p50"] > 2 * after["trimmed_sojourn_ms_p50"], table
    assert statistics.median(after["raw"]["trimmed"]) < statistics.median(before["raw"]["trimmed"])
