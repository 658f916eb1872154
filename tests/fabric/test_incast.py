"""Incast over a shaped fabric: h0, h1 and h2 write into h3 at once (``mrc-recv --count 3``).

Every link runs at RATE; h3 has 4 x RATE of last hop and the three senders offer up to 12 x RATE,
so the leaf ports into h3 are the bottleneck.  Four spines per plane (not the default two) keep
the leaf-spine links out of it: h0 and h1 share leaf 0, and with two spines its uplinks would run
at exactly 1:1 and trim too.

With ``mrc-fabric up --trim`` the leaves cut the overflow down to headers (marked TRIMMED +
LASTHOP, since the port faces the destination); h3 answers each with a TRIMMED_LASTHOP NACK and
the sender retransmits at once, and should not blame the path (no SKIP, no ASSUMED_BAD: the
latter is test_incast_lasthop_trims_do_not_retire_evs).  Without trimming,
tbf tail-drops the overflow and recovery takes SACK evidence or timeouts; that must complete too.

Why ``--cc fixed --window 24``: this module tests what trimming does to senders that do not back
off (a fixed window; NSCC, the default, avoids most trims and has a test of its own at the end).
A fixed window of 512 x 8 KiB overflows the sender's *own* first hop (a host qdisc, which does not
trim), so that run measures host drops and timeouts, not incast.  24 packets (6 per plane) fit
in a sender's own NIC queues, while three senders (18 per plane) overflow both the trimming
threshold (~7 packets) and tbf's queue (~15 packets) of each last-hop port.  Without congestion
control nothing slows the senders down, so under trimming most packets are trimmed at least once
(retransmits > data packets): that is expected here, not a bug of the trimming.

The numbers of each run are printed (``pytest -s``) and attached with ``record_property``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fabric.fabric_helpers import SKIP_REASON, run_cli, running_fabric, unique_name

from mrc import wire
from mrc.lab.fabric import Fabric, FabricSpec, Topology, netns
from mrc.lab.harness.fabric import port_counters as trim_counters
from mrc.transport.sockets import SO_RCVBUFFORCE

if TYPE_CHECKING:
    from collections.abc import Callable

RATE = "100mbit"
SPINES = 4
SIZE = "32M"
WINDOW = 24
PAYLOAD = 8192
SENDERS = ("h0", "h1", "h2")
RECEIVER = "h3"
#: the counters of trim_counters (per port) that a run's figures are the deltas of
COUNTED = ("drops", "tbf_drops", "interface_drops", "trimmed", "tail_drops")
BIN = Path(sys.executable).parent


def _trim_unavailable() -> str | None:
    """Why this machine/checkout cannot run ``mrc-fabric up --trim`` (None if it can)."""
    if SKIP_REASON is not None:
        return SKIP_REASON
    helptext = run_cli("up", "--help").stdout
    if "--trim" not in helptext:
        return "`mrc-fabric up --help` has no --trim (packet trimming not implemented yet)"
    try:
        from mrc.lab.fabric.trim import unavailable_reason
    except ImportError as e:
        return f"mrc.lab.fabric.trim not importable: {e}"
    why = unavailable_reason()
    return None if why is None else f"trimming unavailable here: {why}"


TRIM_REASON = _trim_unavailable()
pytestmark = [pytest.mark.netns, pytest.mark.slow]


# ---- running the tools -----------------------------------------------------------------------


class Proc:
    """mrc-send / mrc-recv in a namespace; killed (whole session) if still running at close."""

    def __init__(self, ns: str, tool: str, *args: str) -> None:
        self.argv = ["ip", "netns", "exec", ns, str(BIN / tool), *args]
        self.p = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out = self.err = ""

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        try:
            self.out, self.err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.out, self.err = self.p.communicate()
            pytest.fail(f"{' '.join(self.argv)}: no exit in {timeout} s; stderr {self.err[-2000:]}")
        assert self.p.returncode == 0, (
            f"{' '.join(self.argv)} -> {self.p.returncode}: {self.err[-2000:]}"
        )
        return [json.loads(x) for x in self.out.splitlines() if x.startswith("{")]

    def kill(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGKILL)

    def wait_listening(self, port: int, timeout: float = 10.0) -> None:
        want = f":{port:04X} "
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                self.wait(1)
                pytest.fail(f"{' '.join(self.argv)} exited before listening")
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.p.pid}/net/tcp6").read_text().splitlines()[1:]:
                    cols = line.split()
                    if (cols[1] + " ").endswith(want) and cols[3] == "0A":
                        return
            time.sleep(0.01)
        pytest.fail(f"{' '.join(self.argv)} not listening on {port}")


# ---- capture of small packets at the receiver: trimmed headers in, ACK/NACKs out -------------

ETH_P_ALL = 0x0003  # not ETH_P_IPV6: a protocol-bound packet socket never sees outgoing frames
SO_ATTACH_FILTER = 26
PACKET_OUTGOING = 4
SMALL = 300  # trimmed data (~130 B with an SRH), ACK/NACK (~140 B); full data frames are ~8.3 kB


def _small_only(sock: socket.socket) -> None:
    """Classic BPF: accept frames of at most SMALL bytes, so the kernel never copies the 8 kB
    data frames to us."""
    prog = [
        (0x80, 0, 0, 0),  # ld len
        (0x25, 1, 0, SMALL),  # jgt SMALL -> drop
        (0x06, 0, 0, 0xFFFF),  # ret accept
        (0x06, 0, 0, 0),
    ]  # ret drop
    insns = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    sock.setsockopt(
        socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", len(prog), ctypes.addressof(insns))
    )


def _udp_payload(frame: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(src, final dst, UDP payload) of an IPv6/UDP frame, through any extension headers.

    With an SRH the IPv6 destination is the active segment (a spine SID on the way out); the
    final destination is Segment List[0]. With uSID routes the datagram is inside an outer
    IPv6 header (to a uSID container): source and destination are the inner header's."""
    if len(frame) < 62 or frame[12:14] != b"\x86\xdd":
        return None
    nh, off, src, dst = frame[20], 54, frame[22:38], frame[38:54]
    if nh == 41 and off + 40 <= len(frame):  # IPv6-in-IPv6
        nh, src, dst, off = (
            frame[off + 6],
            frame[off + 8 : off + 24],
            frame[off + 24 : off + 40],
            off + 40,
        )
    while nh in (0, 43, 60) and off + 2 <= len(frame):
        if nh == 43 and frame[off + 2] == 4 and off + 24 <= len(frame):
            dst = frame[off + 8 : off + 24]
        nh, off = frame[off], off + (frame[off + 1] + 1) * 8
    if nh != 17:
        return None
    return src, dst, frame[off + 8 :]


