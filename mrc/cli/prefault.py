"""Mapping a receive region with its pages faulted in ahead of the data, as RDMA memory
registration pins them: a page fault per arriving packet costs about as much as the rest of
the receive path (docs/PERFORMANCE.md).

Faulting in takes about 0.75 s per GiB. A small region is faulted in before the sender is
welcomed; a large one is mapped at once and faulted in by a thread while the data arrives
(packets overtaking it fault their pages in themselves), so the sender's set-up, and its first
byte, do not wait for it. Very large regions fault lazily, page by page, rather than take that
much memory up front.
"""

from __future__ import annotations

import mmap
import threading

#: regions up to this size are faulted in before the sender is welcomed (tens of ms)
INLINE_LIMIT = 64 << 20
#: larger regions up to this size are faulted in by a thread; beyond it, lazily
POPULATE_LIMIT = 4 << 30
#: bytes one step of that thread faults in (stopping it waits for one step at most). Small:
#: a step holds the process's memory-map lock, and the receive path's own page faults (and
#: any mmap of the process, which queues behind it and then blocks them) wait for it. With
#: 16 MiB steps a 2 GiB --out moved next to nothing for its first 1.5 to 4 s on loopback and
#: took 3.2 to 6.5 s in all; with 1 MiB, 2.9 to 3.2 s, flowing within a second
STEP = 1 << 20
#: Linux's MADV_POPULATE_READ and MADV_POPULATE_WRITE (5.14 and later), which Python's mmap
#: module does not name in every version
_MADV_POPULATE_READ = 22
_MADV_POPULATE_WRITE = 23


class Prefault:
    """Faults ``length`` bytes of ``buf`` in from a thread, a step at a time, until done or
    stopped. ``write``: as a write would (private memory); else as a read would (a shared file
    mapping, whose pages a write fault would mark dirty for nothing, as MAP_POPULATE avoids)."""

    def __init__(self, buf: mmap.mmap, length: int, write: bool) -> None:
        self._stopped = threading.Event()
        advice = _MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ
        self._thread = threading.Thread(
            target=self._run, args=(buf, length, advice), name="mrc-prefault", daemon=True
        )
        self._thread.start()

    def _run(self, buf: mmap.mmap, length: int, advice: int) -> None:
        for off in range(0, length, STEP):
            if self._stopped.is_set():
                return
            try:
                buf.madvise(advice, off, min(STEP, length - off))  # (releases the GIL)
            except (OSError, ValueError):
                return  # a kernel without it: pages fault in as data lands

    def stop(self) -> None:
        """Stop faulting in and wait for the step under way: ``buf`` may be unmapped after."""
        self._stopped.set()
        self._thread.join()


def map_region(size: int, fd: int | None = None) -> tuple[mmap.mmap, Prefault | None]:
    """A mapping of ``size`` bytes of the file ``fd`` (shared), or of private memory (None,
    at least one byte), and the thread faulting it in if it is large; stop that thread before
    unmapping."""
    anonymous = fd is None
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS if anonymous else mmap.MAP_SHARED
    if size <= INLINE_LIMIT:
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    buf = mmap.mmap(-1 if fd is None else fd, max(size, 1) if anonymous else size, flags=flags)
    later = None
    if INLINE_LIMIT < size <= POPULATE_LIMIT:
        later = Prefault(buf, size, write=anonymous)
    return buf, later
