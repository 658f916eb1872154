"""A sender whose host stops running it for a while (a busy machine, a preempted VM) must not
call its whole window lost: the ACKs that arrived meanwhile wait in its sockets, and are read
before any retransmission timer is judged, on asyncio's loop and on uvloop alike.

The stall is the condition under test: the sender's event loop is blocked for several RTOs,
once, mid-transfer, while a real receiver (mrc-recv, another process) keeps acknowledging.
(Checked while chasing 236 timeouts in a fabric test: those were the sender's own NIC queue
dropping packets, tests/fabric/test_window_law.py; this is the cause it was not.)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

import mrc
from mrc.transfer import TransferResult, send_buffer

SIZE = 24 << 20
STALL = 0.4  # seconds the sender's host does not run it: 8 x min_rto


def _loops() -> list[Any]:
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


@pytest.mark.parametrize("loop_factory", _loops())
def test_a_stalled_sender_reads_its_acks_before_it_times_anything_out(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], mrc_tools: Any, mrc_port: int
) -> None:
    data = os.urandom(SIZE)
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--json", "--discard")
    recv.wait_listening(mrc_port)
    stalled: list[int] = []

    def stall_once(acked: int) -> None:
        if not stalled and acked >= SIZE // 4:
            stalled.append(acked)
            time.sleep(STALL)  # the host runs something else; the loop cannot run

    async def send() -> tuple[TransferResult, dict[str, int]]:
        conn = await mrc.connect(
            "::1", mrc_port, evs=32, request_size=SIZE, config=mrc.QPConfig(cc="fixed")
        )
        try:
            sent = await send_buffer(conn, memoryview(data), stall_once)
            return sent, conn.counters()
        finally:
            await conn.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        sent, counters = runner.run(send())
    got = recv.wait(30).json
    assert stalled and stalled[0] < SIZE, "the transfer ended before the stall"
    digest = hashlib.sha256(data).hexdigest()
    assert sent.ok and sent.sha256 == sent.peer_sha256 == got["sha256"] == digest, sent.error
    # whatever was in flight was acknowledged during the stall: nothing timed out, no EV blamed
    assert counters["retransmits_timeout"] == 0, counters
    assert counters["evs_assumed_bad"] == 0, counters
