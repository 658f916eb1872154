"""Topology planning, addressing, routes and path enumeration: pure, no root needed."""

from __future__ import annotations

import ipaddress
import json
from typing import TYPE_CHECKING, Any

import pytest

from mrc.errors import FabricError, UsageError
from mrc.lab.fabric import FabricSpec, Topology, load_topology, parse_rate, plan
from mrc.lab.fabric.routes import node_neighbours, node_routes
from mrc.lab.fabric.shaping import GSO_FRAME, HOST_QUEUE_FRAMES, tbf_params
from mrc.lab.fabric.usid_routes import node_routes as usid_node_routes
from mrc.lab.fabric.usid_routes import node_setup as usid_node_setup
from mrc.srv6 import usid
from mrc.srv6.paths import default_path, list_paths, path_via
from mrc.srv6.srh import decode_srh

if TYPE_CHECKING:
    from pathlib import Path


def test_default_shape() -> None:
    topo = plan(FabricSpec())
    assert topo.planes == 4
    assert len(topo.hosts) == 4
    assert len(topo.routers) == 4 * (2 + 2)
    assert len(topo.links) == 4 * (4 + 2 * 2)
    assert [h.nic(0).leaf for h in topo.hosts] == ["p0l0", "p0l0", "p0l1", "p0l1"]
    assert topo.hosts[0].netns == "mrc-mrc-h0"
    assert topo.router("p0s1").netns == "mrc-mrc-p0s1"
    assert {h.nic(2).nic for h in topo.hosts} == {"p2"}


def test_names_fit_in_ifnamsiz() -> None:
    topo = plan(FabricSpec(planes=10, spines=64, leaves=64, hosts=256))
    for lk in topo.links:
        assert len(lk.a_ifname) <= 15 and len(lk.b_ifname) <= 15


def test_addresses_unique_and_in_plane() -> None:
    topo = plan(FabricSpec(planes=3, spines=3, leaves=3, hosts=7))
    addrs = [lk.a_address for lk in topo.links] + [lk.b_address for lk in topo.links]
    addrs += [r.sid for r in topo.routers]
    assert len(addrs) == len(set(addrs))
    macs = [lk.a_mac for lk in topo.links] + [lk.b_mac for lk in topo.links]
    assert len(macs) == len(set(macs))
    for lk in topo.links:
        plane_net = ipaddress.IPv6Network(f"fd00:{lk.plane:x}::/32")
        net = ipaddress.IPv6Network(lk.prefix)
        assert net.subnet_of(plane_net)
        assert ipaddress.IPv6Address(lk.a_address) in net
        assert ipaddress.IPv6Address(lk.b_address) in net


def test_hosts_split_evenly() -> None:
    topo = plan(FabricSpec(leaves=3, hosts=7))
    per_leaf = [sum(1 for h in topo.hosts if h.nic(0).leaf == f"p0l{i}") for i in range(3)]
    assert sorted(per_leaf) == [2, 2, 3]


