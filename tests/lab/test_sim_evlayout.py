"""The simulator's EVs are the transport's: the same planes, flow labels, route ids and sharing
of source ports as ``open_ev_sockets`` gives a QP on an mrc-fabric (a route per spine) and on a
plain network (a route per plane), and on the SRv6 fabric every EV crosses its route's spine.
Without this the simulator's route fate and route evidence would be tried on other EVs than
the ones that run."""

from __future__ import annotations

import pytest

from mrc import wire
from mrc.connection.handshake import route_ids
from mrc.core import QPConfig
from mrc.lab.sim import SimNetwork
from mrc.lab.sim_links import Fabric
from mrc.srv6.evroutes import EVRoute
from mrc.transport.evsockets import open_ev_sockets


def _transport(count: int, planes: int, spines: int, source_ports: int) -> dict[str, object]:
    """What the transport opens for ``count`` EVs over loopback routes labelled as a fabric's
    spines (``spines`` 0: a plain network, one route per plane)."""
    routes = [
        [EVRoute(p, "::1", "::1", None, f"p{p}s{s}") for s in range(spines)]
        if spines
        else [EVRoute(p, "::1", "::1", None, f"plane {p} direct")]
        for p in range(planes)
    ]
    evs = open_ev_sockets(count, routes, 9, source_ports=source_ports)
    try:
        ports = [wire.ev_parts(v)[0] for v in evs.values]
        return {
            "planes": evs.planes,
            "labels": evs.labels,
            "routes": route_ids(evs.routes) if spines else None,
            "same_port": _sharing(ports),
        }
    finally:
        evs.close()


def _sharing(ports: list[int]) -> list[int]:
    """Which EVs share a source port: per EV, the first EV with its port."""
    first: dict[int, int] = {}
    return [first.setdefault(p, i) for i, p in enumerate(ports)]


@pytest.mark.parametrize(
    ("evs", "backups", "planes", "spines", "source_ports"),
    [(16, 4, 2, 2, 1), (128, 32, 4, 4, 1), (10, 0, 3, 2, 2), (8, 2, 2, 0, 1)],
)
def test_a_simulated_qp_has_the_evs_the_transport_opens(
    evs: int, backups: int, planes: int, spines: int, source_ports: int
) -> None:
    fab = Fabric(spines=max(spines, 3), ecmp=True) if spines == 0 else Fabric(spines=spines)
    net = SimNetwork(1, fabric=fab)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(source_ports=source_ports)
    qa, qb = net.connect("a", "b", evs=evs, config=cfg, planes=planes, backups=backups)
    want = _transport(evs + backups, planes, spines, source_ports)
    for q in (qa, qb):
        ports = [wire.ev_parts(v)[0] for v in q.evs.values]
        got = {
            "planes": q.evs.planes,
            "labels": [wire.ev_parts(v)[1] for v in q.evs.values],
            "routes": q.evs.routes if spines else None,
            "same_port": _sharing(ports),
        }
        assert got == want
        assert q.evs.active == [i < evs for i in range(evs + backups)]
        if spines:
            # each route's EVs cross its spine: the route of EV i is spine (i // P) % S
            assert [fab.spine_of(v) for v in q.evs.values] == [
                (i // planes) % spines for i in range(evs + backups)
            ]
        else:
            assert q.evs.routes == [0] * (evs + backups)  # plain routing: paths unknown
    # ports name hosts: no EV value of one QP is another's
    assert not set(qa.evs.values) & set(qb.evs.values)


def test_routes_can_be_withheld_or_hashed_for_studies() -> None:
    net = SimNetwork(1, fabric=Fabric(spines=2))
    for h in "abcd":
        net.add_host(h)
    qa, _qb = net.connect("a", "b", evs=8, planes=2, routes=False)
    assert qa.evs.routes == [0] * len(qa.evs.values)  # paths unknown, route fate off
    plain = SimNetwork(1, fabric=(fab := Fabric(spines=2, ecmp=True)))
    for h in "ab":
        plain.add_host(h)
    qa, _qb = plain.connect("a", "b", evs=8, planes=2, routes=True)
    assert qa.evs.routes == [fab.spine_of(v) for v in qa.evs.values]
    with pytest.raises(ValueError):
        fab.pin(qa.evs.values[0], 0)  # a plain network has no source routes
