"""The end-to-end checksum a transfer is verified with, as the two peers agreed at set-up.

Hashing every byte on both sides was the largest single cost of a transfer (docs/PERFORMANCE.md:
two SHA-256 passes took about 40% of both processes' CPU). So the hello offers a list and the
receiver picks (``ListenerConfig.checksums``, ``mrc-recv --checksum``), as rsync negotiates
its checksum:

* ``blake3`` (the default): a cryptographic hash about 2.5x cheaper than SHA-256 per byte on
  one core. With a key (``--key-file``) it is keyed BLAKE3 under a key derived from the
  connection's, so the verdict is a MAC: nobody without the key can make bytes that match.
* ``xxh3-128``: a non-cryptographic 128-bit hash more than 10x cheaper than SHA-256, for users
  who want accidental corruption caught and nothing more (rsync's default, xxh128). A party
  that can change bytes on the way can also make them match.
* ``sha256``: for peers that know nothing else (a peer that names no checksum gets this).

Every implementation releases the GIL on large inputs, so hashing runs in worker threads
beside the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import blake3
import xxhash

from mrc.app import hashpolicy
from mrc.errors import MRCError
from mrc.transport.messages import CHECKSUMS

#: bytes per update (each releases the GIL; a worker thread hashes beside the loop)
STEP = 16 << 20
#: bytes per piece of a step where hash steps may give way (mrc.app.hashpolicy): how long a
#: step may run under a policy it should have left (a quarter of a millisecond of BLAKE3)
PIECE = 1 << 20
#: what a connection whose peer named no checksum is verified with
FALLBACK = "sha256"
#: what each name is called in messages people read
LABELS = {"blake3": "BLAKE3", "xxh3-128": "xxh3-128", "sha256": "SHA-256"}


class Hasher(Protocol):
    """What every hash object here offers (hashlib's interface)."""

    def update(self, data: memoryview | bytes, /) -> object: ...

    def hexdigest(self) -> str: ...

    def copy(self) -> Hasher: ...


def _blake3(key: bytes | None) -> Hasher:
    return blake3.blake3(key=key) if key is not None else blake3.blake3()


def _xxh3(_key: bytes | None) -> Hasher:
    return xxhash.xxh3_128()


def _sha256(_key: bytes | None) -> Hasher:
    return hashlib.sha256()


_MAKERS: dict[str, Callable[[bytes | None], Hasher]] = {
    "blake3": _blake3,
    "xxh3-128": _xxh3,
    "sha256": _sha256,
}
assert set(_MAKERS) == set(CHECKSUMS)  # every name the wire knows has a maker


@dataclass(frozen=True)
class Checksum:
    """One agreed checksum: its ``name`` and, for keyed BLAKE3, the 32-byte ``key``."""

    name: str = FALLBACK
    key: bytes | None = None

    def __post_init__(self) -> None:
        if self.name not in _MAKERS:
            raise ValueError(f"checksum must be one of {', '.join(CHECKSUMS)}, not {self.name!r}")

    @classmethod
    def agreed(cls, name: str | None, key: bytes | None) -> Checksum:
        """What a connection agreed on (``Connection.checksum``, ``checksum_key``): its name
        (None: the peer named none, so SHA-256), keyed only where that makes a MAC."""
        name = name or FALLBACK
        return cls(name, key if name == "blake3" else None)

    @property
    def label(self) -> str:
        """The name as people read it (``BLAKE3``, ``keyed BLAKE3``, ``SHA-256``)."""
        return ("keyed " if self.key is not None else "") + LABELS[self.name]

    def new(self) -> Hasher:
        """A fresh hash object."""
        return _MAKERS[self.name](self.key)

    def of(self, view: memoryview) -> str:
        """The checksum of ``view``, in steps of :data:`STEP` bytes (run it in a thread)."""
        h = self.new()
        for off in range(0, len(view), STEP):
            h.update(view[off : off + STEP])
        return h.hexdigest()


class PrefixHasher:
    """A view hashed from its start as its bytes become final, a step of at most
    :data:`STEP` bytes at a time in a worker thread, so the loop keeps placing packets.

    The receiver of a transfer moves the end (:meth:`advance`) as the sender marks bytes
    written and the region is frozen below them, so that when the last byte arrives only the
    tail is left to hash (:meth:`digest`). One step runs at a time, in order: the hash object
    is only touched by the step running, and :meth:`aclose` waits for it, so no thread still
    reads the buffer once its owner lets go of it (an mmap cannot close while one does)."""

    def __init__(self, view: memoryview, into: Hasher) -> None:
        self._view = view
        self._hash = into  # a fresh hash object, or one that hashed what came before
        self.hashed = 0  # bytes hashed so far (steps ended)
        self._end = 0  # bytes that may be hashed: final, never to change
        self._step: asyncio.Future[None] | None = None  # the step running, if any
        self._moved = asyncio.Event()  # set when a step ends
        self._error: BaseException | None = None
        self._closed = False
        #: when the digest was first awaited (time.monotonic(); read by the step's thread
        #: between pieces: mrc.app.hashpolicy.piece)
        self.awaited: float | None = None

    @property
    def end(self) -> int:
        """Bytes handed over to be hashed (:meth:`advance`): hashed, or on the way."""
        return self._end

    def advance(self, end: int) -> None:
        """Hash on up to byte ``end`` (cut to the view): the caller vouches that the bytes
        below it never change again."""
        if end > self._end:
            self._end = min(end, len(self._view))
            self._next()

    async def digest(self) -> str:
        """The checksum of everything hashed into the hash object, once the whole view is."""
        if self.awaited is None:
            self.awaited = time.monotonic()  # steps give way for GRACE more (hashpolicy)
        self.advance(len(self._view))
        while self.hashed < len(self._view):
            if self._error is not None:
                raise MRCError(f"hashing failed: {self._error}")
            if self._closed:
                raise MRCError("hashing was stopped")
            self._moved.clear()
            await self._moved.wait()
        return self._hash.hexdigest()

    async def aclose(self) -> None:
        """Start no more steps, and wait for the one running to end (a step: a few ms)."""
        self._closed = True
        self._moved.set()
        step = self._step
        if step is not None:
            await asyncio.wait({step})

    def _next(self) -> None:
        start = self.hashed
        stop = min(start + STEP, self._end)
        if self._step is not None or self._closed or self._error is not None or stop <= start:
            return
        step = asyncio.get_running_loop().run_in_executor(None, self._update, start, stop)
        self._step = step
        step.add_done_callback(lambda done: self._stepped(done, stop))

    def _update(self, start: int, stop: int) -> None:
        if not hashpolicy.allowed():
            with self._view[start:stop] as part:
                self._hash.update(part)
            return
        # in pieces, each under SCHED_IDLE unless urgent (hashpolicy.piece)
        with hashpolicy.step():
            for at in range(start, stop, PIECE):
                hashpolicy.piece(self.awaited, self._end - at)
                with self._view[at : min(at + PIECE, stop)] as part:
                    self._hash.update(part)

    def _stepped(self, step: asyncio.Future[None], stop: int) -> None:
        self._step = None
        if step.cancelled():
            self._error = MRCError("a step was cancelled")
        elif (exc := step.exception()) is not None:
            self._error = exc
        else:
            self.hashed = stop
            self._next()
        self._moved.set()
