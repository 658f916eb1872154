"""Where a benchmark's children run: the argv for a fabric host, mrc's commands, listeners.

The fabric's modules (and pyroute2 under them) load only when a fabric is used: the two-host
demo and bench_qp wait for listeners with this module too."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mrc.errors import MRCError
from mrc.lab.harness.children import Child
from mrc.topology import Topology

TCP_LISTEN = "0A"  # the state column of /proc/net/tcp6 for a listening socket


def in_host(topo: Topology, node: str, cmd: list[str]) -> list[str]:
    """The argv that runs ``cmd`` in fabric node ``node``: in its container (``ENGINE exec``,
    whose image must have the program) or in its bare namespace (``ip netns exec``)."""
    host = next((h for h in topo.hosts if h.name == node), None)
    if host is not None and host.container:
        from mrc.lab.fabric.containers import exec_argv

        return exec_argv(topo.engine, host.container, cmd, interactive=False)
    return ["ip", "netns", "exec", topo.netns_of(node), *cmd]


def tool_path(name: str) -> str:
    """One of mrc's commands (mrc-send, mrc-recv, ...): the one installed next to this Python,
    so a benchmark measures the code it runs with, else the first on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise MRCError(
            f"{name} not found next to {sys.executable} or on PATH (pip install -e . in the venv)"
        )
    return found


def _in_netns(pid: int, netns: str) -> bool:
    """Whether process ``pid`` has entered namespace ``netns`` (``ip netns exec`` moves there
    only after it started)."""
    from mrc.lab.fabric.netns import netns_path

    try:
        mine, theirs = os.stat(f"/proc/{pid}/ns/net"), os.stat(netns_path(netns))
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def _listens(pid: int, port: int) -> bool:
    """Whether a TCP socket listens on ``port`` in the network namespace of process ``pid``."""
    want = f":{port:04X}"
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/tcp6").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[1].endswith(want) and cols[3] == TCP_LISTEN:
                return True
    return False


def wait_listening(child: Child, port: int, netns: str | None, timeout: float) -> None:
    """Return once ``child`` (in namespace ``netns``, if given) listens on TCP ``port``, or has
    exited (its caller reports why); MRCError if neither happens within ``timeout`` seconds.

    Read from /proc, not with a tool run in the namespace: no process per poll."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.running:
            return
        if (netns is None or _in_netns(child.pid, netns)) and _listens(child.pid, port):
            return
        time.sleep(0.01)
    raise MRCError(f"{child.label} did not listen on port {port} within {timeout:g} s")


def library_env(library: str | None) -> dict[str, str] | None:
    """The environment that makes mrc's commands (and anything else in Python) import mrc from
    ``library``, another checkout of it (its directory holds ``mrc/``), before the installed
    one: a before/after benchmark runs the same tool on two versions. None: the environment
    as it is."""
    if library is None:
        return None
    rest = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (library, rest) if p)}


def imported_mrc(env: dict[str, str] | None) -> str:
    """The directory of the ``mrc`` package a Python started with ``env`` imports (what a
    benchmark's children run), as that Python says: with ``-P`` and from ``/``, so that, as
    for mrc's commands, the working directory is not on its path."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", "import mrc, os; print(os.path.dirname(mrc.__file__))"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise MRCError(f"python cannot import mrc with that PYTHONPATH: {why}")
    return done.stdout.strip()
