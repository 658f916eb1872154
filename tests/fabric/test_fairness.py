"""Two QPs from different hosts share one host's last hop, with default flags (NSCC).

h0 and h1 each send generated data for a few seconds (``mrc-send --time``) into h3 on a
trimming fabric of 4 planes x 100 Mbit/s: h3's four last-hop ports are the only bottleneck
(four spines per plane keep the leaf uplinks out of it, as in test_incast.py). Nothing is told
the rate. What the congestion control owes them: fair shares (Jain's index of the two
goodputs), no drop in the fabric (so no loss a timeout must repair: a timeout or two of a
starved CPU on a busy machine is allowed), every byte verified. The utilization of the
bottleneck (of what its links carry after headers) is reported (``pytest -s``,
``record_property``), not asserted: speed is measured, not asserted in tests.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from fabric.fabric_helpers import SKIP_REASON, running_fabric, unique_name
from fabric.test_incast import (
    PAYLOAD,
    RATE,
    SPINES,
    TRIM_REASON,
    Proc,
    mrc_recv,
    mrc_send,
)

from mrc import wire
from mrc.lab.fabric import FabricSpec, Topology
from mrc.lab.harness.fabric import port_counters as trim_counters

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")

SENDERS = ("h0", "h1")
RECEIVER = "h3"
SECONDS = 4.0
PLANES = 4
LINK_BPS = 100e6


def _jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _share(
    topo: Topology, port: int
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    procs: list[Proc] = []
    try:
        recv = mrc_recv(topo, RECEIVER, port, len(SENDERS))
        procs.append(recv)
        recv.wait_listening(port)
        before = trim_counters(topo)
        senders = {h: mrc_send(topo, h, RECEIVER, port, "--time", str(SECONDS)) for h in SENDERS}
        procs.extend(senders.values())
        sends = {h: p.wait(60)[0] for h, p in senders.items()}
        recvs = recv.wait(30)
        after = trim_counters(topo)
    finally:
        for p in procs:
            p.kill()
    fabric = {k: {c: after[k][c] - before[k][c] for c in ("trimmed", "drops")} for k in after}
    return sends, recvs, fabric


def test_two_qps_into_one_host_share_its_last_hop_fairly(
    record_property: Callable[[str, object], None],
) -> None:
    if TRIM_REASON is not None:
        pytest.skip(TRIM_REASON)
    spec = FabricSpec(name=unique_name("f"), spines=SPINES, mtu=9000, rate=RATE, trim=True)
    with running_fabric(spec) as topo:
        sends, recvs, fabric = _share(topo, 4821)
    assert len(recvs) == len(SENDERS)
    for h, s in sends.items():
        assert s["ok"] is True, (h, s.get("error"))
        # every byte sent was placed and hashed alike at both ends
        assert s["digest"] == s["digest_receiver"], h
        # a timeout the fabric did not cause (it dropped nothing: below) is a late packet or
        # ACK of a starved CPU, as on a busy machine: a few are allowed, not a habit
        assert s["retransmits_timeout"] <= max(2, s["data_packets"] // 1000), (h, s)
        assert s["seconds"] >= SECONDS * 0.9, (h, s["seconds"])
    assert sorted(r["bytes"] for r in recvs) == sorted(s["bytes"] for s in sends.values())
    # what the congestion control owes: the routers' queues never overflowed (trims, not drops)
    assert sum(v["drops"] for v in fabric.values()) == 0, fabric
    goodputs = [sends[h]["goodput_bps"] for h in SENDERS]
    fairness = _jain(goodputs)
    payload = sends[SENDERS[0]]["payload"]
    assert payload == PAYLOAD  # mrc-send's default on a jumbo fabric: the most that fits, 8 KiB
    # what the last hops carry at most: Ethernet, IPv6, a 2-segment SRH, UDP and MRC headers
    # around every payload
    frame = payload + 14 + 40 + 40 + 8 + wire.DATA_HDR_LEN
    utilization = sum(goodputs) / (PLANES * LINK_BPS * payload / frame)
    summary = {
        "goodputs_mbps": [round(g / 1e6, 1) for g in goodputs],
        "jain": round(fairness, 4),
        "of_line_rate": round(sum(goodputs) / (PLANES * LINK_BPS), 3),
        "of_payload_ceiling": round(utilization, 3),
        "fabric_trims": sum(v["trimmed"] for v in fabric.values()),
        "trims_seen": [sends[h].get("trims_seen") for h in SENDERS],
    }
    print("\ntwo QPs into one host:", json.dumps(summary))
    for k, v in summary.items():
        record_property(k, v)
    assert fairness >= 0.9, summary
