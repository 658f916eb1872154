"""The commands' flags as the library's configuration objects, built in this one place.

mrc-send's flags become a :class:`~mrc.core.config.QPConfig` and a
:class:`~mrc.connection.ConnectConfig`, mrc-recv's a ``QPConfig`` and a
:class:`~mrc.connection.ListenerConfig`; the commands only gather what the flags cannot say
(a key read from its file, the fabric loaded, the receiver's outputs) and pass it in.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mrc.cli.outputs import discard_bytes
from mrc.cli.qpopts import apply_settings, with_window
from mrc.connection import ConnectConfig, ListenerConfig, RegionFactory, RegionRelease
from mrc.core.config import QPConfig
from mrc.transport.limits import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_GRANTED

if TYPE_CHECKING:
    from mrc.topology.model import Topology

#: mrc-send's window cap when --window is not given (packets in flight)
DEFAULT_WINDOW = 512

#: how mrc-recv's refusals say each limit is raised
LIMIT_FLAGS = {
    "setups": "--max-setups raises it",
    "granted_bytes": "--max-total raises it",
    "memory_bytes": "--max-memory raises it",
}


def sender_qp(args: argparse.Namespace, payload: int) -> QPConfig:
    """mrc-send's QP settings: --payload (as chosen for the path), --burst or --spray, --cc,
    --window, then every --qp; ValueError (bad usage) if impossible."""
    burst = args.burst
    if args.spray == "packet":
        if burst is not None and burst != 1:
            raise ValueError(
                f"--spray packet sends every packet on its own EV: not --burst {burst}"
            )
        burst = 1
    elif args.spray == "burst" and burst == 1:
        raise ValueError("--spray burst needs bursts: not --burst 1")
    config = QPConfig(payload_size=payload, burst=burst, cc=args.cc)
    apply_settings(with_window(config, args.window or DEFAULT_WINDOW), args.qp)
    config.validate()
    return config


def receiver_qp(args: argparse.Namespace) -> QPConfig | None:
    """mrc-recv's QP settings: its --qp ones, or None (the library's defaults); ValueError
    (bad usage) if impossible."""
    if not args.qp:
        return None
    config = apply_settings(QPConfig(), args.qp)
    config.validate()
    return config


def connect_config(
    args: argparse.Namespace,
    qp: QPConfig,
    *,
    key: bytes | None,
    fabric: Topology | None,
    local: Sequence[str],
    request: tuple[int, str],
) -> ConnectConfig:
    """How each of mrc-send's connections is made: --evs, --from (``local``), --wait, --ports,
    --encrypt, and the region ``request`` (size, name) for the transfer."""
    size, name = request
    return ConnectConfig(
        evs=args.evs,
        local_addrs=local,
        qp=qp,
        request_size=size,
        request_name=name,
        fabric=fabric,
        key=key,
        encrypt=args.encrypt,
        wait=args.wait,
        ports=args.ports,
        checksums=args.checksum,
    )


def region_memory(args: argparse.Namespace) -> Callable[[int], int]:
    """How much of a transfer's region is memory, counted against --max-memory: --discard
    maps anonymous memory of the transfer's size, or of its --discard-window when the
    transfer is larger (mrc.cli.outputs.discard_bytes). An --out file's pages belong to the page
    cache: the kernel writes dirty ones back (holding a writer back beyond its dirty limits)
    and reclaims clean ones under pressure, so they are bounded by the disk space reserved for
    the file and --max-total, not by memory."""
    if args.discard:
        window: int = args.discard_window
        return lambda size: discard_bytes(size, window)
    return lambda _size: 0


def listener_config(
    args: argparse.Namespace,
    qp: QPConfig | None,
    *,
    plane_addrs: Sequence[str],
    key: bytes | None,
    fabric: Topology | None,
    regions: tuple[RegionFactory, RegionRelease],
) -> ListenerConfig:
    """How mrc-recv listens: --evs, --encrypt, --ports, --start-timeout, the limits
    (--max-setups, --count transfers at once, --max-total or at least --max-size, --max-memory)
    and the refusals' hints, with ``regions`` (factory, release) making each transfer's
    region."""
    factory, release = regions
    return ListenerConfig(
        plane_addrs=plane_addrs,
        evs=args.evs,
        qp=qp,
        region_factory=factory,
        region_release=release,
        region_memory=region_memory(args),
        fabric=fabric,
        key=key,
        require_encrypt=args.encrypt,
        max_setups=args.max_setups,
        # --count transfers may run at once
        max_connections=max(args.count, DEFAULT_MAX_CONNECTIONS),
        max_granted_bytes=(
            args.max_total
            if args.max_total is not None
            else max(DEFAULT_MAX_GRANTED, args.max_size)
        ),
        max_memory_bytes=args.max_memory if args.max_memory is not None else "auto",
        limit_hints=LIMIT_FLAGS,
        start_timeout=args.start_timeout,
        ports=args.ports,
        checksums=args.checksum,
    )
