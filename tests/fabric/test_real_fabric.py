"""``--fabric FILE`` with a real-fabric file, end to end on routers that really forward SRv6.

The namespace fabric stands in for a real one: we take its hosts' plane addresses and its
spines' SIDs, as a user would read them off their routers, write them into a real-fabric file
(docs/FABRIC.md, "Real networks") under names of our own, and move data with mrc-send and
mrc-recv reading only that file. The spines' own interface counters must show the data crossing
every spine, under the file's names in the sender's report, and the hash must verify.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fabric.fabric_helpers import SKIP_REASON, needs_netns, running_fabric, unique_name

if TYPE_CHECKING:
    from conftest import MrcTools

from mrc.lab.fabric import Fabric, FabricSpec, Topology

pytestmark = [needs_netns, pytest.mark.netns]

PORT = 4811


@pytest.fixture(scope="module")
def rfab() -> Iterator[Topology]:
    """2 planes x 2 spines, one host on each of the 2 leaves: every packet turns at a spine."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    with running_fabric(FabricSpec(name=unique_name("r"), planes=2, hosts=2)) as topo:
        yield topo


HOST_NAMES = {"h0": "left", "h1": "right"}


def spine_name(plane: int, index: int) -> str:
    return f"plane{plane}-spine{'ab'[index]}"


def real_file(topo: Topology, path: Path) -> dict[str, str]:
    """Write the hand-made description of ``topo``; returns file spine name -> router name."""
    names = {}
    planes = []
    for p in range(topo.planes):
        spines = []
        for r in topo.spines(p):
            names[spine_name(p, r.index)] = r.name
            spines.append({"name": spine_name(p, r.index), "sid": r.sid})
        planes.append({"plane": p, "spines": spines})
    hosts = [
        {
            "name": HOST_NAMES[h.name],
            "nics": [{"plane": n.plane, "address": n.address} for n in h.nics],
        }
        for h in topo.hosts
    ]
    path.write_text(json.dumps({"name": "lab", "planes": planes, "hosts": hosts}, indent=2))
    return names


def spine_rx(topo: Topology) -> dict[tuple[str, str], int]:
    """(spine, port) -> packets received, from the spines' kernels."""
    out = {}
    for lk in Fabric.status(topo.name)["links"]:
        if lk["kind"] == "leaf-spine":
            out[(lk["b"], lk["b_end"]["ifname"])] = lk["b_end"]["rx_packets"]
    return out


def test_a_transfer_sprays_over_every_spine_named_in_the_file(
    rfab: Topology, mrc_tools: MrcTools, tmp_path: Path
) -> None:
    topo = rfab
    path = tmp_path / "lab.json"
    names = real_file(topo, path)
    recv = mrc_tools.start(
        "mrc-recv",
        "--fabric",
        str(path),
        "--listen",
        f"[::]:{PORT}",
        "--discard",
        "--json",
        "--no-progress",
        ns=topo.netns_of("h1"),
    )
    recv.wait_listening(PORT)
    before = spine_rx(topo)
    send = mrc_tools.run(
        "mrc-send",
        "--fabric",
        str(path),
        "--fabric-host",
        "left",
        "--to",
        f"right:{PORT}",
        "--size",
        "8M",
        "--json",
        "--no-progress",
        ns=topo.netns_of("h0"),
        timeout=90,
    )
    got = recv.wait(30)
    after = spine_rx(topo)
    assert send.returncode == 0, send.describe()
    assert got.returncode == 0, got.describe()
    s, r = send.json, got.json
    assert s["ok"] is True and r["ok"] is True
    assert s["bytes"] == r["bytes_placed"] == 8 << 20
    assert s["digest"] == s["digest_receiver"] == r["digest"] == r["digest_sender"]
    # the receiver listened on right's plane addresses, taken from the file
    right = topo.host("h1")
    assert s["to"] == f"[{right.nics[0].address}]:{PORT}"
    assert s["planes"] == 2

    per_route: collections.Counter[str] = collections.Counter()
    for ev in s["evs"]:
        per_route[ev["route"]] += ev["packets"]
    assert sorted(per_route) == sorted(names), per_route  # the file's names, every spine
    assert sum(per_route.values()) == s["packets_sent"]

    # the spines saw it: data in from leaf 0 and ACKs in from leaf 1 on every one of them
    for label, spine in names.items():
        data_in = after[(spine, "l0")] - before[(spine, "l0")]
        acks_in = after[(spine, "l1")] - before[(spine, "l1")]
        assert data_in >= 0.9 * per_route[label], (label, spine, data_in, per_route)
        assert per_route[label] >= 0.1 * s["packets_sent"], (label, per_route)
        assert acks_in > 0, (label, spine, "no ACKs came back through it")
