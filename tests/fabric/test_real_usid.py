"""A real uSID fabric from a file: ``mrc-host-setup`` once as root, then mrc as nobody.

The namespace fabric stands in for real uSID routers: its leaves and spines run the kernel's
next-csid End on their micro-SIDs. Its hosts' own uSID set-up (the lab's socket-mark tables)
is taken away first, so the hosts look like real ones with addresses and plain routes only;
the fabric is then described in a real-fabric file under names of our own (docs/FABRIC.md,
"Real uSID fabrics"), ``mrc-host-setup`` sets up each host from that file, and mrc-send and
mrc-recv move data as user nobody, reading only the file. The spines' own counters must show
every spine carrying the data encapsulated and not one routing header.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fabric.fabric_helpers import SKIP_REASON, needs_netns, running_fabric, unique_name
from nobody import NOBODY, why_nobody_cannot_run_mrc

if TYPE_CHECKING:
    from conftest import MrcTools

from mrc.lab.fabric import Fabric, FabricSpec, Topology, netns
from mrc.lab.fabric import usid_routes as lab_usid
from mrc.srv6 import hostroutes, usid
from mrc.srv6.srh import IPV6_RTHDR, encode_srh
from mrc.topology.realfile import UsidTopology, load_fabric

pytestmark = [needs_netns, pytest.mark.netns]

PORT = 4821
BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)
HOSTS = {"h0": "gpu0", "h1": "gpu1"}


def leaf_name(plane: int, index: int) -> str:
    return f"plane{plane}-leaf{index}"


def spine_name(plane: int, index: int) -> str:
    return f"plane{plane}-spine{'ab'[index]}"


def usid_doc(topo: Topology) -> dict[str, Any]:
    """The real-fabric file of ``topo``: its routers' micro-SIDs and its hosts' NICs, as a user
    would read them off their routers and hosts, under names of our own."""
    planes = []
    for p in range(topo.planes):
        leaves = [
            {"name": leaf_name(p, r.index), "usid": f"{usid.leaf_usid(p, r.index):x}"}
            for r in topo.leaves(p)
        ]
        spines = [
            {"name": spine_name(p, r.index), "usid": f"{usid.spine_usid(p, r.index):x}"}
            for r in topo.spines(p)
        ]
        planes.append({"plane": p, "leaves": leaves, "spines": spines})
    hosts = [
        {
            "name": HOSTS[h.name],
            "nics": [
                {
                    "plane": n.plane,
                    "address": n.address,
                    "leaf": leaf_name(n.plane, topo.router(n.leaf).index),
                    "usid": f"{usid.downlink_usid(n.plane, h.index):x}",
                    "dev": n.nic,
                    "gateway": n.gateway,
                }
                for n in h.nics
            ],
        }
        for h in topo.hosts
    ]
    return {
        "name": "lab",
        "srv6": "usid",
        "usid": {"block": usid.BLOCK_PREFIX, "mtu": topo.mtu, "table": 4100},
        "planes": planes,
        "hosts": hosts,
    }


def ip(ns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "-n", ns, *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def strip_lab_host_routes(topo: Topology) -> None:
    """Take away what mrc-fabric set up on its hosts for uSID (mark rules, the tables they
    pick, the leaf prefix and decapsulation routes): what is left is a host with addresses and
    plain routes, as a real one is before its set-up."""
    for host in topo.hosts:
        ns = host.netns
        for line in lab_usid.node_setup(topo, host.name):
            ip(ns, "-6", *line.replace("rule add", "rule del").split())
        for nic in host.nics:
            ip(ns, "-6", "route", "del", usid.leaf_prefix(nic.plane), "dev", nic.nic)
            own = usid.locator(usid.downlink_usid(nic.plane, host.index))
            ip(ns, "-6", "route", "del", own, "dev", nic.nic)
        for s in range(topo.spines_per_plane):
            ip(ns, "-6", "route", "flush", "table", str(usid.table(s)))


def state(ns: str) -> list[str]:
    """A namespace's IPv6 rules and routes (all tables), as ip shows them."""
    return ip(ns, "-6", "rule", "show").splitlines() + sorted(
        ip(ns, "-6", "route", "show", "table", "all").splitlines()
    )


