"""The library API: RDMA-style connections over MRC.

A receiver ``listen()``s and registers memory; a sender ``connect()``s, learns the receiver's
regions (name, rkey, address, length) over the side channel, and posts WRITE / WRITE_IMM work
requests that land straight in that memory. Completions are awaited, not polled::

    listener = await mrc.listen("::1", 4791)
    inbox = listener.register(bytearray(1 << 20), name="inbox")
    ...
    conn = await mrc.connect("::1", 4791, mrc.ConnectConfig(evs=16))
    await conn.write(b"hello", conn.remote["inbox"], offset=0, imm=1)

The package's modules, one job each: :mod:`~mrc.connection.config` (what listen and connect
are told), :mod:`~mrc.connection.handshake` (the set-up's decisions, sans-IO),
:mod:`~mrc.connection.listener` and :mod:`~mrc.connection.dial` (the asyncio glue of each
side), :mod:`~mrc.connection.conn` (a connection once set up).
"""

from __future__ import annotations

from mrc.connection.config import (
    CONNECT_TIMEOUT,
    HELLO_TIMEOUT,
    SETUP_TIMEOUT,
    START_TIMEOUT,
    Buffer,
    ConnectConfig,
    ListenerConfig,
    RegionFactory,
    RegionMemory,
    RegionRelease,
)
from mrc.connection.conn import Connection
from mrc.connection.dial import PEERS, SETUP_ATTEMPTS, STAGGER, connect
from mrc.connection.listener import Listener, listen
from mrc.errors import MRCError
from mrc.evlayout import backup_count
from mrc.transport.limits import Limits
from mrc.transport.messages import RemoteRegion

__all__ = [
    "CONNECT_TIMEOUT",
    "HELLO_TIMEOUT",
    "PEERS",
    "SETUP_ATTEMPTS",
    "SETUP_TIMEOUT",
    "STAGGER",
    "START_TIMEOUT",
    "Buffer",
    "ConnectConfig",
    "Connection",
    "Limits",
    "Listener",
    "ListenerConfig",
    "MRCError",
    "RegionFactory",
    "RegionMemory",
    "RegionRelease",
    "RemoteRegion",
    "backup_count",
    "connect",
    "listen",
]
