"""A backup never replaces an EV on the same route: a dead link kills every EV routed over it."""

from __future__ import annotations

from mrc.core.config import EVConfig
from mrc.core.events import EVReason, EVStateChanged
from mrc.core.evset import EVSet, EVState


def _evset(routes: list[int], active: int) -> tuple[EVSet, list[tuple[int, str, str, str]]]:
    log: list[tuple[int, str, str, str]] = []

    def note(e: EVStateChanged) -> None:
        log.append((e.ev, e.old_label, e.new_label, e.reason_text))

    evs = EVSet(
        list(range(1000, 1000 + len(routes))),
        [0] * len(routes),
        seed=1,
        active=active,
        routes=routes,
        on_change=note,
        config=EVConfig(route_dead_evs=0),
    )
    return evs, log


def test_replacement_comes_from_another_route() -> None:
    # 8 active EVs alternating over routes 0 and 1, then 4 backups: two on each route
    routes = [0, 1] * 4 + [0, 0, 1, 1]
    evs, log = _evset(routes, active=8)
    evs.lost(0, 1.0, EVReason.TIMEOUT)  # EV 0 is on route 0
    assert evs.state[0] == EVState.ASSUMED_BAD
    activated = [ev for ev, old, new, _ in log if old == "GOOD (backup)" and new == "GOOD"]
    assert len(activated) == 1 and routes[activated[0]] == 1


def test_no_backup_on_the_dead_route_when_only_that_route_has_backups() -> None:
    routes = [0, 1] * 4 + [0, 0]
    evs, log = _evset(routes, active=8)
    evs.lost(2, 1.0, EVReason.TIMEOUT)  # route 0; the only backups are on route 0 too
    assert evs.state[2] == EVState.ASSUMED_BAD
    assert not any(old == "GOOD (backup)" for _, old, _, _ in log)
    assert not evs.active[8] and not evs.active[9]


def test_one_route_per_plane_still_uses_backups() -> None:
    evs, log = _evset([0] * 10, active=8)
    evs.lost(3, 1.0, EVReason.TIMEOUT)
    assert [ev for ev, old, new, _ in log if old == "GOOD (backup)"] == [8]


def test_backups_prefer_routes_with_no_bad_evs() -> None:
    # routes 0, 1, 2; route 1 already has a bad EV, so route 2's backup is taken for route 0
    routes = [0, 1, 2] * 3 + [1, 2]
    evs, log = _evset(routes, active=9)
    evs.lost(1, 1.0, EVReason.TIMEOUT)  # route 1 EV goes bad, replaced (route 2's backup: 10)
    log.clear()
    evs.lost(
        0, 2.0, EVReason.TIMEOUT
    )  # route 0: remaining backup is 9 (route 1, which has a bad EV)
    activated = [ev for ev, old, _, _ in log if old == "GOOD (backup)"]
    assert activated == [9]  # the only one left; route 1 is suspect but not the dead route
