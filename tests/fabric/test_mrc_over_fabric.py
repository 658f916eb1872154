"""MRC over the multi-plane SRv6 fabric: mrc-send -> mrc-recv between fabric hosts.

Every test runs on two fabrics, one with SRH routes and one with uSID routes
(``mrc-fabric up --srv6``). Each is module-scoped, of the default shape (4 planes x 2 spines x
2 leaves, 4 hosts; h0,h1 on leaf 0, h2,h3 on leaf 1), MTU 9000, unshaped.  With ``--fabric``
both ends spread their EVs over
every SRv6 path (plane x spine), so one queue pair must load every plane and every spine equally.
We check that with the *routers'* interface counters (``Fabric.status``, the same data as
``mrc-fabric status --json``), not only with the sender's own per-EV report, and that the two
agree.  (The SRH itself is decoded with scapy in test_fabric_traffic.py; not repeated here.)
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from fabric.fabric_helpers import (
    SKIP_REASON,
    needs_netns,
    running_fabric,
    start_fabric_recv,
    unique_name,
)
from wire.tshark_fields import read_fields, wait_capturing

from mrc import wire
from mrc.lab.fabric import Fabric, FabricSpec, Topology
from mrc.srv6 import usid
from mrc.srv6.paths import path_via
from mrc.topology.model import SRV6_MODES

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import MrcTools

pytestmark = [needs_netns, pytest.mark.netns]

MiB = 1 << 20
PAYLOAD = 8192  # jumbo frames: 8192 + headers + SRH < 9000
FAIR_LO, FAIR_HI = 0.6, 1.4  # every spine / plane within this factor of its fair share


@pytest.fixture(scope="module", params=SRV6_MODES)
def jfab(request: pytest.FixtureRequest) -> Iterator[Topology]:
    """The fabric in each way its routers can be told a path: SRHs of End SIDs, and uSID
    containers in IPv6-in-IPv6 (mrc.srv6.usid)."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    spec = FabricSpec(name=unique_name("o"), mtu=9000, srv6=request.param)
    with running_fabric(spec) as topo:
        yield topo


