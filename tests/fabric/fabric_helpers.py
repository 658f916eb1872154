"""Helpers shared by the fabric tests: privilege check, unique names, guaranteed teardown.

A module with a unique name (not conftest) so tests can import it without clashing with
other test directories' conftest modules.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mrc.lab.fabric import Fabric, FabricSpec, Topology, netns

if TYPE_CHECKING:  # for annotations only: `conftest` at run time is whichever pytest loaded last
    from conftest import MrcTools, Running

REPO = Path(__file__).resolve().parents[2]
_counter = itertools.count()


def _netns_unavailable() -> str | None:
    """Why network-namespace tests cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    probe = f"mrcprobe-{os.getpid()}"
    try:
        netns.create(probe)
    except OSError as e:
        return f"cannot create a network namespace here: {e}"
    netns.remove(probe)
    return None


SKIP_REASON = _netns_unavailable()

_TEST_FABRIC = re.compile(r"^t(\d+)[a-z]\d+$")


def sweep_stale_test_fabrics() -> list[str]:
    """Remove fabrics left by earlier test runs whose process died (e.g. SIGKILL), so a crashed
    run never poisons the next one.  Only names of the form t<pid><tag><n> whose pid is gone."""
    swept = []
    for name in Fabric.list():
        m = _TEST_FABRIC.match(name)
        if m and int(m.group(1)) != os.getpid() and not os.path.exists(f"/proc/{m.group(1)}"):
            Fabric.down(name)
            swept.append(name)
    return swept


if SKIP_REASON is None:
    sweep_stale_test_fabrics()
needs_netns = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def unique_name(tag: str = "") -> str:
    """A fabric name unique to this test process: t<pid><tag><n>."""
    return f"t{os.getpid()}{tag}{next(_counter)}"


@contextlib.contextmanager
def running_fabric(spec: FabricSpec) -> Iterator[Topology]:
    """Bring ``spec`` up and ALWAYS take it down again, whatever happens in the body."""
    try:
        yield Fabric.up(spec)
    finally:
        Fabric.down(spec.name)


def run_cli(*args: str, check: bool = False, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``mrc-fabric`` from this checkout (no install needed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MRC_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "mrc.lab.cli.fabric", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=check,
        timeout=60,
        **kw,
    )


def udp_socket_in(ns: str, address: str, port: int = 0, timeout: float = 2.0) -> socket.socket:
    with netns.entered(ns):
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind((address, port))
    s.settimeout(timeout)
    return s


def drain(sock: socket.socket, expect: int, timeout: float = 3.0) -> list[bytes]:
    """Receive until ``expect`` datagrams or ``timeout`` of silence."""
    got: list[bytes] = []
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        try:
            got.append(sock.recv(65535))
        except TimeoutError:
            break
    return got


def start_fabric_recv(mrc_tools: MrcTools, topo: Topology, host: str, port: int) -> Running:
    """mrc-recv --fabric in ``host``'s namespace (discarding, JSON, no progress), once it
    listens on ``port``; ``mrc_tools`` is the fixture of tests/conftest.py."""
    recv = mrc_tools.start(
        "mrc-recv",
        "--fabric",
        topo.name,
        "--listen",
        f"[::]:{port}",
        "--discard",
        "--json",
        "--no-progress",
        ns=topo.netns_of(host),
    )
    recv.wait_listening(port)
    return recv
