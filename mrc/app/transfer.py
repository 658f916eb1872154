"""Whole-buffer transfers with end-to-end verification, as mrc-send / mrc-recv run them.

The sender asks the receiver for a region of the transfer's size, WRITEs the data into it in
chunks, then posts a zero-length WRITE_IMM carrying ``DONE_IMM``. Completions are ordered, so
when the receiver sees that immediate every byte before it is placed. Each side then hashes
its buffer with the checksum the connection agreed on at set-up (``Connection.checksum``:
BLAKE3 by default, keyed with a key; mrc.app.checksum) and the two digests are swapped over the
side channel: both sides know whether what was placed is what was sent, and both exit
non-zero if not.

So that the verdict comes as the last byte does, not a whole-region hash later, the sender
also posts a zero-length WRITE_IMM carrying ``MARK_IMM | m`` after the WRITEs of every
:data:`~mrc.app.checksum.STEP` or so bytes: the first ``m`` MiB of the region are written.
Completions are ordered, so when the receiver sees it those bytes are placed; it freezes the
region below them (nothing new is placed there any more, whoever writes: what is hashed is
what is kept) and hashes them in a worker thread while the rest arrives. At ``DONE_IMM`` it
closes the region and hashes only the tail. A receiver that ignores the marks (older ones do)
hashes everything at the end.

A timed transfer (mrc/app/timed.py, ``mrc-send --time``) asks for a region of two equal slots and
writes round after round into them, each round ended by a zero-length WRITE_IMM carrying
``ROUND_IMM | round``; the receiver hashes the slot of every such round and answers with a
``RoundDigest`` the sender checks. Its ``DONE_IMM`` and verdict then cover the region as the
last two rounds left it.

A transfer larger than the region the receiver granted (mrc-recv ``--discard`` grants a window
of two slots) goes through it the same way (mrc/app/rounds.py): the receiver hashes each round as
it lands, keeping the checksum of the whole stream so far, and answers with that; the verdict
is the checksum of everything sent. Neither side ever holds more than its window (or, sending, the
source's own memory: a mapped file, or a generated stream of bounded size, mrc/app/stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mrc.app.checksum import STEP, Checksum, PrefixHasher
from mrc.app.stream import CHUNK, BufferSource, Source, StreamHasher
from mrc.connection import Connection
from mrc.errors import MRCError
from mrc.transport.control import ControlError
from mrc.transport.messages import Abort, Done, MessageError, Result, RoundDigest, StatValue

DONE_IMM = 0x4D524321  # "MRC!"
#: a timed transfer's end of round ``r``: ``ROUND_IMM | (r mod 2^24)`` ("R" in the top byte)
ROUND_IMM = 0x52000000
ROUND_MASK = 0xFFFFFF
#: ``MARK_IMM | m`` ("P" in the top byte): the first ``m`` x :data:`MARK_UNIT` bytes of the
#: region are written and final (the receiver hashes them before the transfer ends)
MARK_IMM = 0x50000000
MARK_UNIT = 1 << 20
RESULT_TIMEOUT = 30.0
#: how long the receiver waits for the DONE_IMM once the sender said its checksum (the
#: sender saw the WRITE_IMM acknowledged, so the completion is a round trip away at most)
DONE_GRACE = 5.0
#: default for both sides: fail a transfer on which nothing moved for this long (a peer stopped
#: with SIGSTOP keeps its TCP connection open, so only the data path can tell)
IDLE_TIMEOUT = 30.0

log = logging.getLogger(__name__)


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


def agreed(conn: Connection) -> Checksum:
    """The checksum ``conn``'s transfers are verified with (agreed at set-up)."""
    return Checksum.agreed(conn.checksum, conn.checksum_key)


