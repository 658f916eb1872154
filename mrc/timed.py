"""Timed transfers (``mrc-send --time``): send for a duration instead of a size, verified.

The receiver only ever grants a region of the size asked for in the hello, so a transfer of
unknown length loops over a fixed one: the sender asks for two slots of ``slot`` bytes and
writes *round* after round into them, round ``r`` into slot ``r % 2``, each ended by a
zero-length WRITE_IMM carrying ``ROUND_IMM | r``. Completions are ordered, so when the receiver
sees that immediate the round is placed; it hashes the slot and answers with a
``RoundDigest``, which the sender compares with the hash of what it wrote. The sender writes a
slot again only after that answer, so no round is overwritten before it is checked, and while
the receiver hashes one slot the other is being filled. When the time is up the sender lets
the rounds in flight be answered and ends as every transfer does (``conclude``: ``DONE_IMM``,
then the hashes of the whole region, as the last two rounds left it, swapped).

Each round is a different rotation of one random buffer (``ROTATIONS`` of them, cycling), so a
packet of an older round placed in a newer one's slot changes its hash: every round is checked
on its own, not only the last. The rotations' hashes are computed once, before the clock starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from mrc.connection import Connection
from mrc.errors import MRCError
from mrc.transfer import (
    CHUNK,
    IDLE_TIMEOUT,
    ROUND_IMM,
    ROUND_MASK,
    Stall,
    TransferResult,
    conclude,
    reason,
    sha256_of,
)
from mrc.transport.control import ControlError
from mrc.transport.messages import Abort, MessageError, RoundDigest

#: bytes per round (one slot; the receiver grants two)
SLOT = 4 << 20
#: rounds cycle through this many rotations of the random buffer; consecutive rounds of one
#: slot (r and r + 2) always differ
ROTATIONS = 4


class RoundData:
    """``slot`` random bytes stored twice in a row, so that every rotation of them is one
    contiguous view (sent from where it lies, no copy per round), and the hash of each."""

    def __init__(self, slot: int = SLOT) -> None:
        if slot < ROTATIONS:
            raise ValueError(f"a round needs at least {ROTATIONS} bytes")
        self.slot = slot
        self._buf = mmap.mmap(-1, 2 * slot)
        self._buf[:slot] = os.urandom(slot)
        self._buf[slot:] = self._buf[:slot]
        self._view = memoryview(self._buf)
        self.digests = [sha256_of(self.round(k)) for k in range(ROTATIONS)]

    def round(self, r: int) -> memoryview:
        """What round ``r`` writes into its slot."""
        start = (r % ROTATIONS) * (self.slot // ROTATIONS)
        return self._view[start : start + self.slot]

    def region_digest(self, rounds: int) -> str:
        """SHA-256 of the region once ``rounds`` rounds are placed: each slot holds the last
        round written into it, or the zeros it was granted with."""
        h = hashlib.sha256()
        for slot in (0, 1):
            # the last round of this parity: rounds - 1 or rounds - 2 (negative: none yet)
            last = rounds - 1 if (rounds - 1) % 2 == slot else rounds - 2
            h.update(self.round(last) if last >= 0 else bytes(self.slot))
        return h.hexdigest()


@dataclass
class Posted:
    """Payload bytes handed to the QP so far: an upper bound that ``conn.bytes_acked`` (which
    counts whole packets, the short last one of a WRITE and the empty WRITE_IMMs too) is clamped
    to when progress is sampled."""

    bytes: int = 0


async def send_timed(
    conn: Connection,
    data: RoundData,
    seconds: float,
    posted: Posted | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
    on_progress: Callable[[int], None] | None = None,
) -> TransferResult:
    """Write rounds of ``data`` into the region the receiver granted for ``seconds`` (at
    least one round), each verified by the receiver's hash of it, then verify the region."""
    region = conn.requested
    if region is None or region.length < 2 * data.slot:
        raise MRCError("the receiver did not grant a region large enough for two rounds")
    posted = posted if posted is not None else Posted()
    stall = Stall(idle_timeout, "nothing acknowledged by the receiver")
    start = time.perf_counter()
    deadline = start + seconds
    sent = checked = 0
    peer_msg = asyncio.ensure_future(conn.recv_message())
    try:
        while True:
            ending = sent > 0 and time.perf_counter() >= deadline
            if ending and checked == sent:
                break
            if not ending and sent - checked < 2:
                _post_round(conn, data, sent)
                sent += 1
                posted.bytes += data.slot
                continue
            wait = 0.1 if ending else min(0.1, max(deadline - time.perf_counter(), 0.0))
            await asyncio.wait({peer_msg}, timeout=wait)
            acked = conn.bytes_acked
            if on_progress is not None:
                on_progress(min(posted.bytes, acked))
            stall.check(acked)
            if peer_msg.done():
                await _check_round(conn, data, checked, peer_msg.result())
                checked += 1
                peer_msg = asyncio.ensure_future(conn.recv_message())
    except ControlError as exc:
        peer_msg.cancel()
        raise MRCError(f"lost the receiver: {exc}") from None
    except BaseException:
        peer_msg.cancel()
        raise
    return await conclude(
        conn,
        peer_msg,
        lambda: data.region_digest(sent),
        sent * data.slot,
        start,
        stall,
        on_progress=on_progress,
    )


def _post_round(conn: Connection, data: RoundData, r: int) -> None:
    region = conn.requested
    assert region is not None
    view = data.round(r)
    base = (r % 2) * data.slot
    for off in range(0, data.slot, CHUNK):
        conn.post_write(view[off : off + CHUNK], region, base + off)
    conn.post_write(b"", region, base + data.slot, imm=ROUND_IMM | (r & ROUND_MASK))


async def _check_round(
    conn: Connection, data: RoundData, r: int, msg: dict[str, object] | None
) -> None:
    """The receiver's answer to round ``r``: its hash must be the one of what we wrote."""
    if msg is None or msg.get("type") != "round":
        raise MRCError(f"receiver gave up: {reason(msg)}")
    try:
        got = RoundDigest.from_json(msg)
    except MessageError as exc:
        raise MRCError(f"the receiver's round hash is unreadable: {exc}") from None
    error = None
    if got.round != r & ROUND_MASK:
        error = f"the receiver answered round {got.round} where round {r} was due"
    elif got.sha256 != data.digests[r % ROTATIONS]:
        error = f"SHA-256 mismatch in round {r}: data placed differs from sent"
    if error is not None:
        await conn.send_message(Abort(error).to_json())
        raise MRCError(error)
