"""The groups of QPs to one peer whose window laws share a base RTT (issue 41, item 3): kept
by a :class:`PeerGroups` the endpoints are given, each group gone with its last member."""

from __future__ import annotations

import mrc
from mrc import connection
from mrc.core import QPConfig
from mrc.core.cc.nscc import MrcNscc, PeerShare
from mrc.core.cc.uet import UetNscc
from mrc.core.endpoint import EndpointCore, PeerGroups
from mrc.core.memory import ProtectionDomain
from mrc.core.qp import QueuePair

HOST = "::1"


def _qp(qpn: int, cc: str = "nscc-mrc") -> QueuePair:
    return QueuePair(qpn, ProtectionDomain(), list(range(4000, 4004)), None, QPConfig(cc=cc))


def test_qps_to_one_peer_share_and_the_group_goes_with_the_last() -> None:
    groups = PeerGroups()
    a, b, c = _qp(1), _qp(2), _qp(3)
    groups.join("peer", a)
    groups.join("peer", b)
    groups.join("other", c)
    law_a, law_b, law_c = a.requester.cc, b.requester.cc, c.requester.cc
    assert isinstance(law_a, MrcNscc) and isinstance(law_b, MrcNscc) and isinstance(law_c, MrcNscc)
    assert law_a.shared is not None and law_a.shared is law_b.shared
    assert law_c.shared is not law_a.shared
    assert isinstance(law_a.shared, PeerShare) and law_a.shared.members == 2
    assert len(groups) == 2 and groups.members("peer") == 2
    groups.join("peer", a)  # a QP joins once
    assert groups.members("peer") == 2
    groups.leave(a)
    assert law_a.shared is None and groups.members("peer") == 1
    groups.leave(a)  # again: nothing
    groups.leave(b)
    groups.leave(c)
    assert len(groups) == 0 and groups.members("peer") == 0


def test_the_default_law_shares_through_its_qp() -> None:
    groups = PeerGroups()
    a, b = _qp(1, "nscc"), _qp(2, "nscc")
    groups.join(("h", ("x",)), a)
    groups.join(("h", ("x",)), b)
    law_a, law_b = a.requester.cc, b.requester.cc
    assert isinstance(law_a, UetNscc) and isinstance(law_b, UetNscc)
    assert law_a.shared is not None and law_a.shared is law_b.shared
    groups.leave(a)
    groups.leave(b)
    assert law_a.shared is None and len(groups) == 0


def test_a_qp_that_never_joined_leaves_quietly() -> None:
    groups = PeerGroups()
    groups.leave(_qp(1))
    assert len(groups) == 0


def test_an_endpoint_has_groups_of_its_own_unless_given_some() -> None:
    shared = PeerGroups()
    assert EndpointCore().peers is not EndpointCore().peers
    assert EndpointCore(peers=shared).peers is shared


async def test_connect_close_cycles_leave_no_group_behind() -> None:
    """Two connections at once to one peer share one group; closed, nothing is left, however
    often that is done (the process-wide dict of old grew by a key per peer, for ever)."""
    groups = connection.PEERS
    before = len(groups)
    listener = await mrc.listen(HOST, 0)
    try:
        for _ in range(3):
            first = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4))
            second = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4))
            assert first.endpoint is not second.endpoint
            assert first.endpoint.core.peers is second.endpoint.core.peers is groups
            shared = first.qp.requester.cc
            other = second.qp.requester.cc
            assert isinstance(shared, UetNscc) and isinstance(other, UetNscc)
            assert shared.shared is not None and shared.shared is other.shared
            assert len(groups) == before + 1
            await first.close()
            assert len(groups) == before + 1
            await second.close()
            assert len(groups) == before
    finally:
        await listener.close()
