"""Shared fixtures: two hosts in namespaces, and running mrc-send / mrc-recv as processes."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mrc.lab.testbed import TwoHosts, leftover_namespaces, netns_available

# where mrc-send / mrc-recv live: the venv running the tests, unless MRC_BIN_DIR says otherwise
BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)
_ns_counter = itertools.count()
_netns_reason: list[str | None] = []


def netns_skip_reason() -> str | None:
    """Why namespaces cannot be used here (None if they can); probed once per session."""
    if not _netns_reason:
        _netns_reason.append(netns_available())
    return _netns_reason[0]


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    """Hosts A and B joined by two veth links (planes): A=fd00:<p+1>::1, B=fd00:<p+1>::2."""
    yield from _two_hosts(9000)


@pytest.fixture
def two_hosts_1500() -> Iterator[TwoHosts]:
    """As two_hosts, with Ethernet's usual MTU of 1500 on both links."""
    yield from _two_hosts(1500)


def _two_hosts(mtu: int) -> Iterator[TwoHosts]:
    reason = netns_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    prefix = f"mrct{os.getpid()}-{next(_ns_counter)}"
    hosts = TwoHosts(prefix, links=2, mtu=mtu)
    try:
        hosts.create()
        _pin_neighbours(hosts)
        yield hosts
    finally:
        hosts.destroy()
        assert leftover_namespaces(prefix + "-") == [], "namespaces leaked"


