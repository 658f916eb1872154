"""What ``listen()`` and ``connect()`` are told: two frozen, checked configuration objects.

As quinn's ``ServerConfig`` / ``ClientConfig`` and aioquic's ``QuicConfiguration`` do, the many
settings of a listener or a connection travel as one value, checked once when it is made (an
impossible setting is an :class:`~mrc.errors.MRCError` naming it, before any socket is opened),
and reusable: one ``ConnectConfig`` serves every connection a program makes. What depends on
the machine (``max_memory_bytes="auto"``, names to resolve) is worked out by ``listen()`` /
``connect()`` themselves.

The keyword arguments ``listen()`` and ``connect()`` took before these objects still work for
one release, with a :class:`DeprecationWarning` (:func:`from_keywords`).
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from mrc.core.config import QPConfig
from mrc.errors import MRCError
from mrc.transport.limits import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_GRANTED,
    DEFAULT_MAX_SETUPS,
    Limits,
)
from mrc.transport.messages import CHECKSUMS, MAX_EVS, MAX_REGION_SIZE
from mrc.transport.ports import PortRange
from mrc.wire import MAX_PLANES

if TYPE_CHECKING:
    from mrc.topology.model import Topology

#: how long ``connect()`` waits for the TCP connect and for the listener's answer (``timeout``)
CONNECT_TIMEOUT = 5.0
#: a listener's bound on one whole set-up, TCP connection to welcome (``setup_timeout``)
SETUP_TIMEOUT = 10.0
#: how long a new side-channel connection has to say its hello and, with a key, prove it
#: (``hello_timeout``): a sender does both within a round trip of connecting
HELLO_TIMEOUT = 2.0
#: the end-to-end checksums a listener takes by default, preferred first: BLAKE3, then what a
#: peer that names none verifies with, then xxh3-128 (a sender that offers only that asked
#: for it)
TAKEN_CHECKSUMS = ("blake3", "sha256", "xxh3-128")
#: how long a welcomed sender may stay silent on the data path (``start_timeout``)
START_TIMEOUT = 10.0


class Buffer(Protocol):
    """Anything ``memoryview()`` accepts: bytes, bytearray, memoryview, mmap, array...

    (``collections.abc.Buffer`` from Python 3.12, spelled out for 3.11. Type checkers on 3.11
    do not know that NumPy arrays are buffers; they work all the same.)
    """

    def __buffer__(self, flags: int, /) -> memoryview: ...


# ``region_factory(size, request)``: a writable buffer for a sender that asked for ``size``
# bytes; ``request`` is the hello's request object ({"size", "name"}). At least ``size`` bytes,
# or fewer: a window the sender streams through in rounds (mrc/app/rounds.py; mrc-recv --discard).
# Called in a worker thread (a large region takes seconds to make, and the listener's other
# connections keep moving meanwhile), so it must not touch the event loop.
RegionFactory = Callable[[int, dict[str, object]], Buffer]
# ``region_memory(size)``: how many of the bytes of a region ``region_factory`` makes for ``size``
# are memory (counted against ``max_memory_bytes``); without it, all of them.
RegionMemory = Callable[[int], int]
# ``region_release(buffer)``: a region made for a sender will never reach the application: its
# set-up failed after the buffer was made, the sender never started sending (``start_timeout``),
# or the listener closed before ``accept()`` handed the connection out. Free it (e.g. unmap and
# delete the file behind it). Never called for a connection ``accept()`` returned: its owner
# frees ``granted`` when the transfer ends.
RegionRelease = Callable[[Buffer], None]


def _check_planes(addrs: Sequence[str], name: str) -> None:
    """At most :data:`mrc.wire.MAX_PLANES` planes: an ACK says which of them work in a
    16-bit bitmap, and a 17th plane would always read as down."""
    if len(addrs) > MAX_PLANES:
        raise MRCError(
            f"{name}: at most {MAX_PLANES} planes (an ACK's port-state bitmap has "
            f"{MAX_PLANES} bits), not {len(addrs)}"
        )


def _check_checksums(names: Sequence[str], field_name: str) -> None:
    """Names of end-to-end checksums mrc knows (docs/PROTOCOL.md, "Checksum"), none twice."""
    for name in names:
        if name not in CHECKSUMS:
            raise MRCError(
                f"{field_name}: {name!r} is not a checksum mrc knows ({', '.join(CHECKSUMS)})"
            )
    if len(set(names)) != len(names):
        raise MRCError(f"{field_name}: {', '.join(names)} names one checksum twice")


def _check_qp(qp: QPConfig | None, prefix: str = "") -> None:
    if qp is None:
        return
    try:
        qp.validate()
    except ValueError as exc:
        raise MRCError(f"{prefix}{exc}") from None


@dataclass(frozen=True, kw_only=True)
class ListenerConfig:
    """How a listener accepts (``listen(host, port, config)``); see docs/LIBRARY.md.

    ``plane_addrs``: this host's address on each plane (one per NIC); data for plane p arrives
    there, and senders are told about them. Empty: one plane on whatever address the sender
    reached. ``evs``: entropy values per connection towards each sender (for the ACKs).
    ``qp``: every connection's queue-pair settings (the sender's PSN window is adopted).
    ``fabric``: an mrc-fabric topology; acknowledgements are then sprayed over its SRv6 paths.
    ``ports``: the EV sockets' source ports come from this range (a firewall's), and port 0
    picks the listening port from it (docs/CLUSTER.md).

    ``region_factory(size, request)`` allocates memory for a sender that asks for a region of
    ``size`` bytes (as mrc-recv does for a file), in a worker thread, or fewer bytes, a window
    to stream through; ``region_release(buffer)`` frees one the application never received;
    ``region_memory(size)`` says how much of such a region is memory (without it: all).

    Whoever reaches the port can make the listener work, so what peers hold is bounded; beyond
    a bound a peer is refused with one line naming it, before anything is allocated for it:

    * ``max_setups`` (64): TCP connections still in set-up (hello not yet answered). When all
      slots are taken, the oldest set-up that has not yet said its hello (and, with a key,
      proved it) is dropped for the newcomer, from the source (IPv4 address, IPv6 /64) that
      holds the most of them; if every set-up in progress has, the newcomer is refused at
      once, unread. A set-up has ``hello_timeout`` (2 s) to say its hello and prove the key,
      and ``setup_timeout`` (10 s) in all.
    * ``max_connections`` (64): connections set up and not yet closed, handed out or not.
    * ``max_granted_bytes`` (64 GiB; None: no bound): the sum of regions ``region_factory``
      made on request whose connections are not yet closed, checked before it is called.
    * ``max_memory_bytes``: the part of those regions that is memory, checked the same way.
      "auto" (the default): a quarter of the memory this process may use (the machine's, or
      its memory cgroup's limit if lower), at most half of what is available when the
      listener starts; None: no bound. A bound above the machine's memory is refused.
    * ``limit_hints``: how each limit (``setups``, ``connections``, ``granted_bytes``,
      ``memory_bytes``) is raised, appended to its refusals (mrc-recv names its flags).
    * ``start_timeout`` (10 s; None: never): a welcomed sender whose first datagram has not
      arrived this long after set-up, and that ``accept()`` has not handed out, is aborted
      and everything it held freed.

    ``key``: a pre-shared key (:func:`mrc.security.keys.read_key_file`). Senders must then
    prove they hold it before anything is allocated for them, and every datagram and
    side-channel message of their connection is authenticated (docs/PROTOCOL.md section 11).
    ``require_encrypt``: refuse senders that do not also encrypt payloads. Without a key,
    anyone who can reach the port can write into the regions it offers.

    ``checksums``: the end-to-end checksums this listener verifies transfers with, preferred
    first; it picks the first of them a sender offers (mrc.app.checksum), and refuses a sender
    that offers none of them. A sender that names no checksum gets SHA-256, if listed.
    """

    plane_addrs: Sequence[str] = ()
    evs: int = 16
    qp: QPConfig | None = None
    fabric: Topology | None = None
    ports: PortRange | None = None
    region_factory: RegionFactory | None = None
    region_release: RegionRelease | None = None
    region_memory: RegionMemory | None = None
    max_setups: int = DEFAULT_MAX_SETUPS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_granted_bytes: int | None = DEFAULT_MAX_GRANTED
    max_memory_bytes: int | None | Literal["auto"] = "auto"
    limit_hints: Mapping[str, str] = field(default_factory=dict)
    setup_timeout: float = SETUP_TIMEOUT
    hello_timeout: float = HELLO_TIMEOUT
    start_timeout: float | None = START_TIMEOUT
    key: bytes | None = None
    require_encrypt: bool = False
    checksums: Sequence[str] = TAKEN_CHECKSUMS

    def __post_init__(self) -> None:
        object.__setattr__(self, "plane_addrs", tuple(self.plane_addrs))
        object.__setattr__(self, "checksums", tuple(self.checksums))
        if not self.checksums:
            raise MRCError("checksums: name at least one checksum this listener verifies with")
        _check_checksums(self.checksums, "checksums")
        object.__setattr__(self, "limit_hints", types.MappingProxyType(dict(self.limit_hints)))
        if self.require_encrypt and self.key is None:
            raise MRCError("require_encrypt needs a key")
        memory = self.max_memory_bytes
        if isinstance(memory, str) and memory != "auto":
            raise MRCError(f"max_memory_bytes must be 'auto', None or bytes, not {memory!r}")
        self.limits(None if memory == "auto" else memory)  # the bounds' own checks
        if not self.setup_timeout > 0:
            raise MRCError(f"setup_timeout must be more than 0 s, not {self.setup_timeout!r}")
        if not self.hello_timeout > 0:
            raise MRCError(f"hello_timeout must be more than 0 s, not {self.hello_timeout!r}")
        if self.start_timeout is not None and not self.start_timeout > 0:
            raise MRCError(
                f"start_timeout must be None or more than 0 s, not {self.start_timeout!r}"
            )
        if self.evs < 1:
            raise MRCError(f"evs must be at least 1, not {self.evs}")
        _check_planes(self.plane_addrs, "plane_addrs")

    def limits(self, memory_bytes: int | None) -> Limits:
        """The listener's :class:`~mrc.transport.limits.Limits`, with ``max_memory_bytes``
        as ``listen()`` resolved it for this machine (``memory_bytes``)."""
        return Limits(
            self.max_setups,
            self.max_connections,
            self.max_granted_bytes,
            memory_bytes,
            tuple(sorted(self.limit_hints.items())),
        )


@dataclass(frozen=True, kw_only=True)
class ConnectConfig:
    """How a sender connects (``connect(host, port, config)``); see docs/LIBRARY.md.

    ``evs`` entropy values (32 bits: a UDP source port, one socket per route, and an IPv6 flow
    label, mrc/transport/evsockets.py) are spread evenly over the planes: plane p pairs
    ``local_addrs[p]`` with the listener's p-th plane address. ``qp``: the queue pair's
    settings. ``request_size`` asks the listener to allocate a region of that size for us (it
    appears first in ``remote``), named ``request_name``. ``timeout`` bounds the TCP connect and
    the wait for the listener's answer. ``wait``: for up to this many seconds, a refused or
    unroutable connect is tried again (the receiver may still be starting); 0 fails at once.
    ``ports``: every UDP socket of the connection is bound to a port of this range, for a
    firewall (mrc.transport.ports, docs/CLUSTER.md). ``fabric``: an mrc-fabric topology; each
    plane's EVs are then spread over its SRv6 paths (one per spine).

    ``key``: the listener's pre-shared key; both sides prove they hold it, and every datagram
    of the connection is then authenticated, its payload also encrypted with ``encrypt``.
    Each protected data packet carries 44 bytes more (docs/PROTOCOL.md section 11).
    ``checksums``: the end-to-end checksums offered to the listener, preferred first; it picks
    one (``Connection.checksum``). Empty: none offered, and the listener takes SHA-256.
    """

    evs: int = 128
    local_addrs: Sequence[str] = ()
    qp: QPConfig | None = None
    request_size: int | None = None
    request_name: str = ""
    timeout: float = CONNECT_TIMEOUT
    wait: float = 0.0
    fabric: Topology | None = None
    ports: PortRange | None = None
    key: bytes | None = None
    encrypt: bool = False
    checksums: Sequence[str] = CHECKSUMS

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_addrs", tuple(self.local_addrs))
        object.__setattr__(self, "checksums", tuple(self.checksums))
        _check_checksums(self.checksums, "checksums")
        if self.encrypt and self.key is None:
            raise MRCError("encrypt needs a key")
        if self.evs < 1:
            raise MRCError("need at least one EV")
        if self.evs > MAX_EVS:
            raise MRCError(
                f"at most {MAX_EVS} EVs (with their backups, a 16-bit flow label each), "
                f"not {self.evs}"
            )
        size = self.request_size
        if size is not None and not 0 <= size <= MAX_REGION_SIZE:
            raise MRCError(f"cannot request a region of {size} bytes (0..{MAX_REGION_SIZE})")
        if self.ports is not None and len(self.ports) < 2:
            raise MRCError(
                f"the port range {self.ports} (--ports) holds {len(self.ports)} port; a "
                "connection needs at least 2 (an EV socket per route, and the sender's "
                "receive port)"
            )
        if not self.timeout > 0:
            raise MRCError(f"timeout must be more than 0 s, not {self.timeout!r}")
        if not self.wait >= 0:
            raise MRCError(f"wait must be at least 0 s, not {self.wait!r}")
        _check_planes(self.local_addrs, "local_addrs")
        _check_qp(self.qp)


Config = TypeVar("Config", ListenerConfig, ConnectConfig)

#: the keyword ``listen()`` / ``connect()`` took for the QP's settings, now the field ``qp``
_RENAMED = {"config": "qp"}


def from_keywords(
    kind: type[Config], config: Config | QPConfig | None, keywords: Mapping[str, Any], call: str
) -> Config:
    """``config`` with the keyword arguments ``call`` took before config objects applied on top
    (``config=QPConfig(...)`` included, as ``qp``), warning once per call that they go in the
    next release; a keyword that never existed is a TypeError, as Python's own."""
    given = dict(keywords)
    if isinstance(config, QPConfig):  # the old ``config=`` keyword, passed as the new one
        given["config"] = config
        config = None
    if not given:
        return config if config is not None else kind()
    names = {f.name for f in dataclasses.fields(kind)}
    fields: dict[str, Any] = {}
    for keyword, value in given.items():
        name = _RENAMED.get(keyword, keyword)
        if name not in names:
            raise TypeError(f"{call}() got an unexpected keyword argument {keyword!r}")
        fields[name] = value
    old = ", ".join(f"{k}=" for k in given)
    new = ", ".join(f"{_RENAMED.get(k, k)}=" for k in given)
    warnings.warn(
        f"{call}(..., {old}) is deprecated and goes in the next release: pass "
        f"{call}(host, port, {kind.__name__}({new}))",
        DeprecationWarning,
        stacklevel=3,
    )
    return dataclasses.replace(config, **fields) if config is not None else kind(**fields)