@dataclass
class TransferResult:
    """How a transfer ended: ``digest`` is this side's, under ``checksum`` (its name,
    mrc.app.checksum), ``peer_digest`` the other side's."""

    ok: bool
    bytes: int
    seconds: float
    digest: str
    peer_digest: str | None
    error: str | None = None
    peer_stats: Mapping[str, StatValue] = field(default_factory=dict)
    checksum: str = "sha256"
    #: receiver: bytes of the region its sender had marked written, frozen and handed to the
    #: hash worker before the DONE_IMM: hashed while the data came (the rest after it)
    hashed_early: int = 0

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
    return await send_source(conn, BufferSource(data), on_progress, idle_timeout)


async def send_source(
    conn: Connection,
    source: Source,
    on_progress: Callable[[int], None] | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
) -> TransferResult:
    """Write ``source`` into the region the receiver granted (at least as large), hashing it
    as the receiver acknowledges it, then verify with the receiver.

    Fails when nothing is acknowledged for ``idle_timeout`` seconds."""
    region = conn.requested
    n = source.size
    if region is None or region.length < n:
        raise MRCError("the receiver did not grant a region large enough for the transfer")
    start = time.perf_counter()
    post_marked(conn, source, n)
    hasher = StreamHasher(source, agreed(conn))
    peer_msg = asyncio.ensure_future(conn.recv_message())
    stall = Stall(idle_timeout, "nothing acknowledged by the receiver")
    try:
        return await conclude(
            conn, peer_msg, hasher.digest, n, start, stall, on_progress, follow=hasher.follow
        )
    finally:
        hasher.cancel()


def post_range(conn: Connection, source: Source, start: int, end: int, offset: int) -> None:
    """Post WRITEs of bytes ``start..end`` of ``source`` to the requested region from
    ``offset`` on, in WRITEs of at most ``CHUNK`` bytes."""
    region = conn.requested
    assert region is not None
    for piece in source.pieces(start, end):
        for off in range(0, len(piece), CHUNK):
            part = piece[off : off + CHUNK]
            conn.post_write(part, region, offset)
            offset += len(part)


