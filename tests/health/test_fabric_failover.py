"""Failover on a real fabric: links go down in the middle of an mrc-send -> mrc-recv transfer.

Each test builds its own shaped fabric (4 planes x 2 spines, 200 Mbit/s per link, MTU 9000,
a unique name, always removed by a finalizer), sends a prepared file from h0 to h3 with
``--fabric`` and ``--ev-log`` on both ends, downs a link once the transfer is flowing, heals it
a second later and checks what happened: the data arrived intact (both ends' digests), the
EVs that cross the failed link went ASSUMED_BAD and came back GOOD (from the sender's event
log), and the link's own interface counters stopped while it was down and moved again after.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrc.topology.model import SRV6_MODES, Topology

pytestmark = pytest.mark.netns

BIN = Path(sys.executable).parent
_counter = itertools.count()
RATE = "200mbit"
SIZE = 320 << 20  # ~3.5 s at 800 Mbit/s: room for 1 s of outage and the recovery after it
OUTAGE = 1.0


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    if not (BIN / "mrc-fabric").exists():
        return f"mrc-fabric not installed next to {sys.executable}"
    return None


@pytest.fixture(params=SRV6_MODES)
def fabric(request: pytest.FixtureRequest) -> Iterator[Topology]:
    """A fresh fabric per test, with each kind of route (uSID containers, SRHs)."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from mrc.lab.fabric import Fabric, FabricSpec

    name = f"hf{os.getpid()}x{next(_counter)}"
    try:
        yield Fabric.up(FabricSpec(name=name, rate=RATE, mtu=9000, srv6=request.param))
    finally:
        Fabric.down(name)


