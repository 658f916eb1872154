"""Sending in rounds through a region of two slots: what a timed transfer does, and a transfer
larger than the region the receiver granted (a window: mrc-recv ``--discard``).

Round ``r`` fills slot ``r % 2`` and is ended by a zero-length WRITE_IMM carrying
``ROUND_IMM | r``; completions are ordered, so when the receiver sees it the round is placed.
The receiver hashes it and answers with a ``RoundDigest``, which the sender compares with what
it expects (a :class:`RoundPlan` says what). The sender writes a slot again only after that
answer, so no round is overwritten before it is checked, and while the receiver hashes one slot
the other is being filled. When the plan has no more rounds the sender lets the rounds in
flight be answered and ends as every transfer does (``conclude``: ``DONE_IMM``, then hashes
swapped).

Through a window (:func:`send_stream`), round ``r`` carries bytes ``r * slot ..`` of the
source, and both sides answer a round with the checksum of the whole stream up to its end: one
pass of the hash on each side, every round checked, and the last answer is the verdict's hash.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mrc.app.stream import Source, StreamHasher
from mrc.app.transfer import (
    IDLE_TIMEOUT,
    ROUND_IMM,
    ROUND_MASK,
    Stall,
    TransferResult,
    agreed,
    conclude,
    post_range,
    reason,
    send_source,
)
from mrc.connection import Connection
from mrc.errors import MRCError
from mrc.transport.control import ControlError
from mrc.transport.messages import Abort, MessageError, RoundDigest


@dataclass
class Posted:
    """Payload bytes handed to the QP so far: an upper bound that ``conn.bytes_acked`` (which
    counts whole packets, the short last one of a WRITE and the empty WRITE_IMMs too) is clamped
    to when progress is sampled."""

    bytes: int = 0


class RoundPlan(Protocol):
    """What :func:`send_rounds` writes, round after round, and what it expects back."""

    def more(self, sent: int) -> bool:
        """Whether to write another round after ``sent`` of them."""
        ...

    def wake(self) -> float:
        """Seconds until :meth:`more` may change its mind by itself (a deadline)."""
        ...

    def post(self, conn: Connection, r: int) -> int:
        """Post round ``r`` (its WRITEs and its ``ROUND_IMM``); the payload bytes it moves."""
        ...

    async def expected(self, r: int) -> str:
        """The checksum the receiver must answer round ``r`` with."""
        ...


async def send_rounds(
    conn: Connection,
    plan: RoundPlan,
    posted: Posted,
    stall: Stall,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[int, asyncio.Future[dict[str, object] | None]]:
    """Write the plan's rounds, two at most unanswered, and check every answer; returns how
    many rounds were sent and the receiver's next side-channel message (still to come: the
    verdict, for ``conclude``)."""
    sent = checked = 0
    peer_msg = asyncio.ensure_future(conn.recv_message())
    try:
        while True:
            ending = not plan.more(sent)
            if ending and checked == sent:
                break
            if not ending and sent - checked < 2:
                posted.bytes += plan.post(conn, sent)
                sent += 1
                continue
            wait = 0.1 if ending else min(0.1, max(plan.wake(), 0.0))
            await asyncio.wait({peer_msg}, timeout=wait)
            acked = conn.bytes_acked
            if on_progress is not None:
                on_progress(min(posted.bytes, acked))
            stall.check(acked)
            if peer_msg.done():
                await _check_round(conn, plan, checked, peer_msg.result())
                checked += 1
                peer_msg = asyncio.ensure_future(conn.recv_message())
    except ControlError as exc:
        peer_msg.cancel()
        raise MRCError(f"lost the receiver: {exc}") from None
    except BaseException:
        peer_msg.cancel()
        raise
    return sent, peer_msg


async def _check_round(
    conn: Connection, plan: RoundPlan, r: int, msg: dict[str, object] | None
) -> None:
    """The receiver's answer to round ``r``: its hash must be the one the plan expects."""
    if msg is None or msg.get("type") != "round":
        raise MRCError(f"receiver gave up: {reason(msg)}")
    try:
        got = RoundDigest.from_json(msg)
    except MessageError as exc:
        raise MRCError(f"the receiver's round hash is unreadable: {exc}") from None
    error = None
    if got.round != r & ROUND_MASK:
        error = f"the receiver answered round {got.round} where round {r} was due"
    elif got.digest != await plan.expected(r):
        error = f"{agreed(conn).label} mismatch in round {r}: data placed differs from sent"
    if error is not None:
        await conn.send_message(Abort(error).to_json())
        raise MRCError(error)


def end_round(conn: Connection, r: int, offset: int) -> None:
    """Post the zero-length WRITE_IMM that ends round ``r`` at ``offset`` of the region."""
    region = conn.requested
    assert region is not None
    conn.post_write(b"", region, offset, imm=ROUND_IMM | (r & ROUND_MASK))


class StreamRounds:
    """A source through a window of two ``slot``-byte slots: round ``r`` is its bytes
    ``r * slot ..``, answered with the checksum of the stream up to the round's end."""

    def __init__(self, source: Source, slot: int, hasher: StreamHasher) -> None:
        self.source = source
        self.slot = slot
        self.rounds = -(-source.size // slot)
        self._hasher = hasher
        self._digests: dict[int, asyncio.Task[str]] = {}

    def more(self, sent: int) -> bool:
        return sent < self.rounds

    def wake(self) -> float:
        return float("inf")

    def post(self, conn: Connection, r: int) -> int:
        start = r * self.slot
        end = min(start + self.slot, self.source.size)
        base = (r % 2) * self.slot
        post_range(conn, self.source, start, end, base)
        end_round(conn, r, base + end - start)
        self._digests[r] = self._hasher.hash_to(end)  # hashed while the round travels
        return end - start

    async def expected(self, r: int) -> str:
        self._hasher.awaiting()
        return await self._digests.pop(r)


async def send_stream(
    conn: Connection,
    source: Source,
    on_progress: Callable[[int], None] | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
    posted: Posted | None = None,
) -> TransferResult:
    """Send ``source`` whatever the size of the region the receiver granted: written whole
    into a region as large (:func:`~mrc.app.transfer.send_source`), else in rounds through it as
    a window of two slots, every round checked; then verified end to end.

    Fails when nothing is acknowledged for ``idle_timeout`` seconds."""
    posted = posted if posted is not None else Posted()
    region = conn.requested
    if region is None:
        raise MRCError("the receiver granted no region to write into")
    if region.length >= source.size:
        posted.bytes = source.size
        return await send_source(conn, source, on_progress, idle_timeout)
    slot = region.length // 2
    if slot == 0:
        raise MRCError(f"the receiver granted a region of {region.length} bytes: no window")
    hasher = StreamHasher(source, agreed(conn))
    stall = Stall(idle_timeout, "nothing acknowledged by the receiver")
    start = time.perf_counter()
    try:
        _sent, peer_msg = await send_rounds(
            conn, StreamRounds(source, slot, hasher), posted, stall, on_progress
        )
        return await conclude(conn, peer_msg, hasher.digest, source.size, start, stall, on_progress)
    finally:
        hasher.cancel()
