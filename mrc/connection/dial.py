"""The connecting side: ``connect()``, its set-up and the side channel's further paths."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import time
import warnings
from collections.abc import Sequence
from typing import Any

from mrc.connection.common import adopt, new_qpn, resolve, side_channel
from mrc.connection.config import ConnectConfig, from_keywords
from mrc.connection.conn import Connection
from mrc.connection.handshake import (
    any_address,
    checksum_key,
    hello_of,
    plan_dial,
    read_welcome,
    request_of,
    route_ids,
)
from mrc.core.config import QPConfig
from mrc.core.endpoint import EndpointCore, PeerGroups
from mrc.core.memory import MemoryRegion
from mrc.core.qp import QueuePair
from mrc.errors import MRCError
from mrc.transport import auth
from mrc.transport.control import MAX_LINE, ControlChannel, ControlError
from mrc.transport.endpoint import Endpoint
from mrc.transport.evsockets import open_ev_sockets
from mrc.transport.linkspeed import with_line_rate
from mrc.transport.messages import (
    Hello,
    Join,
    Refusal,
    RefusedForNow,
)
from mrc.transport.ports import RangeExhausted
from mrc.transport.sidechannel import (
    JOIN_TIMEOUT,
    join_proof,
    key_path,
    tune_path,
)
from mrc.transport.sockets import udp_socket
from mrc.wire import DEFAULT_PORT

log = logging.getLogger(__name__)

#: set-ups a sender tries when a listener lets each give way to a newer connection (a refusal
#: with ``retry``): a listener full of peers that prove nothing drops its oldest for a newcomer
SETUP_ATTEMPTS = 4

#: what the window laws of this process's QPs to one peer (its host, our addresses) share
#: (WindowLaw.join): every sender's endpoint is given this one, so that connections, each
#: with an endpoint of its own, share too; a peer's group goes when its last QP closes
PEERS = PeerGroups()


#: connect errors worth trying again while ``wait`` lasts: nobody listens yet, or the
#: address or its route is not up yet (a container's interface still coming up)
_RETRYABLE = (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)


async def _open_side_channel(
    host: str, port: int, timeout: float, wait: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The TCP side channel to ``host``:``port``, tried again on refusal while ``wait`` lasts.

    Polling is the only way here: nothing tells a client that a remote listener has started.
    Retries back off from 50 ms to 1 s so a peer that never comes costs little.
    """
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=MAX_LINE), timeout
            )
        except TimeoutError:
            raise MRCError(
                f"peer [{host}]:{port} unreachable (no answer in {timeout:g} s)"
            ) from None
        except OSError as exc:
            if exc.errno in _RETRYABLE and time.monotonic() + delay <= deadline:
                log.debug(
                    "[%s]:%d: %s; trying again in %g s", host, port, os.strerror(exc.errno), delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if isinstance(exc, ConnectionRefusedError):
                waited = f" after trying for {wait:g} s" if wait > 0 else ""
                raise MRCError(
                    f"connection refused by [{host}]:{port}{waited} (is mrc-recv listening there?)"
                ) from None
            raise MRCError(f"cannot reach [{host}]:{port}: {exc.strerror or exc}") from None


#: seconds a set-up waits for one address before it tries the next beside it (connect's
#: ``alternates``; RFC 8305 recommends 250 ms)
STAGGER = 0.25


async def _open_first(
    hosts: list[str], port: int, timeout: float, wait: float
) -> tuple[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """The side channel to the first of ``hosts`` that answers: each is tried :data:`STAGGER`
    seconds after the one before (at once when that one failed); the rest are abandoned."""
    if len(hosts) == 1:
        return hosts[0], await _open_side_channel(hosts[0], port, timeout, wait)
    tries: dict[asyncio.Task[tuple[asyncio.StreamReader, asyncio.StreamWriter]], str] = {}
    errors: list[str] = []
    pending = list(hosts)
    try:
        while pending or tries:
            if pending:
                h = pending.pop(0)
                tries[asyncio.ensure_future(_open_side_channel(h, port, timeout, wait))] = h
            done, _ = await asyncio.wait(
                tries, timeout=STAGGER if pending else None, return_when="FIRST_COMPLETED"
            )
            for task in done:
                h = tries.pop(task)
                try:
                    return h, task.result()
                except MRCError as exc:
                    errors.append(str(exc))
        raise MRCError("; ".join(errors))
    finally:
        for task in tries:
            task.cancel()
        for task in tries:
            with contextlib.suppress(BaseException):
                _r, w = await task
                w.close()


async def connect(
    host: str | Sequence[str],
    port: int = DEFAULT_PORT,
    config: ConnectConfig | None = None,
    *,
    regions: Sequence[MemoryRegion] | None = None,
    peers: PeerGroups | None = None,
    **keywords: Any,
) -> Connection:
    """Connect a QP to a listener at ``host``:``port``, as ``config`` says
    (:class:`~mrc.connection.config.ConnectConfig`: EVs, planes, QP settings, a region to ask
    for, timeouts, key).

    ``host`` may be a list: the listener's addresses on its planes. When the first does not
    answer within :data:`STAGGER` seconds, or refuses, the next is tried beside it, as happy
    eyeballs does for address families; the first to answer is used. Once set up, the side
    channel runs over every plane anyway (docs/PROTOCOL.md, "Side channel over every plane"),
    so no address matters after set-up either.

    ``regions``: memory of ours the listener may write into (announced in the hello; its
    ``remote``). ``peers``: the groups in which the window laws of QPs to one peer share what
    they learn (a base RTT); by default this process's :data:`PEERS`, so that all of its
    connections to a peer share.

    The keyword arguments ``connect()`` took before ``ConnectConfig`` (``evs=``,
    ``request_size=``, ``config=QPConfig(...)``, ``alternates=``...) still work for one release,
    with a DeprecationWarning.
    """
    alternates = keywords.pop("alternates", None)
    config = from_keywords(ConnectConfig, config, keywords, "connect")
    hosts_given = [host] if isinstance(host, str) else list(host)
    if alternates:
        warnings.warn(
            "connect(..., alternates=) is deprecated and goes in the next release: pass the "
            "addresses as connect([host, *alternates], port, config)",
            DeprecationWarning,
            stacklevel=2,
        )
        hosts_given += list(alternates)
    if not hosts_given:
        raise MRCError("connect needs a host to connect to")
    cfg = config.qp or QPConfig()
    try:
        cfg.validate()
    except ValueError as exc:
        raise MRCError(str(exc)) from None
    ports = config.ports
    core = EndpointCore(peers=peers if peers is not None else PEERS)
    for region in regions or []:
        adopt(core.pd, region)
    hosts = [resolve(h) for h in hosts_given]
    first = hosts[0]
    locals_ = [resolve(a) for a in config.local_addrs]
    # the UDP socket first: the hello then follows the TCP handshake at once (a listener whose
    # set-up slots are full lets a connection that has said nothing give way first)
    try:
        rx = udp_socket(any_address(first), 0, ports=ports)
    except RangeExhausted as exc:
        raise MRCError(f"cannot open the UDP socket for ACKs: {exc}") from None
    except OSError as exc:
        raise MRCError(f"cannot open a UDP socket: {exc.strerror or exc}") from None
    endpoint = Endpoint(core, [rx])
    qpn, psn = new_qpn(core), secrets.randbits(24)
    attempts = 0
    try:
        while True:
            reached, (reader, writer) = await _open_first(hosts, port, config.timeout, config.wait)
            control = ControlChannel(reader, writer)
            hello = hello_of(
                config,
                cfg,
                qpn=qpn,
                psn=psn,
                udp_port=endpoint.port,
                addrs=locals_ or [writer.get_extra_info("sockname")[0]],
                regions=regions or [],
            )
            try:
                return await _client_setup(endpoint, control, reached, hello, cfg, config)
            except RefusedForNow:
                control.close()
                attempts += 1
                if attempts == SETUP_ATTEMPTS:
                    raise
            except BaseException:
                control.close()
                raise
            await asyncio.sleep(0.01 * 2 ** (attempts - 1))
    except BaseException:
        endpoint.close()  # and with it the EV sockets of an attached QP
        raise


async def _client_setup(
    endpoint: Endpoint,
    control: ControlChannel,
    host: str,
    hello: Hello,
    cfg: QPConfig,
    config: ConnectConfig,
) -> Connection:
    """Say hello (and prove the key; encrypting, then send the region request sealed), check
    all of the answer, then open the EV sockets (from ``config.ports``, if given) and attach
    the QP."""
    protection = None
    try:
        await control.send(hello.to_json())
        if config.key is not None:
            protection = await auth.as_sender(control, config.key, hello, config.timeout)
            await auth.send_request(control, hello, request_of(config))
        obj = await control.recv(timeout=config.timeout)
    except ControlError as exc:
        raise MRCError(f"set-up with [{host}] failed: {exc}") from None
    reply = read_welcome(obj, host, hello.checksums)
    plan = plan_dial(hello, reply, host, cfg, config.fabric)
    pairs = plan.pairs
    cfg = with_line_rate(cfg, [local for local, _ in pairs], config.fabric)
    evsocks = open_ev_sockets(
        plan.total, plan.routes, reply.udp_port, config.ports, cfg.source_ports
    )
    try:
        qp = QueuePair(
            hello.qpn,
            endpoint.core.pd,
            evsocks.values,
            evsocks.planes,
            cfg,
            hello.psn,
            active_evs=plan.active,
            ev_routes=route_ids(evsocks.routes),
        )
        qp.connect(reply.qpn, reply.psn)
        if reply.max_imm is not None:
            qp.peer_takes_imms(reply.max_imm)
        if reply.start_bytes is not None:
            qp.requester.cc.start_within(reply.start_bytes // cfg.payload_size)
        if protection is not None:
            qp.protect(protection)
        channel = endpoint.attach(qp, evsocks)
    except BaseException:
        evsocks.close()
        raise
    # only once nothing can fail: Connection.close is what leaves the group again
    endpoint.core.peers.join((host, hello.addrs), qp)
    side = side_channel(control, pairs)
    if reply.join is not None and len(pairs) > 1:
        token, port = reply.join, control.peer_port
        side.join_planes(  # (the set-up's plane has its path: joined again once lost)
            list(range(len(pairs))),
            lambda plane: _join_path(control, pairs[plane], port, token, plane),
        )
    return Connection(
        endpoint,
        channel,
        control,
        remote=reply.regions,
        requested=reply.regions[0] if reply.regions else None,
        owns_endpoint=True,
        peer_addrs=reply.addrs,
        routes=evsocks.routes,
        side=side,
        plane_pairs=pairs,
        checksum=reply.checksum or "sha256",
        checksum_key=checksum_key(config.key),
    )


async def _join_path(
    primary: ControlChannel, pair: tuple[str, str], port: int, token: str, plane: int
) -> ControlChannel:
    """Open the side channel's path over ``plane`` (from ``pair``'s local address to its
    remote one) and join it to the connection (the welcome's ``token``)."""
    local, remote = pair
    reader, writer = await asyncio.open_connection(
        remote, port, local_addr=(local, 0), limit=MAX_LINE
    )
    path = ControlChannel(reader, writer)
    try:
        tune_path(writer)
        proof = join_proof(primary, token, plane, sending=True)
        await path.send(Join(token, plane, proof).to_json())
        obj = await path.recv(timeout=JOIN_TIMEOUT)
        if obj is None:
            raise ControlError("the receiver closed the path as it joined")
        if obj.get("ok") is not True:
            raise ControlError(f"join refused: {Refusal.from_json(obj).error}")
        key_path(path, primary, plane)
    except BaseException:
        path.close()
        raise
    return path
