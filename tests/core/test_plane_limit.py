"""A connection has at most 16 planes: an ACK's Port State has a bit per plane, 16 of them
(docs/PROTOCOL.md). Issue 22: up to 64 planes were accepted, and with 20 a peer reporting
every plane up (0xFFFF) marked planes 16-19 down, for good."""

from __future__ import annotations

import pytest

import mrc
from mrc import wire
from mrc.core.evset import EVSet
from mrc.errors import UsageError
from mrc.lab.fabric import FabricSpec


def _evs(planes: int) -> EVSet:
    n = 2 * planes
    return EVSet(list(range(5000, 5000 + n)), planes=[i % planes for i in range(n)], seed=1)


def test_sixteen_planes_all_reported_up_are_all_up() -> None:
    evs = _evs(wire.MAX_PLANES)
    evs.set_peer_planes(0xFFFF)
    assert evs.peer_plane_down == [False] * 16
    evs.set_peer_planes(0xFFFF & ~(1 << 15))  # the last plane's bit exists and works
    assert evs.peer_plane_down == [False] * 15 + [True]
    assert evs.port_state() == 0xFFFF


def test_a_seventeenth_plane_is_refused_by_the_core() -> None:
    with pytest.raises(ValueError, match=r"planes are numbered 0 \.\. 15 .*not 0 \.\. 16"):
        _evs(17)


async def test_listen_and_connect_refuse_more_planes_than_an_ack_reports() -> None:
    many = ["::1"] * 17
    with pytest.raises(mrc.MRCError, match=r"^plane_addrs: at most 16 planes .* not 17$"):
        await mrc.listen("::1", 0, mrc.ListenerConfig(plane_addrs=many))
    with pytest.raises(mrc.MRCError, match=r"^local_addrs: at most 16 planes .* not 17$"):
        await mrc.connect("::1", 9, mrc.ConnectConfig(local_addrs=many))


def test_a_fabric_of_more_planes_is_a_usage_error() -> None:
    FabricSpec(name="p16", planes=16).validate()
    with pytest.raises(UsageError, match="planes"):
        FabricSpec(name="p17", planes=17).validate()