def post_marked(conn: Connection, source: Source, n: int) -> None:
    """Post WRITEs of all ``n`` bytes of ``source`` to the start of the requested region, with
    a ``MARK_IMM`` after those of every :func:`mark_spacing` bytes (none after the last: the
    ``DONE_IMM`` says that much)."""
    spacing = mark_spacing(n, conn.imm_room)
    region = conn.requested
    assert region is not None
    start = 0
    while start < n:
        end = min(start + spacing, n) if spacing else n
        post_range(conn, source, start, end, start)
        if end < n:
            conn.post_write(b"", region, end, imm=MARK_IMM | end // MARK_UNIT)
        start = end


def mark_spacing(n: int, room: int) -> int:
    """Bytes between two marks of a transfer of ``n`` bytes: a hash step, or as many as keep
    the marks within the ``room`` WRITE_IMMs that may be outstanding (one is the DONE_IMM's),
    and a whole number of MARK_UNITs below ``MARK_UNIT << 24``; 0: no marks."""
    wanted = (n - 1) // STEP  # marks at every step's end before the last byte
    budget = room - 1
    if wanted <= 0 or budget <= 0:
        return 0
    spacing = STEP * -(-wanted // budget)
    return spacing if n - 1 < (ROUND_MASK + 1) * MARK_UNIT else 0


async def conclude(
    conn: Connection,
    peer_msg: asyncio.Future[dict[str, object] | None],
    digest_of: Callable[[], Awaitable[str]],
    n: int,
    start: float,
    stall: Stall,
    on_progress: Callable[[int], None] | None = None,
    follow: Callable[[int], None] | None = None,
) -> TransferResult:
    """The sender's end of every transfer, once its data WRITEs are posted: the ``DONE_IMM``
    WRITE_IMM after them, the receiver watched meanwhile (``peer_msg``: its next side-channel
    message, anything before the verdict means it gave up), then ``await digest_of()`` (the
    checksum of what the receiver must have, computed off the event loop) swapped for its
    verdict. ``n``: the payload bytes the transfer moved; ``follow(acked)``: told the bytes
    acknowledged so far while the WRITEs complete (a hasher paces itself with it)."""
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
            if follow is not None:
                follow(acked)
            if not done.done():
                stall.check(acked)
            if peer_msg.done() and not done.done():
                raise MRCError(f"receiver gave up: {reason(peer_msg.result())}")
        done.result()  # a write that failed raises its WriteError (an MRCError) here
        seconds = time.perf_counter() - start
        digest = await digest_of()
        await conn.send_message(Done(digest, n).to_json())
        reply = await asyncio.wait_for(peer_msg, RESULT_TIMEOUT)
    except (ControlError, TimeoutError) as exc:
        # a TimeoutError says nothing of itself (its str is empty)
        why = str(exc) or f"none within {RESULT_TIMEOUT:g} s of the last byte"
        raise MRCError(f"no verdict from the receiver: {why}") from None
    finally:
        if not peer_msg.done():
            peer_msg.cancel()
    if on_progress is not None:
        on_progress(n)
    if reply is None:
        raise MRCError("the receiver closed the connection without a verdict")
    if reply.get("type") != "result":
        # the receiver gave up instead (an Abort names why), or said something else
        raise MRCError(f"the receiver gave up: {reason(reply)}")
    try:
        verdict = Result.from_json(reply)
    except MessageError as exc:
        raise MRCError(f"the receiver's verdict is unreadable: {exc}") from None
    check = agreed(conn)
    match = verdict.digest == digest
    if not match:
        error: str | None = f"{check.label} mismatch: data placed differs from sent"
    elif not verdict.ok:
        error = f"the receiver failed the transfer: {verdict.error or 'no reason given'}"
    else:
        error = None
    return TransferResult(
        ok=error is None,
        bytes=n,
        seconds=seconds,
        digest=digest,
        peer_digest=verdict.digest,
        error=error,
        peer_stats=verdict.stats,
        checksum=check.name,
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
    size: int | None = None,
) -> TransferResult:
    """Wait for the sender's DONE_IMM, hash what was placed, and swap verdicts.

    ``size``: the bytes the sender sends (default: what it asked for, else ``len(view)``);
    larger than ``view``, they come through it as a window, in rounds hashed as they land.
    The granted region is closed before its bytes are hashed: nothing lands after the hash.
    What the sender marks written before (``MARK_IMM``) is frozen and hashed as it comes,
    so at the DONE_IMM only the tail is left to hash.
    ``commit()`` runs once the hashes match and before the verdict is sent (mrc-recv renames
    its output file there): if it raises :class:`MRCError` the verdict says so and the transfer
    fails on both sides. Fails when nothing is placed for ``idle_timeout`` seconds (before the
    first packet too: a sender that connects and never sends does not hold the receiver)."""
    start = time.perf_counter()
    if size is None:
        size = conn.requested_size if conn.requested_size is not None else len(view)
    check = agreed(conn)
    hashes: _Hashes
    if size > len(view):
        hashes = _Stream(view, size, check)
    else:
        hashes = _Slots(view, check, _freezer(conn, view))
    n = size
    imm = asyncio.ensure_future(_wait_done(conn, hashes))
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
                # the sender saw its WRITE_IMM acknowledged: the completion is imminent,
                # unless acknowledgements we never sent told it so (forged, without a key)
                try:
                    await asyncio.wait_for(asyncio.shield(imm), DONE_GRACE)
                except TimeoutError:
                    raise MRCError(
                        f"the sender says all {n} bytes were acknowledged, but only "
                        f"{conn.bytes_placed} arrived here and no WRITE_IMM completed: it was "
                        "told so by acknowledgements this receiver did not send (forged? "
                        "a key, --key-file, makes ACKs unforgeable)"
                    ) from None
        rounds = imm.result()
        last = time.perf_counter()
        seconds = last - start
        hashed_early, hashed = hashes.early, hashes.hashed
        if conn.granted is not None:  # what is hashed is what stays: nothing lands after
            conn.close_region(conn.granted)
        digest = await hashes.final(rounds)
        log.debug(
            "%d bytes hashed while they came (%d of them done at the last byte), "
            "the checksum %.3f s after the last byte",
            hashed_early,
            hashed,
            time.perf_counter() - last,
        )
        done = await asyncio.wait_for(msg, RESULT_TIMEOUT)
    except (ControlError, TimeoutError) as exc:
        # a TimeoutError says nothing of itself: never an empty reason
        why = str(exc) or f"no checksum within {RESULT_TIMEOUT:g} s of the last byte"
        raise MRCError(f"sender did not finish: {why}") from None
    finally:
        for task in (imm, msg):
            if not task.done():
                task.cancel()
        # no hash step may still read the buffer once the caller lets go of it
        await hashes.aclose()
    if done is None:
        raise MRCError("sender went away before sending its checksum")
    try:
        peer_digest = Done.from_json(done).digest
    except MessageError as exc:
        raise MRCError(f"the sender's checksum is unreadable: {exc}") from None
    mismatch = f"{check.label} mismatch: data placed differs from sent"
    error = None if peer_digest == digest else mismatch
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
    return TransferResult(
        ok=error is None,
        bytes=hashes.moved(rounds),
        seconds=seconds,
        digest=digest,
        peer_digest=peer_digest,
        error=error,
        checksum=check.name,
        hashed_early=hashed_early,
    )


def _freezer(conn: Connection, view: memoryview) -> Callable[[int], None] | None:
    """How to freeze the first bytes of ``view``: those of the granted region, if ``view`` is
    its memory (a prefix of ``granted.view``, as mrc-recv passes it); None if nothing can
    be, so nothing is hashed before the region is closed."""
    granted = conn.granted
    if granted is None or view.obj is not granted.view.obj or len(view) > granted.length:
        return None
    return lambda upto: conn.freeze_region(granted, upto)


def _stats(conn: Connection) -> dict[str, StatValue]:
    """The receiver's counters as the verdict carries them (numbers and drop counts)."""
    out: dict[str, StatValue] = {}
    for key, value in conn.stats().items():
        if isinstance(value, dict):
            out[key] = {str(k): v for k, v in value.items() if isinstance(v, int | float)}
        elif value is None or isinstance(value, int | float | str):
            out[key] = value
    return out


class _Hashes(Protocol):
    """What the receiver hashes: what the sender marks final as it comes, each round as it
    lands, and at the end."""

    @property
    def early(self) -> int:
        """Bytes handed to the hash worker before the end (frozen as marked)."""
        ...

    @property
    def hashed(self) -> int:
        """Bytes of them hashed so far."""
        ...

    def mark(self, upto: int) -> None: ...

    async def round(self, r: int) -> str: ...

    async def final(self, rounds: int) -> str: ...

    def moved(self, rounds: int) -> int: ...

    async def aclose(self) -> None:
        """Stop hashing and wait for the step running (the transfer ended, or failed)."""
        ...


class _Slots:
    """The region is the transfer: hashed as the sender marks its bytes written (``freeze``:
    nothing new is placed below a point from then on; None: nothing can be frozen, so
    nothing is hashed before the end) and the tail at the end; if the sender writes rounds
    (a timed transfer) each slot too, as its round lands, and the whole region at the end."""

    def __init__(
        self, view: memoryview, check: Checksum, freeze: Callable[[int], None] | None
    ) -> None:
        self.view = view
        self.check = check
        self.length = len(view)  # (the caller may release the view once it is hashed)
        self.slot = self.length // 2
        self._freeze = freeze
        self._prefix = PrefixHasher(view, check.new())
        self._rounds = False  # rounds rewrite the slots: nothing is final before the end
        self._running: PrefixHasher | None = None  # a round's hash, or the whole region's

    @property
    def early(self) -> int:
        return self._prefix.end

    @property
    def hashed(self) -> int:
        return self._prefix.hashed

    def mark(self, upto: int) -> None:
        if self._freeze is None or self._rounds:
            return
        upto = min(upto, self.length)
        if upto > self._prefix.end:
            self._freeze(upto)  # nothing new lands below from now on...
            self._prefix.advance(upto)  # ...so what lies there can be hashed now

    async def round(self, r: int) -> str:
        if self.slot == 0 or self.length % 2:
            raise MRCError(f"a timed transfer needs two equal slots, not {self.length} bytes")
        self._rounds = True  # rounds rewrite the slots: marks mean nothing, no early hash
        await self._prefix.aclose()
        with self.view[(r % 2) * self.slot : (r % 2 + 1) * self.slot] as part:
            return await self._whole(part)  # (no view of the buffer outlives its use)

    async def final(self, rounds: int) -> str:
        if self._rounds:
            return await self._whole(self.view)
        return await self._prefix.digest()

    def moved(self, rounds: int) -> int:
        # a timed transfer moved its rounds (each one slot, hashed here); others the region
        return rounds * self.slot if rounds else self.length

    async def aclose(self) -> None:
        await self._prefix.aclose()
        if self._running is not None:
            await self._running.aclose()

    async def _whole(self, view: memoryview) -> str:
        self._running = PrefixHasher(view, self.check.new())
        return await self._running.digest()


class _Stream:
    """The region is a window of two slots the sender streams ``size`` bytes through: round
    ``r`` is bytes ``r * slot ..`` of the stream, in slot ``r % 2``; each is hashed into the
    checksum of the stream so far when it lands, and that is the answer to it. Marks are
    not taken: a slot is written again once its round is answered, so nothing is frozen."""

    def __init__(self, view: memoryview, size: int, check: Checksum) -> None:
        self.view = view
        self.size = size
        self.slot = len(view) // 2
        self.rounds = -(-size // self.slot) if self.slot else 0
        self._sha = check.new()
        self._running: PrefixHasher | None = None

    early = 0
    hashed = 0

    def mark(self, upto: int) -> None:
        pass

    async def round(self, r: int) -> str:
        if r >= self.rounds:
            raise MRCError(f"round {r} of a transfer of {self.rounds} rounds")
        n = min(self.slot, self.size - r * self.slot)
        base = (r % 2) * self.slot
        with self.view[base : base + n] as part:  # no view of the buffer outlives its use
            self._running = PrefixHasher(part, self._sha)
            return await self._running.digest()

    async def final(self, rounds: int) -> str:
        if rounds != self.rounds:
            raise MRCError(
                f"the sender ended after {rounds} of the {self.rounds} rounds of {self.size} bytes"
            )
        return self._sha.hexdigest()

    def moved(self, rounds: int) -> int:
        return self.size

    async def aclose(self) -> None:
        if self._running is not None:
            await self._running.aclose()


async def _wait_done(conn: Connection, hashes: _Hashes) -> int:
    """Wait for ``DONE_IMM``, answering every round on the way with its hash (the sender
    writes that slot again only after the answer) and handing what each mark says is written
    to the hash; returns how many rounds there were."""
    rounds = 0
    while True:
        imm = await conn.next_immediate()
        if imm == DONE_IMM:
            return rounds
        if imm & ~ROUND_MASK == MARK_IMM:
            hashes.mark((imm & ROUND_MASK) * MARK_UNIT)
            continue
        if imm & ~ROUND_MASK != ROUND_IMM:
            continue
        number = imm & ROUND_MASK
        if number != rounds & ROUND_MASK:
            raise MRCError(f"round {number} ended where round {rounds & ROUND_MASK} was due")
        digest = await hashes.round(rounds)
        await conn.send_message(RoundDigest(number, digest).to_json())
        rounds += 1
