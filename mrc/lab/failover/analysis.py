"""The failover demo's figures, computed from what its roles recorded.

A receiver records a series: times ``t`` (CLOCK_MONOTONIC, seconds) and, at each, the bytes
delivered so far ``v`` (MRC samples every ~1 ms, TCP and MPTCP at every ``recv``). From a series
and the times the link went down and came back up (if it did) come the README's headline
figures: the largest delivery stall, goodput before / during / after the failure, the longest
stretch below half the rate before it, the time to recover. The MRC sender's EV event log gives
how fast the failed link's EVs were retired and how fast they came back after the heal; both MRC
ends' plane events, when the side channel's path over the failed plane was found dead and
joined again.

Pure functions of their arguments, so they are tested on synthetic series
(tests/lab/test_failover_analysis.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from mrc.topology import Topology

Series = Sequence[float]
Counts = Sequence[int]
#: one EV state change of the sender's log: t, ev, value (32-bit EV), plane, route, old, new, reason
EVEvent = Sequence[Any]
#: capacity of a transport's paths (bit/s): all links up, and with the failed link down
Capacity = tuple[float, float]
#: a rate assumed for a link without a shaping rate (an unshaped veth)
UNSHAPED_BPS = 10e9
#: time to recover: delivery must hold its level in every bin of this many seconds ...
RECOVERY_BIN_S = 0.1
#: ... for this long (or until the transfer ends, if at least one bin is left)
RECOVERY_HOLD_S = 0.5


def gaps(t: Series, v: Counts, t0: float, t1: float) -> list[tuple[float, float]]:
    """(start, end) of every interval between consecutive increases of ``v`` in [t0, t1].

    Samples are taken every ~1 ms (MRC) or at every recv (TCP): a stall runs from the last
    sample that saw new bytes to the next one that did."""
    out = []
    last = None
    prev = None
    for ti, vi in zip(t, v, strict=True):
        if ti < t0 or ti > t1:
            prev = vi
            continue
        if prev is None or vi > prev:
            if last is not None:
                out.append((last, ti))
            last = ti
        prev = vi
    return out


def max_stall(
    t: Series,
    v: Counts,
    t0: float,
    t1: float,
    overlapping: tuple[float, float] | None = None,
    outside: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """Largest gap (s, start time); with ``overlapping``, only gaps that overlap it; with
    ``outside``, only gaps that do not."""
    best, at = 0.0, t0
    for a, b in gaps(t, v, t0, t1):
        if overlapping is not None and (b < overlapping[0] or a > overlapping[1]):
            continue
        if outside is not None and not (b < outside[0] or a > outside[1]):
            continue
        if b - a > best:
            best, at = b - a, a
    return best, at


def last_arrival(t: Series, v: Counts) -> float | None:
    """When the last new bytes arrived: the first sample with the final count (None: no
    bytes at all)."""
    if not v or v[-1] <= 0:
        return None
    return t[bisect.bisect_left(v, v[-1])]


def bytes_at(t: Series, v: Counts, when: float) -> int:
    """Bytes delivered by time ``when`` (last sample at or before it)."""
    i = bisect.bisect_right(t, when) - 1
    return v[i] if i >= 0 else (v[0] if v else 0)


def rate_between(t: Series, v: Counts, a: float, b: float) -> float | None:
    """Goodput (bit/s) from ``a`` to ``b``; None for an interval too short to say."""
    if b - a <= 0.05:
        return None
    return (bytes_at(t, v, b) - bytes_at(t, v, a)) * 8 / (b - a)


def longest_low(
    t: Series, v: Counts, a: float, b: float, level_bps: float, bin_s: float = 0.02
) -> float:
    """Longest run (s) of ``bin_s`` bins in [a, b] whose goodput stays below ``level_bps``."""
    best = run = 0.0
    x = a
    while x + bin_s <= b:
        r = (
            rate_between(t, v, x, x + bin_s)
            if bin_s > 0.05
            else ((bytes_at(t, v, x + bin_s) - bytes_at(t, v, x)) * 8 / bin_s)
        )
        run = run + bin_s if r is not None and r < level_bps else 0.0
        best = max(best, run)
        x += bin_s
    return best


def recovery(
    t: Series,
    v: Counts,
    t_fail: float,
    t_end: float,
    level_bps: float,
    bin_s: float = RECOVERY_BIN_S,
    hold_s: float = RECOVERY_HOLD_S,
) -> float | None:
    """Time to recover: seconds from the failure ``t_fail`` to the start of the first stretch
    of ``hold_s`` (shorter if the transfer ends at ``t_end`` first, but at least one bin) whose
    every ``bin_s`` bin delivers at least ``level_bps``; None if there is none.

    Stretches start at the failure or at a sample after it that saw new bytes (a stretch
    starting inside a stall would count the stall's tail as recovered). 0 when delivery never
    fell below the level for a whole bin: a stall much shorter than a bin does not count here
    (the stall figures show it)."""
    if level_bps <= 0:
        return 0.0
    first = bisect.bisect_right(t, t_fail)
    starts = [t[i] for i in range(max(first, 1), len(t)) if v[i] > v[i - 1]]
    for s in (t_fail, *starts):
        stop = min(s + hold_s, t_end)
        if stop - s < bin_s - 1e-9:
            return None  # later starts have less left still
        x = s
        while x + bin_s <= stop + 1e-9:
            if (bytes_at(t, v, x + bin_s) - bytes_at(t, v, x)) * 8 / bin_s < level_bps:
                break
            x += bin_s
        else:
            return s - t_fail
    return None


def series(t: Series, v: Counts, t0: float, bin_s: float) -> tuple[list[float], list[float]]:
    """Goodput (Mbit/s) in bins of ``bin_s``, at bin centres relative to ``t0``: a plot's
    line."""
    if not t:
        return [], []
    xs, ys = [], []
    end = t[-1]
    b = t0
    while b < end:
        r = rate_between(t, v, b, b + bin_s)
        xs.append(b + bin_s / 2 - t0)
        ys.append((r or 0.0) / 1e6)
        b += bin_s
    return xs, ys


def _link_rate(topo: Topology, failed: tuple[str, str] | None, x: str, y: str) -> float:
    """The rate of link x-y (bit/s), 0 if it is the failed one."""
    if failed and {x, y} == set(failed):
        return 0.0
    return float(topo.link_between(x, y).rate_bps or UNSHAPED_BPS)


def plane_capacity(
    topo: Topology, failed: tuple[str, str] | None, src: str, dst: str
) -> list[float]:
    """Per plane: the max flow from ``src`` to ``dst`` (bit/s), two-tier Clos, one link down."""
    caps = []
    for p in range(topo.planes):
        ls = topo.host(src).nic(p).leaf
        ld = topo.host(dst).nic(p).leaf
        spines = [r.name for r in topo.routers if r.plane == p and r.tier == "spine"]
        middle = (
            sum(
                min(_link_rate(topo, failed, ls, s), _link_rate(topo, failed, ld, s))
                for s in spines
            )
            if ls != ld
            else 1e12
        )
        caps.append(
            min(_link_rate(topo, failed, src, ls), middle, _link_rate(topo, failed, dst, ld))
        )
    return caps


def spine0_capacity(
    topo: Topology, plane: int, failed: tuple[str, str] | None, src: str, dst: str
) -> float:
    """Capacity of plain destination routing ``src`` -> ``dst`` in ``plane``: always via spine
    0, as TCP and each MPTCP subflow go."""
    ls = topo.host(src).nic(plane).leaf
    ld = topo.host(dst).nic(plane).leaf
    s0 = f"p{plane}s0"
    return min(
        _link_rate(topo, failed, src, ls),
        _link_rate(topo, failed, ls, s0),
        _link_rate(topo, failed, ld, s0),
        _link_rate(topo, failed, dst, ld),
    )


def capacities(
    topo: Topology, failed: tuple[str, str], tcp_plane: int, src: str, dst: str
) -> dict[str, Capacity]:
    """Per transport, what its paths can carry with every link up and with ``failed`` down:
    MRC every plane's max flow, MPTCP spine 0 of every plane, TCP spine 0 of ``tcp_plane``."""
    planes = range(topo.planes)
    return {
        "mrc": (
            sum(plane_capacity(topo, None, src, dst)),
            sum(plane_capacity(topo, failed, src, dst)),
        ),
        "mptcp": (
            sum(spine0_capacity(topo, p, None, src, dst) for p in planes),
            sum(spine0_capacity(topo, p, failed, src, dst) for p in planes),
        ),
        "tcp": (
            spine0_capacity(topo, tcp_plane, None, src, dst),
            spine0_capacity(topo, tcp_plane, failed, src, dst),
        ),
    }


def resurrection(
    events: Sequence[EVEvent],
    failed_routes: set[tuple[int, str]] | None,
    failed_plane_all: int | None,
    t_fail: float,
    t_heal: float | None,
) -> dict[str, Any]:
    """EVs of the failed link that went ASSUMED_BAD during the outage, and when they came back.

    ``failed_routes``: {(plane, route)} of EVs crossing the link (a spine link); or
    ``failed_plane_all``: every EV of that plane (a host NIC link). ``t_heal`` None: the link
    never healed (none comes back)."""

    def affected(e: EVEvent) -> bool:
        if failed_plane_all is not None:
            return bool(e[3] == failed_plane_all)
        return (e[3], e[4]) in (failed_routes or set())

    bad_at: dict[int, float] = {}
    first_bad: float | None = None
    for e in events:
        t, ev, _value, _plane, _route, _old, new, _reason = e
        if not affected(e):
            continue
        if new == "ASSUMED_BAD" and t >= t_fail - 0.01 and ev not in bad_at:
            bad_at[ev] = t
            first_bad = t if first_bad is None else min(first_bad, t)
    back: dict[int, float] = {}
    for e in events:
        t, ev, *_rest = e
        if t_heal is None or ev not in bad_at or ev in back:
            continue
        if t >= t_heal and e[6].startswith("GOOD"):
            back[ev] = t
    still_bad = sorted(ev for ev in bad_at if ev not in back)
    healed = t_heal if t_heal is not None else 0.0  # (nothing is back without a heal)
    return {
        "evs_failed": len(bad_at),
        "evs_back": len(back),
        "still_bad": still_bad,
        "detect_s": round(first_bad - t_fail, 4) if first_bad is not None else None,
        "resurrection_s": (
            round(max(back.values()) - healed, 4) if back and not still_bad else None
        ),
        "resurrection_first_s": round(min(back.values()) - healed, 4) if back else None,
    }


def _first(times: Sequence[float], after: float | None) -> float | None:
    """The first of ``times`` at or after ``after`` (10 ms of slack: the failure call's own
    time), or None."""
    if after is None:
        return None
    later = [x for x in times if x >= after - 0.01]
    return min(later) if later else None


def side_channel(
    send: Mapping[str, Any],
    recv: Mapping[str, Any],
    failed_plane: int | None,
    t_start: float,
    t_fail: float,
    t_heal: float | None,
) -> dict[str, Any]:
    """What the MRC ends saw of the failed plane, from their records (``side_channel``: the
    plane the side channel was set up over; ``plane_events``: planes lost and back, on the
    data path and on the side channel, as mrc-send --json lists them, times on
    CLOCK_MONOTONIC): the set-up's plane, whether it is the failed one, and how long after the
    failure either end found the failed plane's side-channel path (and its data path) dead, and
    after the heal joined again. Every event is listed too, its time from ``t_start``."""
    setup = send.get("side_channel", {}).get("setup_plane")
    events = [
        {"end": end, **e}
        for end, rec in (("sender", send), ("receiver", recv))
        for e in rec.get("plane_events", [])
    ]
    events.sort(key=lambda e: float(e["t"]))

    def when(layer: str, event: str, after: float | None) -> float | None:
        times = [
            float(e["t"])
            for e in events
            if e["layer"] == layer and e["event"] == event and e["plane"] == failed_plane
        ]
        got = _first(times, after)
        return round(got - after, 3) if got is not None and after is not None else None

    return {
        "setup_plane": setup,
        "setup_plane_receiver": recv.get("side_channel", {}).get("setup_plane"),
        "on_failed_plane": setup is not None and setup == failed_plane,
        "lost_after_s": when("side_channel", "lost", t_fail),
        "back_after_heal_s": when("side_channel", "back", t_heal),
        "data_lost_after_s": when("data", "lost", t_fail),
        "data_back_after_heal_s": when("data", "back", t_heal),
        "planes_at_end": send.get("side_channel", {}).get("planes_at_end"),
        "events": [
            {
                "end": e["end"],
                "t_s": round(float(e["t"]) - t_start, 3),
                "plane": e["plane"],
                "event": e["event"],
                "layer": e["layer"],
                "why": e["why"],
            }
            for e in events
        ],
    }


def expected_rate(before: float | None, capacity: Capacity) -> float | None:
    """The goodput a transport should keep with the failed link gone: its rate before, scaled
    by the capacity its paths keep; a transport left with none (TCP pinned to the failed path)
    gets its whole rate before, which only a heal can give back."""
    if before is None:
        return None
    full, during = capacity
    return before * (during / full) if during > 0 and full > 0 else before


def analyse(
    name: str,
    recv: Mapping[str, Any],
    send: Mapping[str, Any],
    t_start: float,
    t_fail: float,
    t_heal: float | None,
    expect_sha: str,
    ctx: Mapping[str, Any],
) -> dict[str, Any]:
    """One transport's row of the demo's result, from its receiver's and sender's records.

    ``t_heal`` None: the link never healed (no goodput after, no resurrection). ``ctx``:
    ``capacity`` (:func:`capacities`), ``failed_plane`` (the failed link's plane) and, for
    MRC's EVs, ``failed_routes`` or ``failed_plane_all`` (see :func:`resurrection`)."""
    s = recv["samples"]
    t, placed, inorder = s["t"], s["placed"], s["inorder"]
    # first and last delivery
    t_first = next((ti for ti, v in zip(t, placed, strict=True) if v > 0), t_start)
    t_last = recv.get("t_done", t[-1] if t else t_start)
    outage = (t_fail, t_heal if t_heal is not None else max(t_last, t_fail))
    stall, stall_at = max_stall(t, placed, t_first, t_last)
    stall_io, _stall_io_at = max_stall(t, inorder, t_first, t_last)
    fail_stall, _ = max_stall(t, placed, t_first, t_last, overlapping=outage)
    # the same run's stalls away from the outage: what this machine does to the transfer
    # anyway (its processes not scheduled), the level a stall in the failure is judged by
    calm_stall, _ = max_stall(t, placed, t_first, t_last, outside=outage)
    before = rate_between(t, placed, t_first, t_fail)
    during = rate_between(t, placed, t_fail, min(outage[1], t_last))
    after = rate_between(t, placed, t_heal, t_last) if t_heal is not None else None
    finished = bool(recv.get("finished", True))
    if not finished:  # it gave up: the last stall lasted from its last bytes until then
        tail = last_arrival(t, placed)
        if tail is not None and t_last - tail > stall:
            stall, stall_at = t_last - tail, tail
        if tail is not None and t_last - tail > fail_stall and t_last >= t_fail:
            fail_stall = t_last - tail
        tail_io = last_arrival(t, inorder)
        if tail_io is not None and t_last - tail_io > stall_io:
            stall_io = t_last - tail_io
    out: dict[str, Any] = {
        "ok": bool(recv.get("ok") and send.get("ok") and recv.get("sha256") == expect_sha),
        "sha256_match": recv.get("sha256") == expect_sha,
        "finished": finished,
        "bytes": recv.get("bytes"),
        "seconds": round(t_last - t_start, 3),
        "max_stall_ms": round(stall * 1000, 1),
        "max_stall_at_s": round(stall_at - t_start, 3),
        "max_stall_in_failure_ms": round(fail_stall * 1000, 1),
        "max_stall_outside_failure_ms": round(calm_stall * 1000, 1),
        "max_stall_inorder_ms": round(stall_io * 1000, 1),
        "goodput_before_bps": round(before) if before is not None else None,
        "goodput_during_bps": round(during) if during is not None else None,
        "goodput_after_bps": round(after) if after is not None else None,
        "finished_before_heal": finished and t_last < t_heal if t_heal is not None else None,
    }
    if before:
        out["below_half_rate_ms"] = round(
            1000 * longest_low(t, placed, t_fail, t_last, before / 2), 1
        )
    level = expected_rate(before, ctx["capacity"][name])
    back = recovery(t, placed, t_fail, t_last, level / 2) if level is not None else None
    out["recovery_ms"] = round(back * 1000, 1) if back is not None else None
    errors = [str(x) for x in (*send.get("errors", []), *recv.get("errors", []))]
    if errors:
        out["errors"] = errors
    if name == "mrc" and len(t) > 1:
        # the receiver samples every ~1 ms; a gap here is the process not being scheduled,
        # which no transport can beat: stalls shorter than this are not measurable
        sampler = [t[i + 1] - t[i] for i in range(len(t) - 1) if t_first <= t[i] <= t_last]
        out["sampler_max_gap_ms"] = round(1000 * max(sampler), 1) if sampler else None
    cap = ctx["capacity"][name]
    out["capacity_bps"] = round(cap[0])
    out["capacity_during_bps"] = round(cap[1])
    if during is not None and cap[1] > 0:
        out["during_vs_capacity"] = round(during / cap[1], 3)
    if name == "mrc":
        ev = send.get("evs", {})
        out["evs_assumed_bad"] = ev.get("evs_assumed_bad")
        out["evs_resurrected"] = ev.get("evs_resurrected")
        out["planes_lost"] = ev.get("planes_lost")
        res = resurrection(
            send.get("ev_events", []),
            ctx.get("failed_routes"),
            ctx.get("failed_plane_all"),
            t_fail,
            t_heal,
        )
        out["resurrection_s"] = res["resurrection_s"]
        out["failed_link_evs"] = res
        st = send.get("stats", {})
        out["retransmits"] = st.get("retransmits")
        out["retransmits_sack"] = st.get("retransmits_sack")
        out["retransmits_timeout"] = st.get("retransmits_timeout")
        out["srtt_ms"] = round(st["srtt"] * 1000, 2) if st.get("srtt") else None
        out["receiver_duplicates"] = recv.get("stats", {}).get("duplicates")
        out["receiver_evs"] = recv.get("evs")
        if "side_channel" in send:
            out["side_channel"] = side_channel(
                send, recv, ctx.get("failed_plane"), t_start, t_fail, t_heal
            )
    if name == "mptcp":
        out["subflows"] = send.get("subflows")
        out["connect_attempts"] = send.get("attempts")
    if name != "mrc" and "bytes_sent" in send:
        out["bytes_sent"] = send["bytes_sent"]
    return out