def counters(topo: Topology) -> dict[tuple[str, str], tuple[int, int]]:
    """(node, ifname) -> (rx_packets, tx_packets) for every fabric interface, from the
    routers' and hosts' own kernels."""
    out = {}
    for lk in Fabric.status(topo.name)["links"]:
        for node, end in ((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"])):
            assert end["present"], (node, end)
            out[(node, end["ifname"])] = (end["rx_packets"], end["tx_packets"])
    return out


def deltas(
    before: dict[tuple[str, str], tuple[int, int]], after: dict[tuple[str, str], tuple[int, int]]
) -> dict[tuple[str, str], tuple[int, int]]:
    return {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after}


def spines(topo: Topology) -> list[str]:
    return [r.name for p in range(topo.planes) for r in topo.spines(p)]


def transfer(
    topo: Topology, mrc_tools: MrcTools, src: str, dst: str, port: int, size: str
) -> tuple[dict[str, Any], dict[str, Any], dict[tuple[str, str], tuple[int, int]]]:
    """mrc-recv on ``dst`` and mrc-send from ``src``, both with --fabric, one datagram per
    send; returns (send, recv) JSON and the interface counter deltas over the transfer."""
    recv = start_fabric_recv(mrc_tools, topo, dst, port)
    before = counters(topo)
    send = mrc_tools.run(
        "mrc-send",
        "--fabric",
        topo.name,
        "--to",
        f"{dst}:{port}",
        "--size",
        size,
        "--payload",
        str(PAYLOAD),
        # one datagram per send: a GSO burst in IPv6-in-IPv6 crosses the veths as one skb,
        # which the routers' counters count once, and these tests count datagrams
        "--burst",
        "1",
        "--json",
        "--no-progress",
        ns=topo.netns_of(src),
        timeout=90,
    )
    r = recv.wait(30)
    after = counters(topo)
    assert send.returncode == 0, send.describe()
    assert r.returncode == 0, r.describe()
    s, rv = send.json, r.json
    assert s["ok"] is True and rv["ok"] is True, (s.get("error"), rv.get("error"))
    assert s["bytes"] == rv["bytes"] == rv["bytes_placed"]
    assert s["digest"] == s["digest_receiver"] == rv["digest"] == rv["digest_sender"]
    return s, rv, deltas(before, after)


def per_route(s: dict[str, Any]) -> dict[str, int]:
    got: collections.Counter[str] = collections.Counter()
    for e in s["evs"]:
        got[e["route"]] += e["packets"]
    return dict(got)


def fair(values: dict[str, int], what: str, why: str) -> None:
    share = sum(values.values()) / len(values)
    for k, v in values.items():
        assert FAIR_LO * share <= v <= FAIR_HI * share, (
            f"{what} {k}: {v} vs fair {share:.0f}; all {values}; {why}"
        )


def test_64mib_h0_to_h3_loads_every_plane_and_spine(jfab: Topology, mrc_tools: MrcTools) -> None:
    """h0 -> h3 (different leaves): every packet crosses a spine; each of the 8 spines
    carries ~1/8 of them, as counted by the spines themselves."""
    topo = jfab
    s, rv, d = transfer(topo, mrc_tools, "h0", "h3", 4801, "64M")
    assert s["bytes"] == 64 * MiB
    why = (
        f"retransmits {s['retransmits']} (timeout {s['retransmits_timeout']}, sack "
        f"{s['retransmits_sack']}), evs_assumed_bad {s['evs_assumed_bad']}"
    )
    sent = s["packets_sent"]  # data packets including retransmissions
    assert sent >= s["data_packets"] >= 64 * MiB // PAYLOAD

    # our own view: the EVs map onto every spine of every plane, evenly
    routes = per_route(s)
    assert sorted(routes) == sorted(spines(topo)), routes
    assert sum(routes.values()) == sent
    fair(routes, "sender's EV report, route", why)
    assert s["planes"] == topo.planes
    assert sorted({e["plane"] for e in s["evs"]}) == list(range(topo.planes))

    # the routers' view.  Data h0 -> h3 enters each spine on its port to leaf 0 ('l0') and
    # leaves on the port to leaf 1 ('l1'); ACKs (sprayed over the spines too) go the other way.
    data_in = {sp: d[(sp, "l0")][0] for sp in spines(topo)}
    data_out = {sp: d[(sp, "l1")][1] for sp in spines(topo)}
    acks_in = {sp: d[(sp, "l1")][0] for sp in spines(topo)}
    total = sum(data_in.values())
    # every data packet crossed some spine; little else travels that way (EV probes, if any)
    assert sent <= total <= sent * 1.05 + 200, (total, sent, data_in)
    fair(data_in, "spine rx from leaf 0 (data)", why)
    for sp in data_in:
        # forwarded, all of it (a few stray control packets, e.g. MLD, end at the spine)
        assert data_out[sp] >= data_in[sp] - 10, (sp, data_in[sp], data_out[sp])
        # the spine's count agrees with what the sender says it sent via that spine
        assert abs(data_in[sp] - routes[sp]) <= 0.02 * routes[sp] + 50, (sp, data_in, routes)
        # the receiver's ACKs are source-routed over every spine as well
        assert acks_in[sp] > 0, ("no ACKs came back via", sp, acks_in)
    assert sum(acks_in.values()) >= rv["acks_sent"], (acks_in, rv["acks_sent"])

    # planes: the receiver's NIC in each plane got a quarter of the packets
    per_plane = {f"p{p}": d[("h3", f"p{p}")][0] for p in range(topo.planes)}
    fair(per_plane, "h3 rx on plane NIC", why)
    assert sum(per_plane.values()) >= sent


def test_same_leaf_pair_goes_through_the_spines(jfab: Topology, mrc_tools: MrcTools) -> None:
    """h0 -> h1 share leaf 0, yet the EVs still take the SRv6 paths via every spine (a spine
    hairpins the packet back down to leaf 0): each spine sees its share in and out on 'l0',
    and nothing is carried towards leaf 1."""
    topo = jfab
    s, rv, d = transfer(topo, mrc_tools, "h0", "h1", 4802, "16M")
    assert s["bytes"] == 16 * MiB
    why = f"retransmits {s['retransmits']}, evs_assumed_bad {s['evs_assumed_bad']}"
    sent = s["packets_sent"]

    routes = per_route(s)
    assert sorted(routes) == sorted(spines(topo)), routes  # no "direct" route on the leaf
    fair(routes, "sender's EV report, route", why)

    through = {sp: d[(sp, "l0")][0] for sp in spines(topo)}  # data + ACKs, both via leaf 0
    back_down = {sp: d[(sp, "l0")][1] for sp in spines(topo)}
    towards_leaf1 = sum(d[(sp, "l1")][1] for sp in spines(topo))
    assert sum(through.values()) >= sent + rv["acks_sent"], (through, sent, rv["acks_sent"])
    fair(through, "spine rx from leaf 0", why)
    for sp in through:
        assert back_down[sp] >= through[sp] - 10, (sp, through[sp], back_down[sp])
        assert abs(through[sp] - routes[sp]) <= 0.1 * routes[sp] + 100, (sp, through, routes)
    assert towards_leaf1 <= 0.01 * sent + 50, towards_leaf1  # nothing goes to the other leaf
    per_plane = {f"p{p}": d[("h1", f"p{p}")][0] for p in range(topo.planes)}
    fair(per_plane, "h1 rx on plane NIC", why)


def test_a_spine_link_carries_the_evs_in_port_and_flow_label(
    jfab: Topology, mrc_tools: MrcTools, tmp_path: Path
) -> None:
    """Captured by tshark on a spine's port to leaf 0 while h0 sends to h3: every data
    datagram there carries, in its UDP source port and IPv6 flow label, one of the sender's
    32-bit EVs, an EV whose route is that spine; the EVs of one route share a source port and
    differ by label. With SRH routes each datagram also carries one (type 4). With uSID routes
    there is no routing header: the datagram is inside an outer IPv6 header whose destination
    is the route's container with the first leaf's uSID consumed (next hop: this spine), and
    whose flow label is the EV's too, so switches that hash it see the EV."""
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark not on PATH")
    topo = jfab
    spine = spines(topo)[0]
    port = 4803
    pcap = tmp_path / "spine.pcap"
    cap = subprocess.Popen(
        ["ip", "netns", "exec", topo.netns_of(spine), tshark, "-i", "l0"]
        + ["-f", "ip6", "-a", "duration:120", "-w", str(pcap)],  # (BPF's udp misses an SRH)
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        said = wait_capturing(cap, 15.0)
        assert "Capturing on" in said, said
        time.sleep(0.5)  # the capture has opened; let it settle
        s, _rv, _d = transfer(topo, mrc_tools, "h0", "h3", port, "16M")
    finally:
        if cap.poll() is None:
            cap.send_signal(signal.SIGINT)
            cap.wait(timeout=30)
        if cap.stderr is not None:
            cap.stderr.close()
    fields = ["udp.srcport", "ipv6.flow", "ipv6.routing.type", "ipv6.nxt", "ipv6.dst"]
    frames = read_fields(tshark, str(pcap), fields, "-Y", f"udp.dstport == {port}")
    assert len(frames) >= s["data_packets"] // 16  # about one in 8 datagrams crosses it
    route_of = {e["value"]: e["route"] for e in s["evs"]}
    h3 = topo.host("h3")
    seen: set[int] = set()
    for fr in frames:
        ev = wire.ev_value(int(fr["udp.srcport"][0]), int(fr["ipv6.flow"][-1], 0))
        assert route_of.get(ev) == spine, (ev, route_of.get(ev))
        seen.add(ev)
        if topo.srv6 == "srh":
            assert fr["ipv6.routing.type"] == ["4"]  # the SRH (segment routing, type 4)
            continue
        assert fr["ipv6.routing.type"] == [], fr  # no routing header at all
        assert fr["ipv6.nxt"][0] == "41", fr  # IPv6 in IPv6
        assert len(set(fr["ipv6.flow"])) == 1, fr  # outer label = inner label = the EV's
        path = path_via(topo, "h0", "h3", spine)
        assert path.usid is not None
        assert fr["ipv6.dst"] == [usid.shift(path.usid), h3.nic(path.plane).address], fr
    on_spine = {v for v, r in route_of.items() if r == spine}
    assert seen <= on_spine and len(seen) >= len(on_spine) // 2
    assert len({ev >> wire.EV_LABEL_BITS for ev in seen}) == 1  # one socket for the route


def _routes(topo: Topology, node: str) -> list[str]:
    out = subprocess.run(
        ["ip", "-n", topo.netns_of(node), "-6", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(ln for ln in out.splitlines() if "proto kernel" not in ln)


def test_a_healed_link_gets_every_route_back(jfab: Topology) -> None:
    """A link that goes down loses the routes through it at both ends (the uSID ones too:
    the spine's way down to the leaf, the leaf's way up); healing it restores exactly the
    routes each end had, and the failure took some away (so the comparison means something)."""
    topo = jfab
    ends = ("p1l1", "p1s0")
    before = {n: _routes(topo, n) for n in ends}
    Fabric.link(topo, *ends, up=False)
    try:
        down = {n: _routes(topo, n) for n in ends}
    finally:
        Fabric.link(topo, *ends, up=True)
    after = {n: _routes(topo, n) for n in ends}
    assert after == before
    for n in ends:
        assert len(down[n]) < len(before[n]), (n, set(before[n]) - set(down[n]))
    if topo.srv6 == "usid":
        lost = set(before["p1s0"]) - set(down["p1s0"])
        assert any(ln.startswith(f"{usid.locator(usid.leaf_usid(1, 1))} via") for ln in lost), lost
