"""The failover demo's figures, computed from what its roles recorded.

A receiver records a series: times ``t`` (CLOCK_MONOTONIC, seconds) and, at each, the bytes
delivered so far ``v`` (MRC samples every ~1 ms, TCP and MPTCP at every ``recv``). From a series
and the times the link went down and came back up come the README's headline figures: the
largest delivery stall, goodput before / during / after the failure, the longest stretch below
half the rate before it. The MRC sender's EV event log gives how fast the failed link's EVs were
retired and how fast they came back after the heal.

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
    t_heal: float,
) -> dict[str, Any]:
    """EVs of the failed link that went ASSUMED_BAD during the outage, and when they came back.

    ``failed_routes``: {(plane, route)} of EVs crossing the link (a spine link); or
    ``failed_plane_all``: every EV of that plane (a host NIC link)."""

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
        if ev in bad_at and t >= t_heal and e[6].startswith("GOOD") and ev not in back:
            back[ev] = t
    still_bad = sorted(ev for ev in bad_at if ev not in back)
    return {
        "evs_failed": len(bad_at),
        "evs_back": len(back),
        "still_bad": still_bad,
        "detect_s": round(first_bad - t_fail, 4) if first_bad is not None else None,
        "resurrection_s": (
            round(max(back.values()) - t_heal, 4) if back and not still_bad else None
        ),
        "resurrection_first_s": round(min(back.values()) - t_heal, 4) if back else None,
    }


def analyse(
    name: str,
    recv: Mapping[str, Any],
    send: Mapping[str, Any],
    t_start: float,
    t_fail: float,
    t_heal: float,
    expect_sha: str,
    ctx: Mapping[str, Any],
) -> dict[str, Any]:
    """One transport's row of the demo's result, from its receiver's and sender's records.

    ``ctx``: ``capacity`` (:func:`capacities`) and, for MRC's EVs, ``failed_routes`` or
    ``failed_plane_all`` (see :func:`resurrection`)."""
    s = recv["samples"]
    t, placed, inorder = s["t"], s["placed"], s["inorder"]
    # first and last delivery
    t_first = next((ti for ti, v in zip(t, placed, strict=True) if v > 0), t_start)
    t_last = recv.get("t_done", t[-1] if t else t_start)
    stall, stall_at = max_stall(t, placed, t_first, t_last)
    stall_io, _stall_io_at = max_stall(t, inorder, t_first, t_last)
    fail_stall, _ = max_stall(t, placed, t_first, t_last, overlapping=(t_fail, t_heal))
    # the same run's stalls away from the outage: what this machine does to the transfer
    # anyway (its processes not scheduled), the level a stall in the failure is judged by
    calm_stall, _ = max_stall(t, placed, t_first, t_last, outside=(t_fail, t_heal))
    before = rate_between(t, placed, t_first, t_fail)
    during = rate_between(t, placed, t_fail, min(t_heal, t_last))
    after = rate_between(t, placed, t_heal, t_last)
    out: dict[str, Any] = {
        "ok": bool(recv.get("ok") and send.get("ok") and recv.get("sha256") == expect_sha),
        "sha256_match": recv.get("sha256") == expect_sha,
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
        "finished_before_heal": t_last < t_heal,
    }
    if before:
        out["below_half_rate_ms"] = round(
            1000 * longest_low(t, placed, t_fail, t_last, before / 2), 1
        )
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
    if name == "mptcp":
        out["subflows"] = send.get("subflows")
        out["connect_attempts"] = send.get("attempts")
    return out
