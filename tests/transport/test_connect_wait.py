"""``connect(wait=...)`` / ``mrc-send --wait``: a receiver that starts late is waited for.

The order is forced, not hoped for: the listener is only started after connect has been
refused at least once (seen through its debug log record), and the transfer must then succeed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time

import pytest

import mrc
from tests.conftest import free_port

HOST = "::1"


class _Refusals(logging.Handler):
    """Sets an event on connect's "trying again" record."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen = asyncio.Event()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "trying again" in record.getMessage():
            self.count += 1
            self.seen.set()


async def test_connect_waits_for_a_listener_that_starts_late() -> None:
    port = free_port(HOST)
    refusals = _Refusals()
    logger = logging.getLogger("mrc.connection")
    logger.addHandler(refusals)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    listener = None
    try:
        connecting = asyncio.create_task(mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, wait=20)))
        await asyncio.wait_for(refusals.seen.wait(), 10)
        listener = await mrc.listen(HOST, port)
        inbox = bytearray(1 << 20)
        listener.register(inbox, name="inbox")
        conn = await asyncio.wait_for(connecting, 20)
        await listener.accept(timeout=5)
        data = os.urandom(1 << 20)
        await conn.write(data, conn.remote["inbox"], offset=0)
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        assert refusals.count >= 1
        await conn.close()
    finally:
        logger.removeHandler(refusals)
        logger.setLevel(old_level)
        if listener is not None:
            await listener.close()


async def test_no_wait_fails_at_once_and_a_wait_says_how_long_it_tried() -> None:
    port = free_port(HOST)
    t0 = time.monotonic()
    with pytest.raises(mrc.MRCError, match=r"connection refused by \[::1\]:\d+ \(is mrc-recv"):
        await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4))
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    with pytest.raises(mrc.MRCError, match=r"refused .* after trying for 0.4 s"):
        await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, wait=0.4))
    assert 0.2 <= time.monotonic() - t0 < 3.0
