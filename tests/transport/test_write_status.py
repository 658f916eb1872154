"""Per-request write completions over real sockets: a write that will not complete raises a
WriteError whose status says how it ended, and the writes pending beside it are flushed."""

from __future__ import annotations

import asyncio

import pytest
from transport.test_side_channel import HOST, listening

import mrc
from mrc.core import QPConfig
from mrc.errors import WriteError


async def test_a_write_into_a_region_gone_runs_out_of_retries_and_the_next_is_flushed() -> None:
    cfg = QPConfig(max_timeout_retries=2, initial_rto=0.02, min_rto=0.02, max_rto=0.05)
    async with listening() as listener:
        conn = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=400_000, qp=cfg)
        )
        async with conn:
            peer = await listener.accept(timeout=5)
            assert conn.requested is not None and peer.granted is not None
            await conn.write(bytes(100_000), conn.requested)  # the region works
            # the receiver deregisters it: what arrives for its rkey is dropped unanswered
            peer.deregister(peer.granted)
            first = conn.post_write(bytes(100_000), conn.requested)
            second = conn.post_write(bytes(100_000), conn.requested, 100_000)
            with pytest.raises(WriteError) as failed:
                await asyncio.wait_for(first, 10)
            assert failed.value.status == "retry exceeded"
            assert "retry budget exhausted" in str(failed.value)
            with pytest.raises(WriteError) as flushed:
                await second
            assert flushed.value.status == "flushed"
            assert str(flushed.value) == str(failed.value)  # one QP failure, said once
            with pytest.raises(mrc.MRCError):  # and the QP takes no more work
                conn.post_write(b"x", conn.requested)