@dataclass
class Capture:
    """What h3's plane NICs saw: trimmed data headers in, NACKs out."""

    trimmed: dict[tuple[str, int], set[bool]] = field(default_factory=dict)  # (peer, psn) -> L?
    nacks: list[tuple[str, int, int]] = field(default_factory=list)  # (peer, psn, code)
    frames: int = 0

    def run(self, topo: Topology, stop: threading.Event, ready: threading.Event) -> None:
        owner = {
            socket.inet_pton(socket.AF_INET6, n.address): h.name for h in topo.hosts for n in h.nics
        }
        socks = []
        with netns.entered(topo.netns_of(RECEIVER)):
            for p in range(topo.planes):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
                _small_only(s)
                s.bind((f"p{p}", ETH_P_ALL))
                s.setblocking(False)
                socks.append(s)
        ready.set()
        try:
            while not stop.is_set():
                for s in select.select(socks, [], [], 0.05)[0]:
                    while True:
                        try:
                            frame, addr = s.recvfrom(2048)
                        except BlockingIOError:
                            break
                        self.frames += 1
                        self._parse(frame, addr[2] == PACKET_OUTGOING, owner)
        finally:
            for s in socks:
                s.close()

    def _parse(self, frame: bytes, outgoing: bool, owner: dict[bytes, str]) -> None:
        got = _udp_payload(frame)
        if got is None:
            return
        src, dst, pl = got
        if len(pl) < wire.BTH_LEN:
            return
        op, byte4, psn = pl[0], pl[4], int.from_bytes(pl[9:12], "big")
        if not outgoing and op in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM):
            if byte4 & wire.BTH_TRIMMED:
                key = (owner.get(src, "?"), psn)
                self.trimmed.setdefault(key, set()).add(bool(byte4 & wire.BTH_LASTHOP))
        elif outgoing and op == wire.Opcode.ACKNOWLEDGE and len(pl) >= wire.ACK_LEN:
            f = wire.ACK_PKT.unpack_from(pl)
            syndrome = f[5] >> 24
            if syndrome & 0x60 == wire.AETH_NAK_BASE:
                self.nacks.append((owner.get(dst, "?"), f[6] & wire.PSN_MASK, syndrome & 0x1F))


