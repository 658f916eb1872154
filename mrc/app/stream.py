"""What a transfer sends, as views of bounded memory, and its checksum computed as it goes.

A :class:`Source` is ``size`` bytes that a sender reads as views (``pieces``), never as one
buffer: a mapped file (:class:`BufferSource`) or a generated stream (:class:`GeneratedSource`),
whose memory does not grow with its size. :class:`StreamHasher` hashes a source in order, in a
worker thread, one step after the other, so the sender knows the checksum (the one the
connection agreed on, mrc.app.checksum) of any prefix it has sent (a round's end, the whole)
without keeping those bytes or hashing them twice.
"""

from __future__ import annotations

import asyncio
import math
import mmap
import os
import time
from collections.abc import Iterator
from typing import Protocol

from mrc.app import hashpolicy
from mrc.app.checksum import PIECE, Checksum

#: bytes per WRITE a sender posts, and per step of a hash (hashlib releases the GIL for each)
CHUNK = 16 << 20
#: random bytes a generated stream is made of
BLOCK = 16 << 20


class Source(Protocol):
    """``size`` bytes a sender reads in order or out of it, as views of memory it keeps
    unchanged for as long as it lives (a WRITE sends from where the bytes lie)."""

    @property
    def size(self) -> int: ...

    def pieces(self, start: int, end: int) -> Iterator[memoryview]:
        """Bytes ``start`` to ``end`` of the source, as consecutive views."""
        ...


class BufferSource:
    """A buffer already in memory (or mapped: a file's pages), as a source."""

    def __init__(self, view: memoryview) -> None:
        self._view = view

    @property
    def size(self) -> int:
        return len(self._view)

    def pieces(self, start: int, end: int) -> Iterator[memoryview]:
        if start < end:
            yield self._view[start:end]


class GeneratedSource:
    """``size`` bytes of a stream made from one block of ``block`` random bytes, whatever the
    size: memory and the time to make it stay those of the block.

    Block ``k`` of the stream is the random block rotated by ``k * step`` bytes (``step``
    coprime with the block size, so no two of the first ``block`` blocks are alike): a byte
    placed at another block's offset changes the hash, as it would with random data. The block
    is stored twice in a row so that every rotation is one contiguous view, sent without a
    copy."""

    def __init__(self, size: int, block: int = BLOCK) -> None:
        if size < 0:
            raise ValueError(f"a stream of {size} bytes")
        self._size = size
        self.block = max(1, min(block, size))
        self._buf = mmap.mmap(-1, 2 * self.block)
        self._buf[: self.block] = os.urandom(self.block)
        self._buf[self.block :] = self._buf[: self.block]
        self._view = memoryview(self._buf)
        step = max(1, int(self.block * 0.6180339887))  # far from 0 and from the block size
        while math.gcd(step, self.block) != 1:
            step += 1
        self._step = step

    @property
    def size(self) -> int:
        return self._size

    @property
    def resident(self) -> int:
        """Bytes of memory this source holds, whatever its size."""
        return len(self._buf)

    def pieces(self, start: int, end: int) -> Iterator[memoryview]:
        end = min(end, self._size)
        pos = max(start, 0)
        while pos < end:
            k, within = divmod(pos, self.block)
            n = min(self.block - within, end - pos)
            at = (k * self._step) % self.block + within
            yield self._view[at : at + n]
            pos += n


class StreamHasher:
    """The checksum of a source's prefixes, hashed in order in a worker thread.

    :meth:`hash_to` schedules hashing up to a byte and gives the digest of everything before
    it; steps run one after the other, each in a thread (the loop keeps moving packets).
    :meth:`follow` paces the hashing with what the peer acknowledged, so it takes a little
    of a core all along rather than all of one at the start or the end, and keeps as far
    ahead of it as the acknowledgements moved since the last call: the source does not
    change, and at the end little is left to hash before the verdict."""

    def __init__(self, source: Source, checksum: Checksum) -> None:
        self._source = source
        self._sha = checksum.new()
        self._scheduled = 0  # bytes up to which hashing steps are scheduled
        self._tail: asyncio.Task[str] | None = None  # the latest step
        self._acked = 0  # what follow() was told last
        #: when the digest was first awaited (time.monotonic(); read by the step's thread
        #: between pieces: mrc.app.hashpolicy.piece)
        self.awaited: float | None = None

    def hash_to(self, end: int) -> asyncio.Task[str]:
        """Hash up to byte ``end`` (not before what is scheduled already); the task gives
        the checksum of bytes ``0..end``."""
        start = self._scheduled
        if not start <= end <= self._source.size:
            raise ValueError(f"cannot hash to {end}: hashed to {start} of {self._source.size}")
        self._scheduled = end
        self._tail = asyncio.ensure_future(self._step(self._tail, start, end))
        return self._tail

    def follow(self, acked: int) -> None:
        """Hash on if no step is running and a chunk is waiting: up to ``acked`` bytes and
        as many again as were acknowledged since the last call (what comes by the next)."""
        idle = self._tail is None or self._tail.done()
        ahead = max(0, acked - self._acked)
        self._acked = max(self._acked, acked)
        end = min(acked + ahead, self._source.size)
        if idle and end - self._scheduled >= CHUNK:
            self.hash_to(end)

    async def digest(self) -> str:
        """The checksum of the whole source (what is left is hashed now)."""
        self.awaiting()
        return await self.hash_to(self._source.size)

    def awaiting(self) -> None:
        """Someone waits for a digest now: from GRACE on, no step gives way any more
        (mrc.app.hashpolicy; from then on for the rest of the source, conservatively)."""
        if self.awaited is None:
            self.awaited = time.monotonic()

    def cancel(self) -> None:
        """Stop hashing (the transfer ended without a verdict)."""
        if self._tail is not None:
            self._tail.cancel()

    async def _step(self, before: asyncio.Task[str] | None, start: int, end: int) -> str:
        if before is not None:
            await before
        return await asyncio.to_thread(self._update, start, end)

    def _update(self, start: int, end: int) -> str:
        if not hashpolicy.allowed():
            for piece in self._source.pieces(start, end):
                for off in range(0, len(piece), CHUNK):
                    self._sha.update(piece[off : off + CHUNK])
            return self._sha.copy().hexdigest()
        # in pieces, each under SCHED_IDLE unless urgent (hashpolicy.piece)
        with hashpolicy.step():
            at = start
            for piece in self._source.pieces(start, end):
                for off in range(0, len(piece), PIECE):
                    hashpolicy.piece(self.awaited, self._scheduled - at)
                    part = piece[off : off + PIECE]
                    self._sha.update(part)
                    at += len(part)
        return self._sha.copy().hexdigest()
