"""Datagrams that fit the path MTU with their routing header (MTU 1500, SRv6 paths).

An SRH of two segments adds 40 bytes: a 1400-byte payload makes 1516-byte packets. Sent one by
one, the kernel fragments them (half the goodput); in GSO bursts it dropped them without a
counter moving, and EV health took that for dead paths. mrc-send now picks a default payload
that fits a fabric's MTU, and the transport sends datagrams that do not fit one by one.

With uSID routes the 40 bytes are the outer IPv6 header, and a datagram that does not fit is
fragmented outside it, which the receiving host's decapsulation cannot reassemble: mrc-send
refuses such a --payload in one line instead of losing every datagram.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from fabric.fabric_helpers import (
    SKIP_REASON,
    needs_netns,
    running_fabric,
    start_fabric_recv,
    unique_name,
)

from mrc import wire
from mrc.lab.fabric import FabricSpec, Topology
from mrc.srv6.evroutes import route_overhead
from mrc.topology.model import SRV6_MODES

if TYPE_CHECKING:
    from conftest import MrcTools

pytestmark = [needs_netns, pytest.mark.netns]


@pytest.fixture(scope="module", params=SRV6_MODES)
def fab1500(request: pytest.FixtureRequest) -> Iterator[Topology]:
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    spec = FabricSpec(name=unique_name("u"), mtu=1500, rate="1gbit", srv6=request.param)
    with running_fabric(spec) as topo:
        yield topo


def _transfer(
    topo: Topology, mrc_tools: MrcTools, port: int, *extra: str
) -> tuple[dict[str, Any], dict[str, Any], str]:
    recv = start_fabric_recv(mrc_tools, topo, "h3", port)
    send = mrc_tools.run(
        "mrc-send",
        "--fabric",
        topo.name,
        "--to",
        f"h3:{port}",
        "--size",
        "16M",
        "--json",
        "--no-progress",
        *extra,
        ns=topo.netns_of("h0"),
        timeout=90,
    )
    r = recv.wait(30)
    assert send.returncode == 0, send.describe()
    assert r.returncode == 0, r.describe()
    s, rv = send.json, r.json
    assert s["ok"] is True and rv["ok"] is True, (s.get("error"), rv.get("error"))
    assert s["digest"] == s["digest_receiver"] == rv["digest"] == rv["digest_sender"]
    return s, rv, send.stderr


def test_the_default_payload_fits_the_fabric_mtu_with_its_srh(
    fab1500: Topology, mrc_tools: MrcTools
) -> None:
    srh = route_overhead(fab1500)
    assert srh == 40  # two segments (the spine and the destination), or the outer header
    s, rv, _err = _transfer(fab1500, mrc_tools, 4801)
    assert s["payload"] == 1500 - 40 - 8 - srh - wire.DATA_IMM_HDR_LEN == 1380
    # nothing lost: no retransmission but tail loss probes, no EV retired, every datagram
    # arrived once. A probe may still fire when a busy core stalls the receiver for a few
    # milliseconds (2 runs in 12 here, with or without reverse probes); its ACK then shows
    # the original had arrived (losses_tlp 0) and its copy arrives as a duplicate
    assert s["retransmits"] == s["retransmits_tlp"] and s["losses_tlp"] == 0, s
    assert s["evs_assumed_bad"] == 0, s
    assert rv["packets_received"] - rv["duplicates"] == s["data_packets"], (s, rv)
    assert rv["duplicates"] <= s["retransmits_tlp"], (s, rv)


def test_a_payload_too_large_for_the_mtu_is_fragmented_not_lost(
    fab1500: Topology, mrc_tools: MrcTools
) -> None:
    if fab1500.srv6 == "usid":
        res = mrc_tools.run(
            "mrc-send",
            "--fabric",
            fab1500.name,
            "--to",
            "h3:4803",
            "--size",
            "1M",
            "--payload",
            "1400",
            ns=fab1500.netns_of("h0"),
            timeout=60,
        )
        assert res.returncode == 2, res.describe()
        assert "does not fit" in res.stderr and "at most 1380 fits" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        return
    s, rv, err = _transfer(fab1500, mrc_tools, 4802, "--payload", "1400")
    assert s["payload"] == 1400
    assert "exceed what the path MTU leaves" in err and "at most 1380 bytes fits" in err, err
    # nothing lost (a lost fragment loses its datagram: a SACK loss or a timeout). A tail
    # loss probe may still fire when a busy core stalls the receiver for a few milliseconds
    assert s["retransmits"] == s["retransmits_tlp"] and s["evs_assumed_bad"] == 0, s
    # every packet arrived once; a probe's copy arrives as a duplicate
    assert rv["packets_received"] - rv["duplicates"] == s["data_packets"], (s, rv)
    assert rv["duplicates"] <= s["retransmits_tlp"], (s, rv)