# ---- one incast run ---------------------------------------------------------------------------


@dataclass
class Incast:
    sends: dict[str, dict[str, Any]]
    recvs: list[dict[str, Any]]
    seconds: float
    fabric: dict[str, dict[str, Any]]  # per port deltas
    capture: Capture | None
    ev_reasons: dict[str, int]  # why senders' EVs became ASSUMED_BAD / SKIP (from --ev-log)

    def total(self, key: str) -> int:
        return sum(s[key] for s in self.sends.values())

    def fab(self, key: str, lasthop: bool | None = None) -> int:
        return sum(
            v[key] for v in self.fabric.values() if lasthop is None or v["lasthop"] == lasthop
        )

    def summary(self) -> dict[str, Any]:
        keys = (
            "retransmits",
            "retransmits_nack",
            "retransmits_sack",
            "retransmits_timeout",
            "nacks",
            "trims_seen",
            "evs_assumed_bad",
            "evs_skipped",
            "planes_lost",
        )
        out = {
            "wall_seconds": round(self.seconds, 3),  # includes process start-up
            "seconds": {h: s["seconds"] for h, s in self.sends.items()},
            "goodput_mbps": {h: round(s["goodput_bps"] / 1e6, 1) for h, s in self.sends.items()},
            # each sender's own bytes/seconds, summed: can exceed the last hop's 4 x RATE a bit
            # because the three processes do not start at exactly the same moment
            "sum_goodput_mbps": round(sum(s["goodput_bps"] for s in self.sends.values()) / 1e6, 1),
            **{k: self.total(k) for k in keys},
            "data_packets": self.total("data_packets"),
            "receiver_trims_seen": sum(r["trims_seen"] for r in self.recvs),
            "receiver_duplicates": sum(r["duplicates"] for r in self.recvs),
            "fabric_trims": self.fab("trimmed"),
            "fabric_trims_lasthop": self.fab("trimmed", lasthop=True),
            "fabric_drops": self.fab("drops"),
            "ev_reasons": self.ev_reasons,
        }
        if self.capture is not None:
            codes = [c for _, _, c in self.capture.nacks]
            out["nacks_captured"] = {
                "TRIMMED": codes.count(wire.NackCode.TRIMMED),
                "TRIMMED_LASTHOP": codes.count(wire.NackCode.TRIMMED_LASTHOP),
            }
        return out


def _mrc_tool(topo: Topology, host: str, tool: str, *args: str) -> Proc:
    """``tool`` (mrc-send or mrc-recv) in ``host``'s namespace on the fabric, JSON out."""
    return Proc(topo.netns_of(host), tool, "--fabric", topo.name, "--json", "--no-progress", *args)


def mrc_recv(topo: Topology, host: str, port: int, count: int, *extra: str) -> Proc:
    """``mrc-recv``: ``count`` transfers into memory."""
    listen = ("--listen", f"[::]:{port}", "--count", str(count), "--discard")
    return _mrc_tool(topo, host, "mrc-recv", *listen, *extra)


def mrc_send(topo: Topology, host: str, to: str, port: int, *args: str) -> Proc:
    """``mrc-send`` to ``to``; ``args`` say what to send."""
    return _mrc_tool(topo, host, "mrc-send", "--to", f"{to}:{port}", *args)


def run_incast(
    topo: Topology,
    port: int,
    capture: bool,
    size: str = SIZE,
    extra: tuple[str, ...] = (),
    send_extra: tuple[str, ...] = (),
) -> Incast:
    procs: list[Proc] = []
    stop, ready = threading.Event(), threading.Event()
    cap = Capture() if capture else None
    thread = None
    logdir = tempfile.TemporaryDirectory(prefix="mrc-incast-")
    try:
        recv = mrc_recv(topo, RECEIVER, port, len(SENDERS), *extra)
        procs.append(recv)
        recv.wait_listening(port)
        if cap is not None:
            thread = threading.Thread(target=cap.run, args=(topo, stop, ready), daemon=True)
            thread.start()
            assert ready.wait(5)
        before = trim_counters(topo)
        t0 = time.monotonic()
        senders = {}
        for h in SENDERS:
            senders[h] = mrc_send(
                topo,
                h,
                RECEIVER,
                port,
                "--size",
                size,
                "--payload",
                str(PAYLOAD),
                "--window",
                str(WINDOW),
                "--cc",
                "fixed",
                "--ev-log",
                f"{logdir.name}/{h}.jsonl",
                *extra,
                *send_extra,
            )
            procs.append(senders[h])
        sends = {h: p.wait(90)[0] for h, p in senders.items()}
        seconds = time.monotonic() - t0
        recvs = recv.wait(30)
        after = trim_counters(topo)
        reasons = ev_reasons(Path(logdir.name))
    finally:
        logdir.cleanup()
        stop.set()
        if thread is not None:
            thread.join(5)
        for p in procs:
            p.kill()
    fabric = {k: {**after[k], **{c: after[k][c] - before[k][c] for c in COUNTED}} for k in after}
    return Incast(sends, recvs, seconds, fabric, cap, reasons)


