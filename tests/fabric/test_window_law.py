"""A window law written outside mrc moves data through real routers: ``mrc-send --cc
examples/dctcp_window.py:Dctcp`` loads it in each sender's namespace, and nothing in mrc names it.

h0 and h1 share leaf 0 and write into h2 and h3 on leaf 1, over a trimming fabric of 4 planes x
1 spine at 100 Mbit/s: the two senders offer twice what leaf 0's four uplinks carry, so those
router-to-router ports are the bottleneck, and they mark CE (``--ecn-threshold``) before they
trim. What the law owes: every byte placed and verified, the CE echoes reaching the senders
(the law's only ECN input), no run of timeouts, and a queue that trims a small fraction of the
packets (a fixed window above the queue has many times more trimmed; docs/CONGESTION.md,
"Writing a window law"). Its numbers are printed (``pytest -s``) and attached with
``record_property``.

A defect this test found: about one run in four, the law's doubling start handed a sender's
own NIC more than its 64-frame queue holds on each plane (234 tail drops, 242 timeouts in a
16 MiB transfer), because an EV socket could queue 4 MiB below it. Kernel TCP has small queues;
EV sockets now have a send buffer under the NIC's queue (``mrc.transport.sockets.EV_SNDBUF``),
so the sender waits for room instead, and neither the hosts' NICs nor the routers drop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from fabric.fabric_helpers import REPO, SKIP_REASON, running_fabric, unique_name
from fabric.test_incast import PAYLOAD, RATE, TRIM_REASON, Proc, mrc_recv, mrc_send

from mrc.lab.fabric import FabricSpec
from mrc.lab.harness.fabric import port_counters as trim_counters

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.netns,
    pytest.mark.slow,
]

LAW = f"{REPO / 'examples' / 'dctcp_window.py'}:Dctcp"
PAIRS = (("h0", "h2"), ("h1", "h3"))
SIZE = "16M"


def test_an_outside_window_law_moves_data_through_the_fabric(
    record_property: Callable[[str, object], None],
) -> None:
    if TRIM_REASON is not None:
        pytest.skip(TRIM_REASON)
    spec = FabricSpec(
        name=unique_name("w"), spines=1, mtu=9000, rate=RATE, trim=True, ecn_threshold=0.5
    )
    port = 4831
    procs: list[Proc] = []
    with running_fabric(spec) as topo:
        try:
            recvs = {dst: mrc_recv(topo, dst, port, 1) for _src, dst in PAIRS}
            procs.extend(recvs.values())
            for r in recvs.values():
                r.wait_listening(port)
            before = trim_counters(topo)
            senders = {
                src: mrc_send(topo, src, dst, port, "--size", SIZE, "--cc", LAW)
                for src, dst in PAIRS
            }
            procs.extend(senders.values())
            sends = {h: p.wait(90)[0] for h, p in senders.items()}
            got = {h: p.wait(30)[0] for h, p in recvs.items()}
            after = trim_counters(topo)
        finally:
            for p in procs:
                p.kill()
    trims = sum(after[k]["trimmed"] - before[k]["trimmed"] for k in after)
    drops = {k: after[k]["drops"] - before[k]["drops"] for k in after}
    host_drops = {h: sum(v for k, v in drops.items() if k.startswith(f"{h}:")) for h in sends}
    data_packets = sum(s["data_packets"] for s in sends.values())
    summary = {
        "goodputs_mbps": {h: round(s["goodput_bps"] / 1e6, 1) for h, s in sends.items()},
        "ecn_echoes": {h: s["ecn_echoes"] for h, s in sends.items()},
        "retransmits": {h: s["retransmits"] for h, s in sends.items()},
        "timeouts": {h: s["retransmits_timeout"] for h, s in sends.items()},
        "fabric_trims_per_data_packet": round(trims / max(1, data_packets), 4),
        "own_nic_drops": host_drops,
        "router_drops": sum(v for k, v in drops.items() if k.split(":")[0] not in sends),
    }
    print("\nDCTCP-style law from examples/:", json.dumps(summary))
    for k, v in summary.items():
        record_property(k, v)
    for (src, dst), s in zip(PAIRS, sends.values(), strict=True):
        assert s["ok"] is True, (src, s.get("error"))
        assert s["payload"] == PAYLOAD
        assert s["bytes"] == got[dst]["bytes_placed"] == 16 << 20
        assert s["digest"] == s["digest_receiver"] == got[dst]["digest"], src
        assert s["ecn_echoes"] > 0, (src, summary)  # the routers' marks reached the law
        assert host_drops[src] == 0, (src, summary)  # its socket waits, its NIC never drops
        assert s["retransmits_timeout"] <= 2, (src, summary)  # no run of timeouts
    assert summary["router_drops"] == 0, summary  # the routers trim, they never drop
    assert trims <= 0.2 * data_packets, summary
