"""Set-up decisions, sans-IO: messages in, decisions out.

What a hello, a welcome or a join means is decided here, from values (the parsed message, the
address it came from, the configuration), never from sockets or the event loop, so every
decision a hostile peer can steer is tested without a network (tests/connection/
test_handshake.py), as the core's are. :mod:`mrc.connection.listener` and
:mod:`mrc.connection.dial` are the asyncio glue: they read messages, call these, and open or
close what the decisions say.

The messages themselves are parsed field by field in :mod:`mrc.transport.messages`; the
listener's bounds (set-ups, connections, bytes granted) are counted by
:class:`mrc.transport.limits.Ledger`; this module joins the two into what a set-up builds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from mrc.connection.config import ConnectConfig, RegionMemory
from mrc.core.config import QPConfig
from mrc.core.memory import MemoryRegion
from mrc.errors import MRCError
from mrc.evlayout import backup_count
from mrc.security.packet import Mode
from mrc.srv6.evroutes import EVRoute, fabric_routes, plain_routes
from mrc.transport import auth
from mrc.transport.messages import (
    Hello,
    Join,
    Refusal,
    RegionRequest,
    RemoteRegion,
    Welcome,
    parse_reply,
)
from mrc.transport.sockets import family_of

if TYPE_CHECKING:
    from mrc.topology.model import Topology

Pair = tuple[str, str]  # (our address, the peer's) on one plane


def any_address(host: str) -> str:
    """The wildcard address of ``host``'s family."""
    return "0.0.0.0" if family_of(host) == socket.AF_INET else "::"


def plane_pairs(local: Sequence[str], remote: Sequence[str]) -> list[Pair]:
    """Plane p pairs our p-th address with the peer's p-th; planes only one side has are
    left out."""
    n = min(len(local), len(remote))
    return [(local[i], remote[i]) for i in range(n)]


def routes_for(pairs: list[Pair], fabric: Topology | None) -> list[list[EVRoute]]:
    """Every plane's routes: over the fabric's SRv6 paths, or the plain one per plane."""
    return fabric_routes(fabric, pairs) if fabric is not None else plain_routes(pairs)


def route_ids(labels: list[str]) -> list[int]:
    """A small integer per distinct route label (the core only compares them)."""
    ids: dict[str, int] = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def describe_region(region: MemoryRegion) -> RemoteRegion:
    """``region`` as a peer is told about it."""
    return RemoteRegion(region.name, region.rkey, region.addr, region.length)


@dataclass(frozen=True)
class Plan:
    """What a set-up builds once the peer's messages are checked: the queue pair's settings,
    the planes paired, and the EV sockets to open (``total``: ``active`` plus backups, over
    ``routes``)."""

    qp: QPConfig
    pairs: list[Pair]
    active: int
    total: int
    routes: list[list[EVRoute]]


# ---- the listening side ---------------------------------------------------------------------


def plan_accept(
    hello: Hello,
    peer_host: str,
    plane_addrs: Sequence[str],
    evs: int,
    qp: QPConfig | None,
    fabric: Topology | None,
) -> Plan:
    """What the listener builds for ``hello`` (from ``peer_host``): its own QP settings with
    the sender's PSN window (and no more in flight than fits it), checked (MRCError, the
    refusal, otherwise); its ``plane_addrs`` paired with the sender's (or, for either side that
    names none, the address the side channel runs between), and ``evs`` EVs at least one per
    plane."""
    cfg = dataclasses.replace(qp) if qp is not None else QPConfig()
    if hello.psn_window is not None:
        cfg.psn_window = hello.psn_window
    cfg.max_outstanding = min(cfg.max_outstanding, cfg.psn_window)
    try:
        cfg.validate()
    except ValueError as exc:
        raise MRCError(f"cannot accept with this receiver's settings: {exc}") from None
    peer_addrs = list(hello.addrs) or [peer_host]
    local = list(plane_addrs) or [any_address(peer_addrs[0])]
    pairs = plane_pairs(local, peer_addrs)
    active = max(evs, len(pairs))
    total = active + backup_count(active, len(pairs))
    return Plan(cfg, pairs, active, total, routes_for(pairs, fabric))


def pick_checksum(offered: Sequence[str], accepted: Sequence[str]) -> str | None:
    """The end-to-end checksum the listener takes: the first of its own ``accepted`` that the
    hello ``offered`` (names it does not know are passed over); None when the hello offered
    none and SHA-256 is acceptable (a peer that names none verifies with SHA-256). MRCError,
    the refusal, when there is none in common."""
    if not offered:
        if "sha256" in accepted:
            return None
        raise MRCError(
            f"the sender names no end-to-end checksum (so SHA-256), and this receiver takes "
            f"only {', '.join(accepted)}"
        )
    for name in accepted:
        if name in offered:
            return name
    raise MRCError(
        f"no end-to-end checksum in common: the sender offers {', '.join(offered)}, this "
        f"receiver takes {', '.join(accepted)}"
    )


