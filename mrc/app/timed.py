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
import mmap
import os
import time
from collections.abc import Callable

from mrc.app.checksum import Checksum
from mrc.app.rounds import Posted, end_round, send_rounds
from mrc.app.stream import CHUNK
from mrc.app.transfer import IDLE_TIMEOUT, Stall, TransferResult, agreed, conclude
from mrc.connection import Connection
from mrc.errors import MRCError

#: bytes per round (one slot; the receiver grants two)
SLOT = 4 << 20
#: rounds cycle through this many rotations of the random buffer; consecutive rounds of one
#: slot (r and r + 2) always differ
ROTATIONS = 4

__all__ = ["ROTATIONS", "SLOT", "Posted", "RoundData", "send_timed"]


class RoundData:
    """``slot`` random bytes stored twice in a row, so that every rotation of them is one
    contiguous view (sent from where it lies, no copy per round), and the checksum of each,
    worked out once per checksum (the connection agrees on one after this is made)."""

    def __init__(self, slot: int = SLOT) -> None:
        if slot < ROTATIONS:
            raise ValueError(f"a round needs at least {ROTATIONS} bytes")
        self.slot = slot
        self._buf = mmap.mmap(-1, 2 * slot)
        self._buf[:slot] = os.urandom(slot)
        self._buf[slot:] = self._buf[:slot]
        self._view = memoryview(self._buf)
        self._digests: dict[Checksum, list[str]] = {}

    def round(self, r: int) -> memoryview:
        """What round ``r`` writes into its slot."""
        start = (r % ROTATIONS) * (self.slot // ROTATIONS)
        return self._view[start : start + self.slot]

    def digest(self, r: int, check: Checksum) -> str:
        """The checksum of round ``r``'s bytes (of every rotation, the first time)."""
        digests = self._digests.get(check)
        if digests is None:
            digests = self._digests[check] = [check.of(self.round(k)) for k in range(ROTATIONS)]
        return digests[r % ROTATIONS]

    def region_digest(self, rounds: int, check: Checksum) -> str:
        """The checksum of the region once ``rounds`` rounds are placed: each slot holds the
        last round written into it, or the zeros it was granted with."""
        h = check.new()
        for slot in (0, 1):
            # the last round of this parity: rounds - 1 or rounds - 2 (negative: none yet)
            last = rounds - 1 if (rounds - 1) % 2 == slot else rounds - 2
            h.update(self.round(last) if last >= 0 else bytes(self.slot))
        return h.hexdigest()


class _TimedRounds:
    """Rounds of ``data`` until ``deadline`` (at least one), each answered with its slot's
    hash: the hash of the rotation it wrote."""

    def __init__(self, data: RoundData, deadline: float, check: Checksum) -> None:
        self.data = data
        self.deadline = deadline
        self.check = check

    def more(self, sent: int) -> bool:
        return sent == 0 or time.perf_counter() < self.deadline

    def wake(self) -> float:
        return self.deadline - time.perf_counter()

    def post(self, conn: Connection, r: int) -> int:
        region = conn.requested
        assert region is not None
        view = self.data.round(r)
        base = (r % 2) * self.data.slot
        for off in range(0, self.data.slot, CHUNK):
            conn.post_write(view[off : off + CHUNK], region, base + off)
        end_round(conn, r, base + self.data.slot)
        return self.data.slot

    async def expected(self, r: int) -> str:
        return await asyncio.to_thread(self.data.digest, r, self.check)


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
    check = agreed(conn)
    plan = _TimedRounds(data, start + seconds, check)
    sent, peer_msg = await send_rounds(conn, plan, posted, stall, on_progress)
    return await conclude(
        conn,
        peer_msg,
        lambda: asyncio.to_thread(data.region_digest, sent, check),
        sent * data.slot,
        start,
        stall,
        on_progress=on_progress,
    )