def _mac(ns: str, ifname: str) -> str:
    res = subprocess.run(
        ["ip", "-n", ns, "-j", "link", "show", "dev", ifname],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(json.loads(res.stdout)[0]["address"])


def _pin_neighbours(hosts: TwoHosts) -> None:
    """Static neighbour entries on every link. The first packets towards an unresolved
    neighbour wait in a small queue (unres_qlen_bytes) while neighbour discovery runs, and a
    burst overflows it: real loss on the first round trip of a plane, which the EV health
    logic rightly holds against that plane. Tests measure steady state, so skip discovery."""
    for plane in range(hosts.links):
        ia, ib = hosts.link_names(plane)
        for ns, dev, addr, peer_ns, peer_dev in (
            (hosts.a, ia, hosts.b_addrs[plane], hosts.b, ib),
            (hosts.b, ib, hosts.a_addrs[plane], hosts.a, ia),
        ):
            subprocess.run(
                [
                    "ip",
                    "-n",
                    ns,
                    "neigh",
                    "replace",
                    addr,
                    "lladdr",
                    _mac(peer_ns, peer_dev),
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ],
                check=True,
                capture_output=True,
            )


def free_port(host: str = "::1") -> int:
    """A port nothing listens on right now, for both TCP and UDP on ``host``."""
    for _ in range(50):
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as t:
            t.bind((host, 0))
            port: int = t.getsockname()[1]
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as u:
                u.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port found")


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    objects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def json(self) -> dict[str, Any]:
        """The one JSON object printed with --json."""
        assert len(self.objects) == 1, f"expected one JSON object, got {self.stdout!r}"
        return self.objects[0]

    def describe(self) -> str:
        return (
            f"{' '.join(self.argv)} -> {self.returncode}\n"
            f"stdout: {self.stdout[:2000]}\nstderr: {self.stderr[-2000:]}"
        )


def _parse_objects(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


class Running:
    """A started mrc-send / mrc-recv."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.result: Result | None = None

    def wait(self, timeout: float = 60.0) -> Result:
        """Wait for exit (killing it after ``timeout`` and failing the test)."""
        if self.result is not None:
            return self.result
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"{' '.join(self.argv)} did not finish in {timeout} s; stderr: {err}")
        self.result = Result(self.argv, self.proc.returncode, out, err, _parse_objects(out))
        return self.result

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def sockets(self) -> int:
        """How many sockets the process holds open right now."""
        n = 0
        fd_dir = Path(f"/proc/{self.proc.pid}/fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:
            return 0
        for name in names:
            with contextlib.suppress(OSError):
                n += os.readlink(fd_dir / name).startswith("socket:")
        return n

    def wait_sockets(self, at_least: int, timeout: float = 10.0) -> None:
        """Wait until the process holds ``at_least`` sockets (e.g. its EV sockets, which
        exist once a connection is set up)."""
        deadline = time.monotonic() + timeout
        while self.sockets() < at_least:
            if self.proc.poll() is not None:
                pytest.fail(f"exited early: {self.wait().describe()}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"{' '.join(self.argv)}: {self.sockets()} sockets, not {at_least}")
            time.sleep(0.01)

    def wait_listening(self, port: int, timeout: float = 10.0) -> None:
        """Wait until the process has a TCP socket listening on ``port`` (see
        :func:`wait_listening`)."""
        if not wait_listening(self.proc, port, timeout):
            if self.proc.poll() is not None:
                pytest.fail(f"exited before listening: {self.wait().describe()}")
            self.kill()
            pytest.fail(f"{' '.join(self.argv)} not listening on port {port} after {timeout} s")


def wait_listening(proc: subprocess.Popen[Any], port: int, timeout: float = 10.0) -> bool:
    """Wait until ``proc`` has a TCP socket listening on ``port`` (in its namespace:
    /proc/PID/net shows the namespace of the process); False if it exited or the time ran
    out. mrc-recv opens its UDP sockets before the TCP side channel, so this means it is
    ready."""
    deadline = time.monotonic() + timeout
    want = f":{port:04X} "
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        for name in ("tcp6", "tcp"):
            try:
                lines = Path(f"/proc/{proc.pid}/net/{name}").read_text().splitlines()
            except OSError:
                continue
            for line in lines[1:]:
                cols = line.split()
                if len(cols) > 3 and (cols[1] + " ").endswith(want) and cols[3] == "0A":
                    return True
        time.sleep(0.01)
    return False


class MrcTools:
    """Runs mrc-send / mrc-recv (optionally inside a namespace) and cleans up after the test."""

    def __init__(self) -> None:
        self.started: list[Running] = []

    def argv(self, tool: str, args: list[str], ns: str | None = None) -> list[str]:
        cmd = [str(BIN / tool), *args]
        return ["ip", "netns", "exec", ns, *cmd] if ns else cmd

    def start(self, tool: str, *args: str, ns: str | None = None) -> Running:
        r = Running(self.argv(tool, list(args), ns))
        self.started.append(r)
        return r

    def run(self, tool: str, *args: str, ns: str | None = None, timeout: float = 60.0) -> Result:
        return self.start(tool, *args, ns=ns).wait(timeout)

    def close(self) -> None:
        for r in self.started:
            r.kill()
            if r.result is None:
                r.proc.communicate()


@pytest.fixture
def mrc_tools() -> Iterator[MrcTools]:
    tools = MrcTools()
    try:
        yield tools
    finally:
        tools.close()


@pytest.fixture
def mrc_port() -> int:
    """A free TCP+UDP port on ::1."""
    return free_port()


@pytest.fixture(params=["native", "python"])
def rx_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once with each set of receive kernels (mrc.core.fastpath: place_train,
    note_arrivals and note_runs; mrc.transport.rxbatch: recv_batch): the C ones, which are
    skipped only where mrc._native was not built, and their pure-Python twins."""
    from mrc.core import fastpath
    from mrc.transport import rxbatch

    if request.param == "native":
        if (
            fastpath.native_place_train is None
            or fastpath.native_note_arrivals is None
            or fastpath.native_note_runs is None
            or rxbatch.native_recv_batch is None
        ):
            pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
        monkeypatch.setattr(fastpath, "place_train", fastpath.native_place_train)
        monkeypatch.setattr(fastpath, "note_arrivals", fastpath.native_note_arrivals)
        monkeypatch.setattr(fastpath, "note_runs", fastpath.native_note_runs)
        monkeypatch.setattr(rxbatch, "recv_batch", rxbatch.native_recv_batch)
    else:
        monkeypatch.setattr(fastpath, "place_train", fastpath.py_place_train)
        monkeypatch.setattr(fastpath, "note_arrivals", fastpath.py_note_arrivals)
        monkeypatch.setattr(fastpath, "note_runs", fastpath.py_note_runs)
        monkeypatch.setattr(rxbatch, "recv_batch", rxbatch.py_recv_batch)
    return str(request.param)