def ev_reasons(logdir: Path) -> dict[str, int]:
    """'ASSUMED_BAD: lost: later packets arrived' -> count, over every sender's EV log."""
    out: dict[str, int] = {}
    for f in sorted(logdir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            if d["to"] in ("ASSUMED_BAD", "SKIP"):
                key = f"{d['to']}: {re.sub(r'[0-9]+', 'N', d['reason'])}"
                out[key] = out.get(key, 0) + 1
    return out


def check_complete(run: Incast, topo: Topology, size: int = 32 << 20) -> None:
    assert len(run.recvs) == len(SENDERS), run.recvs
    addr_of = {h.name: {n.address for n in h.nics} for h in topo.hosts}
    by_sender = {}
    for r in run.recvs:
        assert r["ok"] is True, r
        (name,) = [h for h in SENDERS if r["from"] in addr_of[h]]
        by_sender[name] = r
    assert sorted(by_sender) == sorted(SENDERS)
    for h, s in run.sends.items():
        r = by_sender[h]
        assert s["ok"] is True, (h, s.get("error"))
        assert s["bytes"] == r["bytes"] == r["bytes_placed"] == size
        assert s["digest"] == s["digest_receiver"] == r["digest"] == r["digest_sender"], h


# ---- with trimming ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trimmed_run() -> Iterator[tuple[Topology, Incast]]:
    if TRIM_REASON is not None:
        pytest.skip(TRIM_REASON)
    spec = FabricSpec(name=unique_name("i"), spines=SPINES, mtu=9000, rate=RATE, trim=True)
    with running_fabric(spec) as topo:
        run = run_incast(topo, 4811, capture=True)
        print(f"\nincast with --trim ({RATE}, window {WINDOW}):", json.dumps(run.summary()))
        yield topo, run


def test_incast_with_trim_completes(
    trimmed_run: tuple[Topology, Incast], record_property: Callable[[str, object], None]
) -> None:
    topo, run = trimmed_run
    record_property("incast_trim", json.dumps(run.summary()))
    check_complete(run, topo)
    assert run.seconds < 60


def test_incast_trims_at_the_last_hop(trimmed_run: tuple[Topology, Incast]) -> None:
    topo, run = trimmed_run
    sm = run.summary()
    assert sm["fabric_trims"] > 0, sm
    # the incast is at the leaf ports into h3: that is where (almost) all trimming happens
    assert sm["fabric_trims_lasthop"] >= 0.8 * sm["fabric_trims"], sm
    lasthop_ports = {k for k, v in run.fabric.items() if v["lasthop"] and v["trimmed"]}
    assert lasthop_ports <= {f"p{p}l1:h3" for p in range(topo.planes)}, lasthop_ports
    # the receiver saw the trimmed headers (they are never dropped) and the senders heard of it
    assert 0 < sm["receiver_trims_seen"] <= sm["fabric_trims"], sm
    assert sm["receiver_trims_seen"] >= 0.9 * sm["fabric_trims"], sm
    assert sm["trims_seen"] > 0 and sm["nacks"] > 0, sm


def test_incast_retransmits_are_nack_driven(trimmed_run: tuple[Topology, Incast]) -> None:
    _, run = trimmed_run
    sm = run.summary()
    assert sm["retransmits_nack"] > 0, sm
    assert sm["retransmits_timeout"] <= max(2, 0.02 * sm["retransmits"]), sm
    assert sm["retransmits_nack"] >= sm["retransmits_sack"], sm


def test_incast_nacks_are_lasthop_for_lasthop_trims(trimmed_run: tuple[Topology, Incast]) -> None:
    """On the wire at h3: every NACK names a PSN that arrived trimmed, with the code matching
    the L bit the trimming router set (TRIMMED_LASTHOP for the leaf ports into h3)."""
    _, run = trimmed_run
    cap = run.capture
    assert cap is not None  # trimmed_run captures
    trim_codes = (wire.NackCode.TRIMMED, wire.NackCode.TRIMMED_LASTHOP)
    nacks = [n for n in cap.nacks if n[2] in trim_codes]
    assert len(nacks) == len(cap.nacks), "NACKs other than TRIMMED/TRIMMED_LASTHOP"
    assert nacks, (cap.frames, len(cap.trimmed))
    matched = wrong = 0
    for peer, psn, code in nacks:
        flags = cap.trimmed.get((peer, psn))
        if flags is None:
            continue  # the capture missed that trimmed header (or a retransmission of it)
        matched += 1
        wrong += (code == wire.NackCode.TRIMMED_LASTHOP) not in flags
    assert matched >= 0.9 * len(nacks), (matched, len(nacks))
    assert wrong == 0, (wrong, matched)
    lasthop = sum(1 for n in nacks if n[2] == wire.NackCode.TRIMMED_LASTHOP)
    assert lasthop >= 0.8 * len(nacks), (lasthop, len(nacks))


def test_incast_lasthop_trims_do_not_skip_evs(trimmed_run: tuple[Topology, Incast]) -> None:
    """SKIP comes only from TRIMMED (a congested path): LASTHOP trims (incast at the receiver)
    must not skip EVs, so there are at most as many skips as trims away from the last hop."""
    _, run = trimmed_run
    sm = run.summary()
    assert sm["evs_skipped"] <= run.fab("trimmed", lasthop=False), sm


def test_incast_lasthop_trims_do_not_retire_evs(trimmed_run: tuple[Topology, Incast]) -> None:
    """With trimming the fabric loses nothing (no drops), so no EV deserves ASSUMED_BAD: every
    retirement here is a false accusation of a path for what is incast at the receiver."""
    _, run = trimmed_run
    sm = run.summary()
    assert sm["fabric_drops"] <= 0.001 * sm["data_packets"] + 5, sm
    assert sm["planes_lost"] == 0, sm
    # last-hop trims make the losses that deep last-hop queues fake congestion, not failure:
    # 29-86 retirements per run before they did; since, 0 in 22 of 24 runs, 24 and 40 in two
    # (losses on a plane whose last hop had not trimmed for 20 ms; deterministic version:
    # tests/core/test_sim_congestion.py::test_incast_deep_last_hop_queues_retire_no_ev)
    assert sm["evs_assumed_bad"] <= 0.005 * sm["data_packets"], sm["ev_reasons"]


def test_incast_with_trim_and_encryption(
    trimmed_run: tuple[Topology, Incast], tmp_path: Path
) -> None:
    """Trimming with keys on: every sender and the receiver share a key and encrypt. Trimmed
    headers keep their security block, so the receiver authenticates and NACKs them; nothing
    is dropped as forged, and every transfer verifies."""
    from mrc.security.keys import write_key_file

    topo, _ = trimmed_run
    key = tmp_path / "fabric.key"
    write_key_file(str(key))
    run = run_incast(
        topo, 4813, capture=False, size="8M", extra=("--key-file", str(key), "--encrypt")
    )
    sm = run.summary()
    print(f"\nincast with --trim and --encrypt ({RATE}, window {WINDOW}, 8M each):", sm)
    check_complete(run, topo, 8 << 20)
    assert all(s["security"] == "encrypt" for s in run.sends.values()), run.sends
    assert sm["fabric_trims"] > 0 and sm["receiver_trims_seen"] > 0, sm
    assert sm["nacks"] > 0 and sm["retransmits_nack"] > 0, sm
    for r in run.recvs:
        forged = {k: v for k, v in r["dropped_by_reason"].items() if k.startswith("security")}
        assert forged == {}, r["dropped_by_reason"]


def test_incast_with_trim_and_gso_bursts(trimmed_run: tuple[Topology, Incast]) -> None:
    """Bursts of 8 packets per EV, each sent as one UDP GSO skb through SRv6 paths into a
    trimming, rate-shaped fabric: every transfer verifies, and the fabric loses no more than
    with per-packet spraying (the k=1 run of this module): no tail drop anywhere, no timeout.

    Issue 10: this used to cost 56-148 tail drops, all in the *senders'* own NIC queues (the
    host end of host-leaf links; the routers dropped nothing and never saw a GSO skb, since
    host NICs run without UDP segmentation offload under --trim). A burst puts 8 frames on one
    plane, two or three bursts in a row can land on the same plane, and 16-24 frames of 8.3 kB
    overflowed the 125 kB (10 ms) tbf queue. Host NICs now queue at least 64 frames
    (shaping.tbf_params). Still open (core, not the fabric): RACK's reordering window and the
    8-losses plane-down rule were made for level per-packet spraying, so bursts still cause
    spurious SACK losses and EV retirements although nothing is lost; printed, not asserted."""
    topo, k1 = trimmed_run
    gso_before = _router_gso(topo)
    run = run_incast(topo, 4814, capture=False, size="8M", send_extra=("--burst", "8"))
    sm = run.summary()
    print(f"\nincast with --trim and --burst 8 ({RATE}, window {WINDOW}, 8M each):", sm)
    check_complete(run, topo, 8 << 20)
    assert sm["fabric_trims"] > 0 and sm["receiver_trims_seen"] > 0, sm
    assert sm["trims_seen"] > 0 and sm["retransmits_nack"] > 0, sm
    k1sm = k1.summary()
    # nothing dropped: not at the routers, not in the senders' own NIC queues
    host_drops = {k: v["drops"] for k, v in run.fabric.items() if v["drops"]}
    assert sm["fabric_drops"] <= k1sm["fabric_drops"] and sm["fabric_drops"] == 0, host_drops
    # with no drop anywhere, a timeout is an ACK that came late (a starved CPU on a busy
    # machine: 6 in one such run): a few are allowed, not a habit
    allowed = max(2, k1sm["retransmits_timeout"], sm["data_packets"] // 200)
    assert sm["retransmits_timeout"] <= allowed, sm
    # with USO off on host NICs every burst leaves the host segmented: the trimmer never has
    # to charge a GSO super-packet whole
    assert _router_gso(topo) == gso_before, "GSO super-packets reached a router"


def _router_gso(topo: Topology) -> int:
    """The trimmer's ``gso`` counter (GSO skbs seen on router ingress), summed over routers."""
    return sum(r.get("gso", 0) for r in Fabric.status(topo.name)["trim_routers"].values())


def test_incast_with_trim_and_nscc(trimmed_run: tuple[Topology, Incast]) -> None:
    """The same incast with the NSCC window (--cc nscc, UET 1.0's, capped by the same
    --window): every transfer verifies, and the window reacts to trims, so the fabric trims
    fewer packets per data packet than the fixed window of the first run in this module."""
    topo, fixed = trimmed_run
    run = run_incast(topo, 4815, capture=False, size="8M", send_extra=("--cc", "nscc"))
    sm, base = run.summary(), fixed.summary()
    print(f"\nincast with --trim and --cc nscc ({RATE}, window cap {WINDOW}, 8M each):", sm)
    check_complete(run, topo, 8 << 20)
    per_packet = sm["fabric_trims"] / sm["data_packets"]
    fixed_per_packet = base["fabric_trims"] / base["data_packets"]
    print(f"trims per data packet: nscc {per_packet:.3f}, fixed {fixed_per_packet:.3f}")
    assert per_packet < fixed_per_packet, (per_packet, fixed_per_packet)
    assert sm["retransmits_timeout"] <= max(2, 0.02 * max(1, sm["retransmits"])), sm


# ---- without trimming -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dropped_run() -> Iterator[tuple[Topology, Incast]]:
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    spec = FabricSpec(name=unique_name("d"), spines=SPINES, mtu=9000, rate=RATE)
    with running_fabric(spec) as topo:
        run = run_incast(topo, 4812, capture=False)
        print(f"\nincast without --trim ({RATE}, window {WINDOW}):", json.dumps(run.summary()))
        yield topo, run


def test_incast_without_trim_completes_through_losses(
    dropped_run: tuple[Topology, Incast], record_property: Callable[[str, object], None]
) -> None:
    topo, run = dropped_run
    sm = run.summary()
    record_property("incast_drop", json.dumps(sm))
    check_complete(run, topo)
    assert run.seconds < 60
    assert sm["fabric_trims"] == 0 and sm["receiver_trims_seen"] == 0 and sm["nacks"] == 0, sm
    assert sm["fabric_drops"] > 0, sm  # tbf tail drops at the last hop
    assert sm["retransmits_sack"] + sm["retransmits_timeout"] > 0, sm
