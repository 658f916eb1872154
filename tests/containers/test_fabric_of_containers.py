"""``mrc-fabric up --host-image``: fabric hosts are real containers on the namespace fabric.

A 2-plane, 2-spine fabric shaped to 200 Mbit/s whose two hosts are containers of the image
built from this tree. mrc-recv and mrc-send run inside them (``mrc-fabric exec`` becomes
``ENGINE exec``, as the image's unprivileged user), spray over all four SRv6 paths, and a spine
link goes down and comes back in the middle of the transfer. Data is verified by BLAKE3 on
both ends; teardown must leave no container and no namespace behind.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
from fabric.fabric_helpers import unique_name

from mrc.lab.fabric.containers import labelled, share_dir
from mrc.topology.model import topology_path

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
SIZE = 96 << 20  # about 2 s at 2 x 200 Mbit/s: room for a 0.5 s outage in the middle


def _exec(fabric: str, node: str, *cmd: str) -> list[str]:
    return [str(BIN / "mrc-fabric"), "exec", "--name", fabric, node, "--", *cmd]


def _tx_packets(ns: str, ifname: str) -> int:
    out = subprocess.run(
        ["ip", "-n", ns, "-s", "-j", "link", "show", "dev", ifname],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["packets"])


def test_transfer_and_link_failure_between_host_containers(mrc_image: str) -> None:
    from mrc.lab.fabric import Fabric, FabricSpec
    from mrc.lab.fabric.teardown import fabric_namespaces

    name = unique_name("ct")
    spec = FabricSpec(
        name=name,
        planes=2,
        spines=2,
        leaves=1,
        hosts=2,
        rate="200mbit",
        mtu=9000,
        host_image=mrc_image,
    )
    topo = Fabric.up(spec)
    engine = topo.engine
    try:
        assert all(h.container for h in topo.hosts)
        # the directory the containers share with the host, read-write, at the same path
        assert topo.share_dir == str(share_dir(name))
        assert stat.S_IMODE(os.stat(topo.share_dir).st_mode) == 0o1777
        schema = json.loads((ROOT / "docs/schemas/mrc-fabric-topology.schema.json").read_text())
        jsonschema.validate(json.loads(topology_path(name).read_text()), schema)
        assert len(labelled(engine, name)) == 2
        who = subprocess.run(
            _exec(name, "h0", "id", "-un"), capture_output=True, text=True, check=True
        )
        assert who.stdout.strip() == "mrc"  # the image's user, not root
        mark = Path(topo.share_dir) / "from-h0"
        subprocess.run(_exec(name, "h0", "touch", str(mark)), check=True, capture_output=True)
        assert mark.stat().st_uid != 0  # made inside, by the image's user, seen outside

        recv = subprocess.Popen(
            _exec(name, "h1", str(BIN / "mrc-recv"), "--fabric", name, "--discard", "--json")
            + ["--no-progress", "--timeout", "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        send = subprocess.Popen(
            _exec(name, "h0", str(BIN / "mrc-send"), "--size", str(SIZE), "--fabric", name)
            + ["--to", "h1", "--payload", "8192", "--window", "64", "--wait", "20"]
            + ["--json", "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # down p1s0's link towards the leaf once data flows through it, heal it 0.5 s later
        spine = topo.router("p1s0")
        port = topo.link_between("p1l0", "p1s0").end("p1s0")[0]
        start = _tx_packets(spine.netns, port)
        deadline = time.monotonic() + 30
        while _tx_packets(spine.netns, port) - start < 300:
            assert send.poll() is None, send.communicate()
            assert time.monotonic() < deadline, "no data through p1s0"
            time.sleep(0.02)
        Fabric.link(topo, "p1l0", "p1s0", up=False)
        time.sleep(0.5)  # the outage itself: a duration, not a synchronisation
        Fabric.link(topo, "p1l0", "p1s0", up=True)

        s_out, s_err = send.communicate(timeout=60)
        r_out, r_err = recv.communicate(timeout=30)
        assert send.returncode == 0, s_err[-2000:]
        assert recv.returncode == 0, r_err[-2000:]
        sent = json.loads(s_out.strip().splitlines()[-1])
        got = json.loads(r_out.strip().splitlines()[-1])
        assert sent["ok"] and got["ok"]
        assert sent["bytes"] == got["bytes"] == SIZE
        assert sent["digest"] == sent["digest_receiver"] == got["digest"]
        routes = {ev["route"] for ev in sent["evs"] if ev["packets"] > 0}
        assert routes == {"p0s0", "p0s1", "p1s0", "p1s1"}
        assert sent["evs_assumed_bad"] >= 1  # the EVs through the failed link were retired
    finally:
        Fabric.down(name)
    assert labelled(engine, name) == []
    assert fabric_namespaces(name) == []
    assert not share_dir(name).exists()


def test_mrc_bench_between_host_containers(mrc_image: str) -> None:
    """mrc-bench's agents run inside the host containers (MPTCP set up from outside, since the
    image's user may not); every step's data is verified by the agents."""
    res = subprocess.run(
        [str(BIN / "mrc-bench"), "--quick", "--host-image", mrc_image, "--conditions", "clean"]
        + ["--workloads", "pair", "--transports", "mrc,mptcp", "--steps", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    schema = json.loads((ROOT / "docs/schemas/mrc-bench.schema.json").read_text())
    jsonschema.validate(out, schema)
    assert out["config"]["host_image"] == mrc_image
    runs = {(r["transport"], r["workload"]): r for r in out["results"]}
    assert set(runs) == {("mrc", "pair"), ("mptcp", "pair")}
    for r in runs.values():
        assert r["failed_steps"] == 0 and r["sha256_ok"], r
        assert r["bytes_verified"] == r["bytes_expected"] > 0
