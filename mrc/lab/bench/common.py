"""What the coordinator and the agents of ``mrc-bench`` share: names, the data scheme, helpers.

Data scheme (integrity): every agent holds a *pool* of pseudo-random bytes seeded by
(run seed, host index). The bytes host ``s`` sends to host ``d`` in step ``k`` are the slice
``pool_s[offset(k, d) : offset(k, d) + size]``, so consecutive steps (and different peers) carry
different data, and a receiver that kept the previous step's bytes would fail verification.
After every step the sender hashes what it sent and the receiver hashes what landed in its
inbox slot for that sender (SHA-256); the coordinator compares the two over the control pipes.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import subprocess
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from mrc.errors import MRCError
from mrc.wire import DEFAULT_PORT

if TYPE_CHECKING:
    from mrc.topology.model import Topology


class PlaneNicLike(Protocol):
    """A host's NIC in one plane (``HostNic`` of a topology, or a launched rank's own)."""

    @property
    def plane(self) -> int: ...
    @property
    def nic(self) -> str: ...
    @property
    def address(self) -> str: ...


TRANSPORTS = ("mrc", "tcp", "mptcp")
WORKLOADS = ("alltoall", "ring", "incast", "pair")
CONDITIONS = ("clean", "link_down", "lossy", "trim", "no_trim")

MRC_PORT = DEFAULT_PORT
TCP_PORT = 5201
MPTCP_PORT = 5202

# Linux MPTCP, which Python's socket module does not name (linux/in.h, linux/mptcp.h)
IPPROTO_MPTCP = 262
SOL_MPTCP = 284
MPTCP_INFO = 1

ALIGN = 4096
ROTATIONS = 64  # distinct offsets a sender's slices rotate through
IMM_MASK = 0xFFFFFFFF


def pool_length(max_size: int) -> int:
    return max_size + ROTATIONS * ALIGN


def make_pool(seed: int, host: int, max_size: int) -> bytes:
    """The deterministic bytes host ``host`` sends from (``random.Random`` is seedable and
    fast: ~1 GB/s)."""
    return random.Random(f"mrc-bench/{seed}/{host}").randbytes(pool_length(max_size))


def send_offset(step: int, dst: int) -> int:
    """Where in the sender's pool the data of ``step`` for ``dst`` starts."""
    return ((step * 37 + dst * 11) % ROTATIONS) * ALIGN


def sha256(view: memoryview | bytes) -> str:
    return hashlib.sha256(view).hexdigest()


def now() -> float:
    """CLOCK_MONOTONIC: one clock for every namespace on the machine (network namespaces do
    not virtualise time), so completion times of agents compare directly."""
    return time.monotonic()


def dumps(obj: object) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def mptcp_subflows(sock: socket.socket) -> int | None:
    """Extra subflows of an MPTCP socket (``mptcpi_subflows``), None if the kernel won't say."""
    try:
        info = sock.getsockopt(SOL_MPTCP, MPTCP_INFO, 64)
    except OSError:
        return None
    return info[0] if info else None


def mptcp_setup_commands(
    nics: Iterable[PlaneNicLike], announce: bool = True, flush: bool = True
) -> list[list[str]]:
    """``ip mptcp`` commands for a host with plane NICs ``nics``: the in-kernel path manager
    accepts up to 8 subflows and, with ``announce``, announces the host's other planes'
    addresses (ADD_ADDR).

    A peer then opens one subflow per announced address from its own address in that plane (the
    kernel picks the source by route), so every plane gets a subflow. Client-side 'subflow'
    endpoints would pair plane-p sources with the peer's plane-0 address, which no plane but 0
    can route. ``flush=False`` keeps the endpoints already there (a real host's own)."""
    cmds = [["ip", "mptcp", "endpoint", "flush"]] if flush else []
    cmds += [["ip", "mptcp", "limits", "set", "subflow", "8", "add_addr_accepted", "8"]]
    if announce:
        cmds += [
            ["ip", "mptcp", "endpoint", "add", nic.address, "dev", nic.nic, "signal"]
            for nic in nics
            if nic.plane != 0 and nic.nic
        ]
    return cmds


def setup_mptcp_outside(topo: Topology, node: str, announce: bool = True) -> None:
    """Run :func:`mptcp_setup_commands` for host ``node`` from this process, as root, with
    ``ip -n NETNS``: a host container's user may not configure MPTCP itself."""
    ns = topo.netns_of(node)
    for cmd in mptcp_setup_commands(topo.host(node).nics, announce):
        done = subprocess.run(["ip", "-n", ns, *cmd[1:]], capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise MRCError(f"mptcp set-up in {node} ({' '.join(cmd)}) failed: {why}")
