"""Registered memory: regions a peer may write into, found by rkey.

A region wraps any writable buffer that exposes the buffer protocol as contiguous bytes
(bytearray, mmap, a C-contiguous NumPy array). Each region gets a synthetic virtual address
range so WRITEs name a place as RDMA does (remote address + rkey) without leaking real
pointers; ranges of different regions never overlap. Addresses start at a random base and
leave random gaps, so a stranger cannot guess where a region is from where another one was.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import IntFlag


class Access(IntFlag):
    LOCAL = 0
    REMOTE_WRITE = 1


_BASE_ALIGN = 1 << 16


@dataclass(slots=True)
class MemoryRegion:
    """One registered buffer. ``addr`` is the virtual address of its first byte."""

    rkey: int
    addr: int
    length: int
    access: Access
    view: memoryview
    name: str = ""
    writable: bool = False  # REMOTE_WRITE granted (a plain bool: checked per packet)
    closed: bool = False  # close() was called: nothing is placed here any more
    #: bytes from the start that are final (:meth:`freeze`): nothing new is placed below
    frozen: int = 0
    #: ``view`` from byte ``frozen`` on, and its address: what the train kernel may write
    #: (kept here so that placing a train costs no slicing)
    open_view: memoryview = field(init=False)
    open_addr: int = field(init=False)

    def __post_init__(self) -> None:
        self.writable = bool(self.access & Access.REMOTE_WRITE)
        self.open_view = self.view
        self.open_addr = self.addr

    def freeze(self, upto: int) -> None:
        """Place nothing new below byte ``upto`` any more (it only rises): what lies there is
        final, so a hash of it taken now (the receiver of a transfer hashes the prefix its
        sender marked written while the rest is still coming) still describes it at the end.
        A WRITE of new data starting below it is dropped as one to a closed region is
        (``region_closed``, NACK code 2); a retransmission of one placed is still
        acknowledged."""
        if not 0 <= upto <= self.length:
            raise ValueError(f"cannot freeze {upto} bytes of a region of {self.length}")
        if upto <= self.frozen:
            return
        if self.open_view is not self.view:
            self.open_view.release()
        self.frozen = upto
        self.open_view = self.view[upto:]
        self.open_addr = self.addr + upto

    def release(self) -> None:
        """Let go of the buffer (``ProtectionDomain.deregister``): every view of it here."""
        if self.open_view is not self.view:
            self.open_view.release()
        self.view.release()

    def close(self) -> None:
        """Place nothing here any more: what the region holds now is final, so that a hash of
        it (an end-to-end verdict) still describes it when the hash is done. A WRITE of new
        data to it is then dropped (``region_closed``, NACK code 2); a retransmission of one
        it already holds is still acknowledged, so the writer's last ACK can be repaired."""
        self.closed = True
        self.writable = False

    def describe(self) -> dict[str, object]:
        """What a peer needs to write here (sent over the side channel)."""
        return {"name": self.name, "rkey": self.rkey, "addr": self.addr, "length": self.length}


#: random gap between two regions' address ranges, in units of _BASE_ALIGN (up to 4 GiB)
_GAP_BITS = 16


class ProtectionDomain:
    """The regions a set of QPs may write into.

    A listener gives each connection its own domain (holding the listener's shared regions and
    the region granted to that peer), so one peer's rkeys are worthless on another's QP."""

    def __init__(self) -> None:
        self._by_rkey: dict[int, MemoryRegion] = {}
        self._next_addr = (1 << 32) + secrets.randbits(32) * _BASE_ALIGN

    def register(
        self, buffer: object, access: Access = Access.REMOTE_WRITE, name: str = ""
    ) -> MemoryRegion:
        """Register ``buffer``; raise TypeError/ValueError if it cannot be written in place."""
        try:
            # any object is accepted on purpose: a non-buffer gets the message below
            view = memoryview(buffer)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"cannot register {type(buffer).__name__}: it does not expose a buffer"
            ) from None
        if view.readonly:
            raise ValueError("cannot register a read-only buffer for remote writes")
        if not view.c_contiguous:
            raise ValueError("cannot register a non-contiguous buffer")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        rkey = secrets.randbits(32) or 1
        while rkey in self._by_rkey:
            rkey = secrets.randbits(32) or 1
        addr = self._next_addr
        span = max(len(view), 1)
        gap = secrets.randbits(_GAP_BITS) + 1
        self._next_addr += ((span + _BASE_ALIGN - 1) // _BASE_ALIGN + gap) * _BASE_ALIGN
        region = MemoryRegion(rkey, addr, len(view), Access(access), view, name)
        self._by_rkey[rkey] = region
        return region

    def adopt(self, region: MemoryRegion) -> None:
        """Make ``region`` (registered in another domain) writable through this one too, under
        the same rkey and address, so what a peer was told about it holds here."""
        held = self._by_rkey.get(region.rkey)
        if held is region:
            return
        if held is not None:
            raise ValueError(f"two regions share rkey {region.rkey:#x}")
        self._by_rkey[region.rkey] = region

    def deregister(self, region: MemoryRegion) -> None:
        """Forget ``region``: later writes to its rkey are dropped as bad_rkey."""
        self._by_rkey.pop(region.rkey, None)
        region.release()

    def lookup(self, rkey: int) -> MemoryRegion | None:
        return self._by_rkey.get(rkey)

    def regions(self) -> list[MemoryRegion]:
        return list(self._by_rkey.values())