def checksum_key(key: bytes | None) -> bytes | None:
    """The 32-byte key a keyed checksum of a connection under ``key`` uses: derived, so the
    connection's own key is never a hash key as well."""
    if key is None:
        return None
    return hashlib.sha256(b"mrc end-to-end checksum key\0" + key).digest()


def region_cost(
    request: RegionRequest | None, region_memory: RegionMemory | None
) -> tuple[int, int]:
    """What ``request`` costs the listener's ledger: bytes granted, and the memory among them
    (``region_memory`` says; without it, all of them)."""
    size = request.size if request is not None else 0
    memory = region_memory(size) if region_memory is not None and size else size
    return size, memory


Side = TypeVar("Side")


class JoinTable(Generic[Side]):
    """The connections further side-channel paths may join: the token each welcome gave out,
    and what it joins (a side channel and its number of planes)."""

    def __init__(self) -> None:
        self._joinable: dict[str, tuple[Side, int]] = {}

    def __len__(self) -> int:
        return len(self._joinable)

    def __iter__(self) -> Iterator[str]:
        return iter(self._joinable)

    def offer(self, side: Side, planes: int) -> str | None:
        """A fresh token for a connection over ``planes`` planes, to put in its welcome; None
        for one plane (there is nothing to join)."""
        if planes < 2:
            return None
        token = secrets.token_hex(16)
        self._joinable[token] = (side, planes)
        return token

    def forget(self, token: str | None) -> None:
        """The connection ended (or never was): its token joins nothing any more."""
        if token is not None:
            self._joinable.pop(token, None)

    def check(self, join: Join, proof_of: Callable[[Side, str, int], str | None]) -> Side:
        """The side channel ``join`` may join, or MRCError (the refusal): the token must be
        live, the plane one of the connection's, and with a key the proof right
        (``proof_of(side, token, plane)``: what it must be, None without a key)."""
        found = self._joinable.get(join.token)
        if found is None:
            raise MRCError("no connection to join with that token (it ended, or never was)")
        side, planes = found
        if join.plane >= planes:
            raise MRCError(f"the connection has {planes} planes, no plane {join.plane}")
        want = proof_of(side, join.token, join.plane)
        if want is not None and not (
            join.proof is not None and hmac.compare_digest(join.proof, want)
        ):
            raise MRCError("the join's proof is wrong (another key, or none)")
        return side


# ---- the connecting side --------------------------------------------------------------------


def request_of(config: ConnectConfig) -> RegionRequest | None:
    """The region ``config`` asks the listener for, if any."""
    if config.request_size is None:
        return None
    return RegionRequest(config.request_size, config.request_name)


def hello_of(
    config: ConnectConfig,
    qp: QPConfig,
    *,
    qpn: int,
    psn: int,
    udp_port: int,
    addrs: Sequence[str],
    regions: Sequence[MemoryRegion],
) -> Hello:
    """The sender's hello: its QP, where ACKs reach it, its planes' addresses, what it offers
    and asks for (encrypting, the request goes sealed after the key proof instead), and with a
    key the mode it offers."""
    request = request_of(config)
    mode = Mode.ENCRYPT if config.encrypt else Mode.INTEGRITY
    return Hello(
        qpn=qpn,
        psn=psn,
        udp_port=udp_port,
        addrs=tuple(addrs),
        evs=config.evs,
        psn_window=qp.psn_window,
        max_imm=qp.max_imm_dest,
        regions=tuple(describe_region(r) for r in regions),
        request=None if config.encrypt else request,
        auth=auth.offer(mode) if config.key else None,
        checksums=tuple(config.checksums),
    )


def read_welcome(obj: object, host: str, offered: Sequence[str] = ()) -> Welcome:
    """The listener's answer to our hello: its welcome, or the exception its refusal means
    (:class:`~mrc.transport.messages.RefusedForNow` when we may try again); a closed channel
    (``obj`` None), a malformed answer or a checksum we did not ``offer`` is an MRCError."""
    if obj is None:
        raise MRCError(f"[{host}] closed the side channel during set-up")
    reply = parse_reply(obj)
    if isinstance(reply, Refusal):
        raise reply.exception()
    picked = reply.checksum
    if (picked is not None and picked not in offered) or (picked is None and offered):
        raise MRCError(
            f"[{host}] picked the checksum {picked or 'none'}, not one of those offered "
            f"({', '.join(offered) or 'none'})"
        )
    return reply


def plan_dial(
    hello: Hello, welcome: Welcome, host: str, qp: QPConfig, fabric: Topology | None
) -> Plan:
    """What the sender builds once welcomed: its planes paired with the listener's (or the
    address it reached, ``host``, if the welcome names none), ``hello.evs`` active EVs and
    their backups."""
    pairs = plane_pairs(list(hello.addrs), list(welcome.addrs) or [host])
    active = hello.evs or 1
    total = active + backup_count(active, len(pairs))
    return Plan(qp, pairs, active, total, routes_for(pairs, fabric))