@pytest.fixture(scope="module")
def ufab() -> Iterator[Topology]:
    """2 planes x 2 spines, one host on each of the 2 leaves (every packet turns at a spine),
    uSID routers, MTU 9000; the hosts stripped of the lab's own uSID set-up."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    spec = FabricSpec(name=unique_name("u"), planes=2, hosts=2, mtu=9000, srv6="usid")
    with running_fabric(spec) as topo:
        strip_lab_host_routes(topo)
        yield topo


@pytest.fixture(scope="module")
def fabric_file(ufab: Topology) -> Iterator[Path]:
    """The file, where user nobody can read it (pytest's tmp_path is root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="mrc-usid-"))
    try:
        where.chmod(0o755)
        path = where / "lab.json"
        path.write_text(json.dumps(usid_doc(ufab), indent=2))
        path.chmod(0o644)
        yield path
    finally:
        shutil.rmtree(where)


def host_setup(
    topo: Topology, host: str, path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """mrc-host-setup in ``host``'s namespace, as root."""
    return subprocess.run(
        ["ip", "netns", "exec", topo.netns_of(host), str(BIN / "mrc-host-setup")]
        + ["--fabric", str(path), "--host", HOSTS[host], *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_nobody(mrc_tools: Any, ns: str, tool: str, *args: str) -> Any:
    """Start an mrc tool in ``ns`` as user nobody: no capability at all."""
    running = type(mrc_tools).start.__globals__["Running"]  # tests/conftest.py's
    r = running(["ip", "netns", "exec", ns, *NOBODY, str(BIN / tool), *args])
    mrc_tools.started.append(r)
    return r


def test_dry_run_prints_the_lines_and_changes_nothing(ufab: Topology, fabric_file: Path) -> None:
    topo = ufab
    parsed = load_fabric(str(fabric_file))
    assert isinstance(parsed, UsidTopology)
    ns = topo.netns_of("h0")
    before = state(ns)
    res = host_setup(topo, "h0", fabric_file, "--dry-run")
    assert res.returncode == 0 and res.stderr == "", res
    lines = res.stdout.splitlines()
    assert lines == hostroutes.ip_lines(hostroutes.plan(parsed, "gpu0"))
    # 2 planes: the leaf's locator, our own, one route per spine to the other host; 2 rules
    assert len(lines) == 2 * (2 + 2) + 2, lines
    assert sum(ln.startswith("ip -6 rule add ") for ln in lines) == 2
    gone = host_setup(topo, "h0", fabric_file, "--dry-run", "--remove", "--json")
    assert gone.returncode == 0, gone
    assert json.loads(gone.stdout)["commands"] == hostroutes.ip_lines(
        hostroutes.plan(parsed, "gpu0"), remove=True
    )
    assert state(ns) == before  # as root, and still nothing changed


def test_set_up_is_what_its_lines_say_idempotent_and_removable(
    ufab: Topology, fabric_file: Path
) -> None:
    """Applied (by netlink) it gives exactly the state its printed ip lines give; a second run
    changes nothing; --remove restores the host as it was, twice in a row too."""
    topo = ufab
    ns = topo.netns_of("h0")
    before = state(ns)
    lines = host_setup(topo, "h0", fabric_file, "--dry-run").stdout.splitlines()
    try:
        done = host_setup(topo, "h0", fabric_file)
        assert done.returncode == 0 and done.stderr == "", done
        assert "set up host gpu0 of fabric 'lab': 8 routes, 2 rules" in done.stdout, done
        applied = state(ns)
        assert applied != before
        assert any("encap seg6 mode encap.red segs 1" in ln for ln in applied), applied
        assert "ipproto udp sport 61000-63266 lookup 4100" in "\n".join(applied), applied
        assert "ipproto udp sport 63267-65533 lookup 4101" in "\n".join(applied), applied
        again = host_setup(topo, "h0", fabric_file)
        assert again.returncode == 0, again
        assert state(ns) == applied
        for _ in range(2):
            gone = host_setup(topo, "h0", fabric_file, "--remove")
            assert gone.returncode == 0 and gone.stderr == "", gone
            assert state(ns) == before
        for line in lines:  # the printed lines, run by ip itself
            ip(ns, *line.split()[1:])
        assert state(ns) == applied
    finally:
        host_setup(topo, "h0", fabric_file, "--remove")
    assert state(ns) == before


def test_the_set_up_refuses_in_one_line(ufab: Topology, fabric_file: Path) -> None:
    why_not = why_nobody_cannot_run_mrc()
    if why_not is not None:
        pytest.skip(why_not)
    topo = ufab
    ns = topo.netns_of("h0")
    cases = [
        (["--host", "gpu9"], 2, "--host gpu9: no such host in fabric 'lab' (gpu0, gpu1)"),
        (["--host", "gpu1"], 1, "host gpu1's plane-0 address fd00:0:1:1::2 is not configured"),
    ]
    for extra, code, said in cases:
        res = subprocess.run(
            ["ip", "netns", "exec", ns, str(BIN / "mrc-host-setup"), "--fabric", str(fabric_file)]
            + extra,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == code and res.stdout == "", res
        assert res.stderr.startswith(f"mrc-host-setup: error: {said}"), res
        assert res.stderr.count("\n") == 1, res
    nobody = subprocess.run(
        ["ip", "netns", "exec", ns, *NOBODY, str(BIN / "mrc-host-setup")]
        + ["--fabric", str(fabric_file), "--host", "gpu0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobody.returncode == 1 and nobody.stderr == (
        "mrc-host-setup: error: changing routes needs root (CAP_NET_ADMIN); --dry-run shows "
        "what it would do\n"
    ), nobody
    doc = usid_doc(topo)
    doc["hosts"][0]["nics"][1]["dev"] = "eth7"
    odd = fabric_file.with_name("odd.json")
    odd.write_text(json.dumps(doc))
    res = host_setup(topo, "h0", odd)
    assert res.returncode == 1 and res.stderr == (
        f"mrc-host-setup: error: host gpu0's plane-1 NIC eth7 (its 'dev' in {odd}) is not an "
        "interface here\n"
    ), res


def spine_rx(topo: Topology) -> dict[tuple[str, str], int]:
    """(spine, port) -> packets received, from the spines' kernels."""
    out = {}
    for lk in Fabric.status(topo.name)["links"]:
        if lk["kind"] == "leaf-spine":
            out[(lk["b"], lk["b_end"]["ifname"])] = lk["b_end"]["rx_packets"]
    return out


#: Per spine, netfilter counters of what arrives: a routing header in the packet, one inside
#: an IPv6-in-IPv6 packet, and a UDP datagram inside IPv6-in-IPv6 (what uSID routes carry).
COUNTERS = {
    "srh": ["-m", "rt"],
    "inner-srh": ["-m", "u32", "--u32", "3&0xFF=41 && 43&0xFF=43"],
    "encap-udp": ["-m", "u32", "--u32", "3&0xFF=41 && 43&0xFF=17"],
}


def count_on_spines(topo: Topology) -> None:
    for spine in (r for r in topo.routers if r.tier == "spine"):
        for name, match in COUNTERS.items():
            subprocess.run(
                ["ip", "netns", "exec", spine.netns, "ip6tables", "-t", "raw", "-A", "PREROUTING"]
                + match
                + ["-m", "comment", "--comment", name],
                check=True,
                capture_output=True,
                timeout=30,
            )


def spine_counts(topo: Topology) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for spine in (r for r in topo.routers if r.tier == "spine"):
        listing = subprocess.run(
            ["ip", "netns", "exec", spine.netns, "ip6tables", "-t", "raw", "-L", "PREROUTING"]
            + ["-v", "-x", "-n"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        got = {}
        for line in listing.splitlines()[2:]:
            cols = line.split()
            got[line.split("/* ")[1].split(" */")[0]] = int(cols[0])
        out[spine.name] = got
    return out


def srh_through(topo: Topology, spine: str, dst: str) -> None:
    """One UDP datagram from h0 with an SRH through ``spine``'s End SID (the namespace
    fabric's routers take both kinds): what the spine's routing-header counter must see."""
    plane = topo.router(spine).plane
    src = topo.host("h0").nic(plane).address
    with netns.entered(topo.netns_of("h0")):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    with sock:
        sock.bind((src, 0))
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, encode_srh([topo.router(spine).sid, dst]))
        sock.sendto(b"srh", (dst, 9))


def test_nobody_moves_data_over_every_spine_without_a_routing_header(
    ufab: Topology, fabric_file: Path, mrc_tools: MrcTools
) -> None:
    why_not = why_nobody_cannot_run_mrc()
    if why_not is not None:
        pytest.skip(why_not)
    topo = ufab
    parsed = load_fabric(str(fabric_file))
    assert isinstance(parsed, UsidTopology)
    # before the set-up: one line saying what to run, from a user who could not run it
    refused = as_nobody(
        mrc_tools,
        topo.netns_of("h0"),
        "mrc-send",
        "--fabric",
        str(fabric_file),
        "--to",
        f"gpu1:{PORT}",
        "--size",
        "1M",
    ).wait(60)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.describe()
    assert refused.stderr.startswith(
        "mrc-send: error: fabric 'lab': this host's uSID routes are not set up (its plane-0 "
        "micro-SID fcbb:bb00:c000:: is not decapsulated); "
    ), refused.describe()
    assert refused.stderr.endswith(
        f"run, once, as root: mrc-host-setup --fabric {fabric_file} --host gpu0\n"
    ), refused.describe()

    for host in ("h0", "h1"):
        done = host_setup(topo, host, fabric_file)
        assert done.returncode == 0, done
    count_on_spines(topo)
    right = topo.host("h1")
    for spine in (r for r in topo.routers if r.tier == "spine"):
        srh_through(topo, spine.name, right.nic(spine.plane).address)
    try:
        recv = as_nobody(
            mrc_tools,
            topo.netns_of("h1"),
            "mrc-recv",
            "--fabric",
            str(fabric_file),
            "--listen",
            f"[::]:{PORT}",
            "--discard",
            "--json",
            "--no-progress",
        )
        recv.wait_listening(PORT)
        before = spine_rx(topo)
        # one datagram per send: a GSO burst in IPv6-in-IPv6 crosses the veths and routers as
        # one skb, which their counters count once, and this test counts datagrams
        send = as_nobody(
            mrc_tools,
            topo.netns_of("h0"),
            "mrc-send",
            "--fabric",
            str(fabric_file),
            "--to",
            f"gpu1:{PORT}",
            "--size",
            "16M",
            "--burst",
            "1",
            "--json",
            "--no-progress",
        ).wait(120)
        got = recv.wait(60)
        after = spine_rx(topo)
        counts = spine_counts(topo)
    finally:
        for host in ("h0", "h1"):
            host_setup(topo, host, fabric_file, "--remove")

    assert send.returncode == 0, send.describe()
    assert got.returncode == 0, got.describe()
    s, r = send.json, got.json
    assert s["ok"] is True and r["ok"] is True
    assert s["bytes"] == r["bytes_placed"] == 16 << 20
    assert s["digest"] == s["digest_receiver"] == r["digest"] == r["digest_sender"]
    assert s["to"] == f"[{right.nics[0].address}]:{PORT}"

    # every EV's socket took a source port of its spine's block: that port chose the route
    names = {spine_name(r.plane, r.index): r for r in topo.routers if r.tier == "spine"}
    per_route: collections.Counter[str] = collections.Counter()
    for ev in s["evs"]:
        per_route[ev["route"]] += ev["packets"]
        lo, hi = parsed.layout.spine_ports[names[ev["route"]].index]
        assert lo <= ev["sport"] <= hi, ev
    assert sorted(per_route) == sorted(names), per_route
    assert sum(per_route.values()) == s["packets_sent"]

    for label, spine in names.items():
        data_in = after[(spine.name, "l0")] - before[(spine.name, "l0")]
        acks_in = after[(spine.name, "l1")] - before[(spine.name, "l1")]
        assert acks_in > 0, (label, "no ACKs came back through it: the receiver's ports")
        assert per_route[label] >= 0.1 * s["packets_sent"], (label, per_route)
        assert data_in >= 0.9 * per_route[label], (label, data_in, per_route)
        c = counts[spine.name]
        # the SRH datagram sent through each spine above, and not one more; nothing inside
        assert c["srh"] == 1 and c["inner-srh"] == 0, (spine.name, c)
        assert c["encap-udp"] >= 0.9 * per_route[label], (spine.name, c, per_route)
