"""Whole-buffer transfers with end-to-end verification, as mrc-send / mrc-recv run them.

The sender asks the receiver for a region of the transfer's size, WRITEs the data into it in
chunks, then posts a zero-length WRITE_IMM carrying ``DONE_IMM``. Completions are ordered, so
when the receiver sees that immediate every byte before it is placed. Each side then hashes
its buffer (SHA-256) and the two hashes are swapped over the side channel: both sides know
whether what was placed is what was sent, and both exit non-zero if not.

A timed transfer (mrc/timed.py, ``mrc-send --time``) asks for a region of two equal slots and
writes round after round into them, each round ended by a zero-length WRITE_IMM carrying
``ROUND_IMM | round``; the receiver hashes the slot of every such round and answers with a
``RoundDigest`` the sender checks. Its ``DONE_IMM`` and verdict then cover the region as the
last two rounds left it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mrc.connection import Connection
from mrc.errors import MRCError
from mrc.transport.control import ControlError
from mrc.transport.messages import Abort, Done, MessageError, Result, RoundDigest, StatValue

DONE_IMM = 0x4D524321  # "MRC!"
#: a timed transfer's end of round ``r``: ``ROUND_IMM | (r mod 2^24)`` ("R" in the top byte)
ROUND_IMM = 0x52000000
ROUND_MASK = 0xFFFFFF
CHUNK = 16 << 20
RESULT_TIMEOUT = 30.0
#: default for both sides: fail a transfer on which nothing moved for this long (a peer stopped
#: with SIGSTOP keeps its TCP connection open, so only the data path can tell)
IDLE_TIMEOUT = 30.0


class Stall:
    """Fails a transfer whose progress counter has not moved for ``limit`` seconds."""

    def __init__(self, limit: float, what: str) -> None:
        self.limit = limit
        self.what = what
        self.last = -1
        self.since = time.monotonic()

    def check(self, progress: int) -> None:
        now = time.monotonic()
        if progress != self.last:
            self.last, self.since = progress, now
        elif now - self.since > self.limit:
            raise MRCError(f"{self.what} for {self.limit:g} s; giving up")


def sha256_of(view: memoryview) -> str:
    """SHA-256 in slices (hashlib releases the GIL for each, so this runs beside the loop)."""
    h = hashlib.sha256()
    for off in range(0, len(view), CHUNK):
        h.update(view[off : off + CHUNK])
    return h.hexdigest()


@dataclass
class TransferResult:
    ok: bool
    bytes: int
    seconds: float
    sha256: str
    peer_sha256: str | None
    error: str | None = None
    peer_stats: Mapping[str, StatValue] = field(default_factory=dict)

    @property
    def goodput_bps(self) -> float:
        return self.bytes * 8 / self.seconds if self.seconds > 0 else 0.0


async def send_buffer(
    conn: Connection,
    data: memoryview,
    on_progress: Callable[[int], None] | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
) -> TransferResult:
    """Write ``data`` into the region the receiver granted, then verify with the receiver.

    Fails when nothing is acknowledged for ``idle_timeout`` seconds."""
    region = conn.requested
    if region is None or region.length < len(data):
        raise MRCError("the receiver did not grant a region large enough for the transfer")
    n = len(data)
    start = time.perf_counter()
    for off in range(0, n, CHUNK):
        conn.post_write(data[off : off + CHUNK], region, off)
    peer_msg = asyncio.ensure_future(conn.recv_message())
    stall = Stall(idle_timeout, "nothing acknowledged by the receiver")
    return await conclude(
        conn, peer_msg, lambda: sha256_of(data), n, start, stall, on_progress=on_progress
    )


async def conclude(
    conn: Connection,
    peer_msg: asyncio.Future[dict[str, object] | None],
    digest_of: Callable[[], str],
    n: int,
    start: float,
    stall: Stall,
    on_progress: Callable[[int], None] | None = None,
) -> TransferResult:
    """The sender's end of every transfer, once its data WRITEs are posted: the ``DONE_IMM``
    WRITE_IMM after them, the receiver watched meanwhile (``peer_msg``: its next side-channel
    message, anything before the verdict means it gave up), then ``digest_of()`` (the SHA-256
    the receiver's region must have, computed off the event loop) swapped for its verdict.
    ``n``: the payload bytes the transfer moved."""
    region = conn.requested
    assert region is not None
    done = conn.post_write(b"", region, region.length, imm=DONE_IMM)
    either: set[asyncio.Future[Any]] = {done, peer_msg}
    try:
        while not done.done():
            await asyncio.wait(either, timeout=0.1, return_when="FIRST_COMPLETED")
            acked = conn.bytes_acked
            if on_progress is not None:
                on_progress(min(n, acked))
            if not done.done():
                stall.check(acked)
            if peer_msg.done() and not done.done():
                raise MRCError(f"receiver gave up: {reason(peer_msg.result())}")
        try:
            done.result()
        except ConnectionError as exc:
            raise MRCError(str(exc)) from None
        seconds = time.perf_counter() - start
        # hashed after the data is placed, while the receiver hashes too: hashing during the
        # transfer would steal a core from the two endpoints on small machines
        digest = await asyncio.to_thread(digest_of)
        await conn.send_message(Done(digest, n).to_json())
        reply = await asyncio.wait_for(peer_msg, RESULT_TIMEOUT)
    except (ControlError, TimeoutError) as exc:
        raise MRCError(f"no verdict from the receiver: {exc or 'timed out'}") from None
    finally:
        if not peer_msg.done():
            peer_msg.cancel()
    if on_progress is not None:
        on_progress(n)
    if reply is None:
        raise MRCError("the receiver closed the connection without a verdict")
    try:
        verdict = Result.from_json(reply)
    except MessageError as exc:
        raise MRCError(f"the receiver's verdict is unreadable: {exc}") from None
    match = verdict.sha256 == digest
    if not match:
        error: str | None = "SHA-256 mismatch: data placed differs from sent"
    elif not verdict.ok:
        error = f"the receiver failed the transfer: {verdict.error or 'no reason given'}"
    else:
        error = None
    return TransferResult(
        ok=error is None,
        bytes=n,
        seconds=seconds,
        sha256=digest,
        peer_sha256=verdict.sha256,
        error=error,
        peer_stats=verdict.stats,
    )


def reason(msg: dict[str, object] | None) -> str:
    """Why a peer that spoke (or hung up) before the transfer completed gave up."""
    if msg is None:
        return "closed the connection"
    try:
        return Abort.from_json(msg).error
    except MessageError:
        return "sent an unexpected message"


async def receive_buffer(
    conn: Connection,
    view: memoryview,
    on_progress: Callable[[int], None] | None = None,
    commit: Callable[[], None] | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
) -> TransferResult:
    """Wait for the sender's DONE_IMM, hash what was placed, and swap verdicts.

    ``commit()`` runs once the hashes match and before the verdict is sent (mrc-recv renames
    its output file there): if it raises :class:`MRCError` the verdict says so and the transfer
    fails on both sides. Fails when nothing is placed for ``idle_timeout`` seconds (before the
    first packet too: a sender that connects and never sends does not hold the receiver)."""
    start = time.perf_counter()
    n = len(view)
    imm = asyncio.ensure_future(_wait_done(conn, view))
    msg = asyncio.ensure_future(conn.recv_message())
    either: set[asyncio.Future[Any]] = {imm, msg}
    stall = Stall(idle_timeout, "no data from the sender")
    try:
        while not imm.done():
            await asyncio.wait(either, timeout=0.1, return_when="FIRST_COMPLETED")
            placed = conn.bytes_placed
            if on_progress is not None:
                on_progress(min(n, placed))
            if not imm.done() and not msg.done():
                stall.check(placed)
            if msg.done() and not imm.done():
                early = msg.result()
                if early is None:
                    raise MRCError("sender went away before the transfer completed")
                if early.get("type") != "done":
                    raise MRCError(f"sender gave up: {reason(early)}")
                # the sender saw its WRITE_IMM acknowledged: the completion is imminent
                await asyncio.wait_for(asyncio.shield(imm), 5.0)
        imm.result()
        seconds = time.perf_counter() - start
        if conn.granted is not None:  # what is hashed is what stays: nothing lands after
            conn.close_region(conn.granted)
        digest = await asyncio.to_thread(sha256_of, view)
        done = await asyncio.wait_for(msg, RESULT_TIMEOUT)
    except (ControlError, TimeoutError) as exc:
        raise MRCError(f"sender did not finish: {exc or 'timed out'}") from None
    finally:
        for task in (imm, msg):
            if not task.done():
                task.cancel()
    if done is None:
        raise MRCError("sender went away before sending its checksum")
    try:
        peer_sha = Done.from_json(done).sha256
    except MessageError as exc:
        raise MRCError(f"the sender's checksum is unreadable: {exc}") from None
    error = None if peer_sha == digest else "SHA-256 mismatch: data placed differs from sent"
    kept_error = None
    if error is None and commit is not None:
        try:
            commit()
        except MRCError as exc:
            error = kept_error = str(exc)
    with contextlib.suppress(ControlError):
        verdict = Result(error is None, digest, _stats(conn), kept_error)
        await conn.send_message(verdict.to_json())
    if on_progress is not None:
        on_progress(n)
    rounds = imm.result()
    return TransferResult(
        ok=error is None,
        # a timed transfer moved its rounds (each one slot, hashed here); others the region
        bytes=rounds * (n // 2) if rounds else n,
        seconds=seconds,
        sha256=digest,
        peer_sha256=peer_sha,
        error=error,
    )


def _stats(conn: Connection) -> dict[str, StatValue]:
    """The receiver's counters as the verdict carries them (numbers and drop counts)."""
    out: dict[str, StatValue] = {}
    for key, value in conn.stats().items():
        if isinstance(value, dict):
            out[key] = {str(k): v for k, v in value.items() if isinstance(v, int | float)}
        elif value is None or isinstance(value, int | float | str):
            out[key] = value
    return out


async def _wait_done(conn: Connection, view: memoryview) -> int:
    """Wait for ``DONE_IMM``, answering every round of a timed transfer on the way with the
    hash of its slot (the sender writes that slot again only after the answer); returns how
    many rounds there were (0: not a timed transfer)."""
    rounds = 0
    while True:
        imm = await conn.next_immediate()
        if imm == DONE_IMM:
            return rounds
        if imm & ~ROUND_MASK != ROUND_IMM:
            continue
        number = imm & ROUND_MASK
        if number != rounds & ROUND_MASK:
            raise MRCError(f"round {number} ended where round {rounds & ROUND_MASK} was due")
        slot = len(view) // 2
        if slot == 0 or len(view) % 2:
            raise MRCError(f"a timed transfer needs two equal slots, not {len(view)} bytes")
        part = view[(rounds % 2) * slot : (rounds % 2 + 1) * slot]
        digest = await asyncio.to_thread(sha256_of, part)
        await conn.send_message(RoundDigest(number, digest).to_json())
        rounds += 1