@pytest.fixture(scope="module")
def payload_file() -> Iterator[Path]:
    path = Path(f"/dev/shm/mrc-health-{os.getpid()}.bin")
    with open(path, "wb") as fh:
        left = SIZE
        while left:
            n = min(left, 32 << 20)
            fh.write(os.urandom(n))
            left -= n
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _counters(topo: Topology, node: str, ifname: str) -> tuple[int, int]:
    """(tx_packets, rx_packets) of ``ifname`` in ``node``'s namespace."""
    out = subprocess.run(
        ["ip", "-n", topo.netns_of(node), "-s", "-j", "link", "show", "dev", ifname],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    st = json.loads(out)[0]["stats64"]
    return int(st["tx"]["packets"]), int(st["rx"]["packets"])


def _exec(topo: Topology, node: str, *cmd: str) -> list[str]:
    return [str(BIN / "mrc-fabric"), "exec", "--name", topo.name, node, "--", *cmd]


class Transfer:
    """mrc-recv in h3 and mrc-send in h0, both with --json and --ev-log."""

    def __init__(self, topo: Topology, tmp: Path, src: Path) -> None:
        self.topo = topo
        self.rlog = tmp / "recv.jsonl"
        self.slog = tmp / "send.jsonl"
        self.recv = subprocess.Popen(
            _exec(
                topo,
                "h3",
                str(BIN / "mrc-recv"),
                "--fabric",
                topo.name,
                "--discard",
                "--json",
                "--no-progress",
                "--ev-log",
                str(self.rlog),
                "--timeout",
                "30",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._wait_listening()
        self.send = subprocess.Popen(
            _exec(
                topo,
                "h0",
                str(BIN / "mrc-send"),
                str(src),
                "--fabric",
                topo.name,
                "--to",
                "h3",
                "--payload",
                "8192",
                "--window",
                "64",
                "--json",
                "--no-progress",
                "--ev-log",
                str(self.slog),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.recv.poll() is not None:
                pytest.fail(f"mrc-recv exited: {self.recv.communicate()}")
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{self.recv.pid}/net/tcp6").read_text()
                if any(
                    cols[1].endswith(":12B7") and cols[3] == "0A"  # port 4791, LISTEN
                    for cols in (line.split() for line in text.splitlines()[1:])
                ):
                    return
            time.sleep(0.02)
        pytest.fail("mrc-recv did not start listening")

    def finish(self, timeout: float = 40) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            s_out, s_err = self.send.communicate(timeout=timeout)
            r_out, r_err = self.recv.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("transfer did not finish")
        assert self.send.returncode == 0, s_err[-2000:]
        assert self.recv.returncode == 0, r_err[-2000:]
        return json.loads(s_out.strip().splitlines()[-1]), json.loads(
            r_out.strip().splitlines()[-1]
        )

    def kill(self) -> None:
        for p in (self.send, self.recv):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 9)

    def events(self, which: str = "send") -> list[dict[str, Any]]:
        path = self.slog if which == "send" else self.rlog
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_flowing(
    topo: Topology, node: str, ifname: str, packets: int, timeout: float = 15
) -> None:
    start = _counters(topo, node, ifname)[0]
    deadline = time.monotonic() + timeout
    while _counters(topo, node, ifname)[0] - start < packets:
        if time.monotonic() > deadline:
            pytest.fail(f"no traffic through {node}:{ifname}")
        time.sleep(0.02)


def test_spine_link_down_and_up_mid_transfer(
    fabric: Topology, payload_file: Path, tmp_path: Path
) -> None:
    from mrc.lab.fabric import Fabric

    topo = fabric
    a, b = "p1l1", "p1s0"  # plain routing's spine in plane 1; MRC sprays over p1s1 as well
    link = topo.link_between(a, b)
    spine_if = link.end(b)[0]  # p1s0's port towards p1l1: data h0 -> h3 leaves through it
    t = Transfer(topo, tmp_path, payload_file)
    try:
        _wait_flowing(topo, b, spine_if, 500)
        before = _counters(topo, b, spine_if)
        t_down = time.time()
        Fabric.link(topo, a, b, up=False)
        time.sleep(0.1)  # what was queued behind the link is gone by now
        frozen0 = _counters(topo, b, spine_if)
        time.sleep(OUTAGE - 0.1)
        frozen1 = _counters(topo, b, spine_if)
        Fabric.link(topo, a, b, up=True)
        t_up = time.time()
        time.sleep(0.5)
        after = _counters(topo, b, spine_if)
        sres, rres = t.finish()
    finally:
        t.kill()
    assert sres["ok"] and rres["ok"]
    assert sres["digest"] == sres["digest_receiver"] == rres["digest"]
    # the link carried the transfer (_wait_flowing saw 500 packets through it), went silent
    # while down, and carried it again after. Not "frozen0 > before": the few milliseconds
    # between that reading and the link going down may carry nothing (one CI run, 526 = 526)
    assert frozen0[0] >= before[0]
    assert frozen1 == frozen0, "counters moved while the link was down"
    assert after[0] - frozen1[0] > 200, (frozen1, after)
    # the EVs routed through p1s0 in plane 1 went ASSUMED_BAD after the failure and GOOD again
    # after the heal; nobody else was blamed for long
    events = t.events("send")
    on_link = [e for e in events if e["route"] == b and e["plane"] == 1]
    bad = {e["ev"] for e in on_link if e["to"] == "ASSUMED_BAD" and t_down <= e["t"] < t_up}
    assert bad, "no EV through the failed link was retired"
    first_bad = min(e["t"] for e in on_link if e["to"] == "ASSUMED_BAD" and e["t"] >= t_down)
    assert first_bad - t_down < 0.2, first_bad - t_down
    back: dict[int, float] = {}  # EV -> its first resurrection after the heal
    for e in on_link:
        if e["from"] == "ASSUMED_BAD" and e["to"].startswith("GOOD") and e["t"] >= t_up:
            back.setdefault(e["ev"], e["t"])
    assert set(back) >= bad, f"not resurrected: {sorted(bad - set(back))}"
    assert max(back.values()) - t_up < 1.0, max(back.values()) - t_up
    # while down, no EV through the failed link was resurrected
    assert not [
        e for e in on_link if e["from"] == "ASSUMED_BAD" and t_down + 0.05 < e["t"] < t_up - 0.05
    ]
    assert sres["evs_resurrected"] >= len(bad)
    # (no plane should be declared down for one spine link: checked deterministically in
    # test_state_machine.py; here the two Python processes share two noisy cores with the
    # forwarding, and a long enough scheduling hiccup can still look like a dead plane)


def test_host_nic_link_down_and_up_mid_transfer(
    fabric: Topology, payload_file: Path, tmp_path: Path
) -> None:
    from mrc.lab.fabric import Fabric

    topo = fabric
    a, b = "h0", "p1l0"  # the sender's NIC in plane 1: the whole plane, both directions
    nic = topo.link_between(a, b).end(a)[0]
    t = Transfer(topo, tmp_path, payload_file)
    try:
        _wait_flowing(topo, a, nic, 500)
        t_down = time.time()
        Fabric.link(topo, a, b, up=False)
        time.sleep(OUTAGE)
        Fabric.link(topo, a, b, up=True)
        t_up = time.time()
        sres, rres = t.finish()
    finally:
        t.kill()
    assert sres["ok"] and rres["ok"]
    assert sres["digest"] == sres["digest_receiver"] == rres["digest"]
    events = t.events("send")
    plane1 = [e for e in events if e["plane"] == 1]
    assert any(e["to"] == "ASSUMED_BAD" and t_down <= e["t"] < t_up for e in plane1)
    assert sres["planes_lost"] >= 1  # send errors and losses took the plane down
    # every plane-1 EV is usable again at the end (GOOD or GOOD (backup))
    states = {e["ev"]: e["state"] for e in sres["evs"] if e["plane"] == 1}
    assert all(s.startswith("GOOD") for s in states.values()), states
