"""The simulator opens the backup EVs the transport opens, and they replace retired EVs as there.

A real connection opens ``backup_count(active, planes)`` EVs beside its active ones
(mrc.connection.handshake.plan_dial); an EV retired as bad gives its place in the rotation to a
backup of its plane (mrc/core/evset.py). A simulated QP without that pool loses an EV of the
rotation for good at every retirement, so its EV-health and failover figures would describe a
QP that never runs (issue 39, "the simulator models what runs").
"""

from __future__ import annotations

from collections import Counter

import pytest

from mrc.connection import backup_count
from mrc.core import QPConfig
from mrc.core.events import EVReason, EVState, EVStateChanged
from mrc.core.qp import QueuePair
from mrc.lab.sim import Faults, SimNetwork
from mrc.lab.sim_links import Fabric


@pytest.mark.parametrize(("evs", "planes"), [(16, 2), (128, 2), (8, 4), (6, 4), (1, 1)])
def test_a_simulated_qp_has_the_transports_backups(evs: int, planes: int) -> None:
    net = SimNetwork(1)
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=evs, planes=planes)
    backups = backup_count(evs, planes)
    for q in (qa, qb):
        assert len(q.evs.values) == evs + backups
        assert q.evs.active == [i < evs for i in range(evs + backups)]
        pool = Counter(q.evs.planes[i] for i in range(evs, evs + backups))
        # the transport's layout, EV i on plane i mod P: every plane has a backup of its own
        assert pool == Counter(i % planes for i in range(evs, evs + backups))
        assert set(pool) == set(range(planes))
        assert all(q.evs.is_backup(i) for i in range(evs, evs + backups))


def test_backups_zero_is_the_old_model() -> None:
    net = SimNetwork(1, fabric=Fabric(spines=2))
    for h in "ab":
        net.add_host(h)
    qa, _qb = net.connect("a", "b", evs=8, planes=2, backups=0)
    assert len(qa.evs.values) == 8 and all(qa.evs.active)


def _dead_ev_run(backups: int | None) -> tuple[QueuePair, list[EVStateChanged]]:
    """A 2 MB write on 8 active EVs over 2 planes with EV 0 (plane 0) dead from the start."""
    net = SimNetwork(3)
    for h in "ab":
        net.add_host(h)
    cfg = QPConfig(payload_size=1000, max_outstanding=32)
    qa, _qb = net.connect("a", "b", evs=8, config=cfg, planes=2, backups=backups)
    net.faults = Faults(dead_evs={qa.evs.values[0]})
    mr = net.hosts["b"].core.pd.register(buf := bytearray(2_000_000))
    qa.post_write(b"\x5a" * len(buf), mr.addr, mr.rkey)
    assert net.run(lambda: qa.idle)
    assert buf == b"\x5a" * len(buf)
    return qa, [e for e in net.hosts["a"].events if isinstance(e, EVStateChanged)]


def _in_rotation(qa: QueuePair, plane: int) -> int:
    evs = qa.evs
    return sum(
        1
        for i, p in enumerate(evs.planes)
        if p == plane and evs.active[i] and evs.state[i] in (EVState.GOOD, EVState.SKIP)
    )


def test_a_retired_ev_is_replaced_by_a_backup_of_its_plane() -> None:
    qa, events = _dead_ev_run(None)  # backup_count(8, 2) = 2: EV 8 on plane 0, EV 9 on plane 1
    evs = qa.evs
    assert evs.state[0] is EVState.ASSUMED_BAD and not evs.active[0]
    assert evs.assumed_bad >= 1
    joined = [e for e in events if e.reason is EVReason.REPLACES]
    assert [(e.ev, e.plane) for e in joined] == [(8, 0)]
    assert evs.active[8] and evs.state[8] is EVState.GOOD
    assert evs.active[9] is False and evs.is_backup(9)  # plane 1 lost nothing: its backup waits
    assert _in_rotation(qa, 0) == _in_rotation(qa, 1) == 4  # the planes stay level


def test_without_backups_a_retired_ev_leaves_its_plane_short() -> None:
    qa, events = _dead_ev_run(0)
    assert qa.evs.state[0] is EVState.ASSUMED_BAD
    assert not [e for e in events if e.reason is EVReason.REPLACES]
    assert (_in_rotation(qa, 0), _in_rotation(qa, 1)) == (3, 4)