def test_json_round_trip(tmp_path: Path) -> None:
    topo = plan(FabricSpec(name="rt", rate="200mbit", mtu=9000))
    path = topo.save(tmp_path / "fabric-rt.json")
    data = json.loads(path.read_text())
    assert data["name"] == "rt" and data["planes"] == 4
    assert data["links"][0]["rate"] == "200mbit" and data["links"][0]["rate_bps"] == 200_000_000
    assert {"a", "b", "a_ifname", "b_ifname", "plane", "kind", "rate", "mtu"} <= set(
        data["links"][0]
    )
    assert {"name", "netns", "plane", "tier", "sid"} <= set(data["routers"][0])
    assert {"nic", "address", "leaf"} <= set(data["hosts"][0]["nics"][0])
    assert load_topology(path) == topo
    assert Topology.from_dict(data) == topo


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(planes=0),
        dict(hosts=1),
        dict(spines=0),
        dict(leaves=5, hosts=4),
        dict(mtu=1000),
        dict(rate="fast"),
        dict(rate="1kbit"),
        dict(name="a-b"),
        dict(name=""),
        dict(srv6="mpls"),
    ],
)
def test_bad_specs(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        FabricSpec(**kwargs).validate()


def test_parse_rate() -> None:
    assert parse_rate("200mbit") == 200_000_000
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("1.5mbit") == 1_500_000
    assert parse_rate("10mbps") == 80_000_000  # tc: bps = bytes per second
    assert parse_rate("64000") == 64_000


def test_tbf_params_give_hosts_a_deeper_queue() -> None:
    """Router ports queue ~10 ms; a host's NIC at least HOST_QUEUE_FRAMES full frames (it is
    the host's own transmit queue: GSO bursts of jumbo frames must not overflow it)."""
    assert tbf_params(100_000_000, 9000) == (12_500_000, 18_028, 125_000)
    # a host's burst passes a whole GSO super-packet: tbf cannot segment IPv6-in-IPv6 ones
    assert tbf_params(100_000_000, 9000, host=True) == (12_500_000, GSO_FRAME, 64 * 9014)
    assert HOST_QUEUE_FRAMES == 64
    # where 10 ms already holds more than 64 frames, the host queue is the same as a router's
    assert tbf_params(100_000_000, 1500, host=True)[2] == tbf_params(100_000_000, 1500)[2]
    assert tbf_params(10_000_000_000, 9000, host=True) == tbf_params(10_000_000_000, 9000)


def test_lookups_fail_cleanly() -> None:
    topo = plan(FabricSpec())
    with pytest.raises(UsageError, match="unknown node"):
        topo.host("h9")
    with pytest.raises(UsageError, match="no link"):
        topo.link_between("h0", "p0s0")
    assert topo.link_between("p0s1", "p0l0").id == "p0l0-p0s1"
    assert topo.canonical("mrc-mrc-h2") == "h2"


def test_routes_cover_every_sid() -> None:
    """Each router can reach every SID of its plane: connected, local or via a static route."""
    topo = plan(FabricSpec(planes=2, spines=3, leaves=3, hosts=6))
    for r in topo.routers:
        dsts = [ipaddress.IPv6Network(x.dst) for x in node_routes(topo, r.name)]
        connected = [
            ipaddress.IPv6Network(lk.prefix) for lk in topo.links if r.name in (lk.a, lk.b)
        ]
        for other in topo.routers:
            if other.plane != r.plane or other.name == r.name:
                continue
            sid = ipaddress.IPv6Address(other.sid)
            assert any(sid in n for n in dsts + connected), (r.name, other.name)
        for h in topo.hosts:
            addr = ipaddress.IPv6Address(h.nic(r.plane).address)
            assert any(addr in n for n in dsts + connected), (r.name, h.name)
    assert len(node_neighbours(topo, "p0s0")) == 3


def test_paths_different_leaves() -> None:
    topo = plan(FabricSpec(srv6="srh"))
    paths = list_paths(topo, "h0", "h3")
    assert [(p.plane, p.spine) for p in paths] == [
        (p, f"p{p}s{s}") for p in range(4) for s in range(2)
    ]
    p = path_via(topo, "h0", "h3", "p2s1")
    assert p.segments == (topo.router("p2s1").sid, topo.host("h3").nic(2).address)
    assert p.src_address == topo.host("h0").nic(2).address
    assert p.srh is not None  # a path via a spine carries an SRH
    srh = decode_srh(p.srh)
    assert srh.segments == p.segments and srh.segments_left == 1


def test_paths_same_leaf_include_spines_and_direct() -> None:
    topo = plan(FabricSpec())
    paths = list_paths(topo, "h0", "h1", planes=[1])
    assert [p.spine for p in paths] == ["p1s0", "p1s1", None]
    assert paths[-1].direct and paths[-1].srh is None
    assert default_path(topo, "h0", "h3", 0).srh is None
    with pytest.raises(ValueError):
        list_paths(topo, "h0", "h0")


def test_port_ecn_threshold_and_flags() -> None:
    """ECN threshold: a fraction of the trimming limit with a two-frame floor, none on last
    hops or at fraction 0; the packed map value carries the limits and flags as the program
    reads them."""
    from mrc.lab.fabric.trim.maps import (
        EGRESS,
        EGRESS_LASTHOP,
        EGRESS_PRIO,
        EGRESS_TRIM,
        NO_ECN,
        port_config,
        unpack_egress,
    )

    c = port_config(50_000_000, 1500, lasthop=False, ecn_fraction=0.5, prio=True)
    assert c.limit == 15_625 and c.ecn_limit == 7_812
    assert port_config(50_000_000, 1500, False, ecn_fraction=0.1).ecn_limit == 2 * 1514
    assert port_config(50_000_000, 1500, True, ecn_fraction=0.5).ecn_limit == NO_ECN
    assert port_config(50_000_000, 1500, False, ecn_fraction=0.0).ecn_limit == NO_ECN
    raw = c.pack()
    assert len(raw) == EGRESS.size
    assert EGRESS.unpack(raw)[1] == EGRESS_TRIM | EGRESS_PRIO
    assert EGRESS.unpack(port_config(50_000_000, 1500, True).pack())[1] & EGRESS_LASTHOP
    shown = unpack_egress(raw)
    assert shown["ecn_limit"] == 7_812 and shown["prio_band"] and not shown["lasthop"]
    assert unpack_egress(port_config(50_000_000, 1500, True).pack())["ecn_limit"] is None


def test_trim_topology_records_ecn_and_band() -> None:
    from mrc.lab.fabric import FabricSpec, Topology, plan

    t = plan(FabricSpec(name="x", rate="10mbit", trim=True))
    assert t.ecn_threshold == 0.5 and t.prio_band
    t = plan(FabricSpec(name="x", rate="10mbit", trim=True, ecn_threshold=0, prio_band=False))
    assert t.ecn_threshold == 0 and not t.prio_band
    plain = plan(FabricSpec(name="x", rate="10mbit"))
    assert plain.ecn_threshold == 0 and not plain.prio_band
    assert Topology.from_dict(t.to_dict()) == t


def test_srv6_mode_round_trips_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    topo = plan(FabricSpec(name="u", srv6="usid"))
    data = json.loads(topo.save(tmp_path / "fabric-u.json").read_text())
    assert data["srv6"] == "usid" and Topology.from_dict(data) == topo
    del data["srv6"]  # a file from before the field: SRH routes
    assert Topology.from_dict(data).srv6 == "srh"
    data["srv6"] = "bogus"
    with pytest.raises(FabricError, match="srv6 mode"):
        Topology.from_dict(data)


def test_usid_containers_read_as_the_path() -> None:
    """leaf 1 of plane 2 -> spine 3 -> leaf 0 -> host 5's port: 4201, 8203, 4200, c205."""
    box = usid.path_container(2, 1, 3, 0, 5)
    assert box == "fcbb:bb00:4201:8203:4200:c205::"
    # each switch consumes its own uSID: what reaches the spine, the last leaf, the host
    assert usid.shift(box) == "fcbb:bb00:8203:4200:c205::"
    assert usid.shift(usid.shift(usid.shift(box))) == "fcbb:bb00:c205::"
    assert ipaddress.IPv6Address(box) in ipaddress.IPv6Network(usid.BLOCK_PREFIX)
    assert ipaddress.IPv6Address(box) in ipaddress.IPv6Network(usid.leaf_prefix(2))
    assert usid.locator(usid.spine_usid(2, 3)) == "fcbb:bb00:8203::/48"
    assert usid.container([1, 2, 3, 4, 5, 6]) == "fcbb:bb00:1:2:3:4:5:6"
    for bad in ([], [1] * 7):
        with pytest.raises(ValueError):
            usid.container(bad)
    with pytest.raises(ValueError):
        usid.usid(usid.KIND_LEAF, usid.MAX_PLANE + 1, 0)
    with pytest.raises(ValueError):
        usid.usid(usid.KIND_LEAF, 0, usid.MAX_INDEX + 1)
    assert len({usid.mark(s) for s in range(64)}) == 64


def test_usid_routes_cover_every_path() -> None:
    """Every host can encapsulate to every other host over every spine of every plane, and
    every uSID on those paths is routed by the switch before it."""
    topo = plan(FabricSpec(name="u", srv6="usid"))
    lines = {n: usid_node_routes(topo, n) for n in topo.nodes()}
    for h in topo.hosts:
        rules = usid_node_setup(topo, h.name)
        assert len(rules) == topo.spines_per_plane
        assert all(f"table {usid.table(s)}" in rules[s] for s in range(topo.spines_per_plane))
        encaps = [ln for ln in lines[h.name] if "encap seg6 mode encap.red" in ln]
        assert len(encaps) == topo.planes * topo.spines_per_plane * (len(topo.hosts) - 1)
        for other in topo.hosts:
            if other is h:
                continue
            for path in list_paths(topo, h.name, other.name):
                if path.spine is None:  # the same leaf's direct path: plain routing
                    continue
                assert path.usid is not None and path.srh is None and path.mark
                table = f"table {usid.table(path.mark - usid.MARK_BASE)}"
                assert sum(f"segs {path.usid} via" in ln and table in ln for ln in encaps) == 1
                # hop by hop: one switch owns the locator the address starts with
                addr, hops = path.usid, []
                for _ in range(3):
                    first = int(ipaddress.IPv6Address(addr)) >> 80 & 0xFFFF
                    end = f"route replace {usid.locator(first)} encap seg6local action End "
                    owners = [n for n, ls in lines.items() if any(x.startswith(end) for x in ls)]
                    assert len(owners) == 1, (addr, owners)
                    hops.append(owners[0])
                    addr = usid.shift(addr)
                assert hops == [h.nic(path.plane).leaf, path.spine, other.nic(path.plane).leaf]
                decap = f"route replace {addr}/48 encap seg6local action End.DT6"
                assert any(ln.startswith(decap) for ln in lines[other.name]), addr
