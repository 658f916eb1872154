"""(a) up/down leaves no namespace, link, file or process behind; rate/MTU are applied."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from typing import NoReturn

import pytest
from fabric.fabric_helpers import (
    REPO,
    needs_netns,
    run_cli,
    running_fabric,
    udp_socket_in,
    unique_name,
)
from pyroute2 import IPRoute

from mrc.lab.fabric import Fabric, FabricError, FabricSpec, netns
from mrc.lab.fabric.kernel import NsHandle
from mrc.lab.fabric.pathsock import open_path_socket
from mrc.lab.fabric.shaping import tbf_params
from mrc.lab.fabric.usid_routes import SR_DEVICE
from mrc.srv6.paths import path_via
from mrc.topology.model import topology_path

pytestmark = [needs_netns, pytest.mark.netns]


def _ip_netns_list() -> list[str]:
    """``ip netns list`` when iproute2 is there (what a person would check), else /run/netns."""
    if shutil.which("ip"):
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]
    return netns.list_netns()


def _root_links() -> set[str]:
    with IPRoute() as ipr:
        return {link.get("ifname") for link in ipr.link("dump")}


def _ours(name: str) -> list[str]:
    return [ns for ns in _ip_netns_list() if ns.startswith(f"mrc-{name}-")]


def test_up_down_leaves_nothing_behind() -> None:
    name = unique_name("a")
    links_before = _root_links()
    spec = FabricSpec(name=name, planes=2, spines=2, leaves=2, hosts=4, rate="200mbit", mtu=9000)
    with running_fabric(spec) as topo:
        assert len(_ours(name)) == spec.namespace_count
        assert topology_path(name).exists()
        assert _root_links() == links_before  # every veth lives inside our namespaces
        # a process left inside a namespace must not survive (or keep the namespace alive)
        sleeper = subprocess.Popen(
            [sys.executable, "-m", "mrc.lab.cli.fabric", "exec", "--name", name, "h1", "--"]
            + ["sleep", "60"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.monotonic() + 5
        while not netns.pids_in(topo.netns_of("h1")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert netns.pids_in(topo.netns_of("h1")), "exec'd process did not enter the namespace"
        removed = Fabric.down(name)
        assert len(removed) == spec.namespace_count
        assert sleeper.wait(timeout=5) != 0  # killed by down
    assert _ours(name) == []
    assert not topology_path(name).exists()
    assert _root_links() == links_before
    assert Fabric.down(name) == []  # idempotent


def test_down_without_topology_file() -> None:
    """After a crash the file may be gone: down still finds everything by name."""
    name = unique_name("c")
    with running_fabric(FabricSpec(name=name, planes=1, hosts=2, leaves=1, spines=1)):
        topology_path(name).unlink()
        res = run_cli("down", "--name", name)
        assert res.returncode == 0, res.stderr
        assert "removed 4 namespaces" in res.stdout
        assert _ours(name) == []


def test_existing_fabric_is_refused() -> None:
    name = unique_name("e")
    spec = FabricSpec(name=name, planes=1, hosts=2, leaves=1, spines=1)
    with running_fabric(spec):
        with pytest.raises(FabricError, match="already exists"):
            Fabric.up(spec)
        assert len(_ours(name)) == spec.namespace_count  # the refusal broke nothing
        res = run_cli("up", "--name", name, "--planes", "1", "--hosts", "2")
        assert res.returncode == 1
        assert res.stderr.count("\n") == 1 and "already exists" in res.stderr


def test_rate_and_jumbo_mtu_applied() -> None:
    name = unique_name("j")
    spec = FabricSpec(name=name, planes=1, spines=2, leaves=2, hosts=2, rate="200mbit", mtu=9000)
    with running_fabric(spec) as topo:
        for node in topo.nodes():
            h = NsHandle(topo.netns_of(node))
            try:
                # sr0: the device a router's uSID routes hang on, which carries no packet
                links = [i for i in h.links() if i["ifname"] not in ("lo", SR_DEVICE)]
                ports = {i["ifname"]: i for i in links}
                assert ports and all(p["mtu"] == 9000 for p in ports.values())
                indexes = {i["index"] for i in links}
                qdiscs = [q for q in h.ipr.get_qdiscs() if q["index"] in indexes]
                kinds = {q.get("TCA_KIND") for q in qdiscs}
                assert kinds == {"tbf"}, (node, kinds)
                # a host's NIC queues 64 jumbo frames; router ports keep the shallow 10 ms
                host = node in {x.name for x in topo.hosts}
                want = tbf_params(200_000_000, 9000, host=host)[2]
                assert want == (64 * 9014 if host else 250_000)
                limits = {q.get("TCA_OPTIONS").get("TCA_TBF_PARMS")["limit"] for q in qdiscs}
                assert limits == {want}, (node, limits)
            finally:
                h.close()
        # a jumbo datagram crosses leaf -> spine -> leaf unfragmented
        path = path_via(topo, "h0", "h1", "p0s1")
        rx = udp_socket_in(topo.netns_of("h1"), path.dst_address, 7000)
        tx = open_path_socket(path)
        try:
            payload = os.urandom(8800)
            tx.sendto(payload, (path.dst_address, 7000))
            assert rx.recv(65535) == payload
        finally:
            rx.close()
            tx.close()


def test_failed_build_is_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure half way through ``up`` removes what was already built."""
    import mrc.lab.fabric.builder as builder

    def boom(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(builder, "configure_node", boom)
    name = unique_name("r")
    try:
        with pytest.raises(FabricError, match="injected failure"):
            Fabric.up(FabricSpec(name=name, planes=1, hosts=2, leaves=1, spines=1))
        assert _ours(name) == []
        assert not topology_path(name).exists()
    finally:
        Fabric.down(name)


@pytest.mark.slow
def test_tbf_shapes_to_rate() -> None:
    """A 1 s UDP flood through a 20mbit fabric arrives at about 20 Mbit/s, not more."""
    name = unique_name("s")
    rate = 20_000_000
    with running_fabric(
        FabricSpec(name=name, planes=1, spines=1, leaves=2, hosts=2, rate="20mbit")
    ) as topo:
        path = path_via(topo, "h0", "h1", "p0s0")
        rx = udp_socket_in(topo.netns_of("h1"), path.dst_address, 7100)
        rx.setblocking(False)
        tx = open_path_socket(path)
        payload = b"x" * 1200
        frame = len(payload) + 8 + 40 + 40 + 14  # UDP, IPv6, SRH (2 segments), Ethernet
        got = 0
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 1.0:
                for _ in range(20):
                    tx.sendto(payload, (path.dst_address, 7100))
                time.sleep(0.002)
                with contextlib.suppress(BlockingIOError):
                    while True:
                        rx.recv(2048)
                        got += 1
            time.sleep(0.05)
            with contextlib.suppress(BlockingIOError):
                while True:
                    rx.recv(2048)
                    got += 1
            elapsed = time.monotonic() - t0
        finally:
            tx.close()
            rx.close()
        wire_bps = got * frame * 8 / elapsed
        assert 0.5 * rate < wire_bps < 1.15 * rate, wire_bps
