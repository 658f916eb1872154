"""The cost of fresh memory, which a benchmark that writes every byte of a transfer into new
pages (mrc-send's generated data, mrc-recv --discard's region) pays on its per-packet path.

On a VM, guest pages never touched before cost more to fault in than recycled ones:
:func:`first_touch_us_per_page` measures that cost next to the results, :func:`warm_memory`
recycles enough pages before the first run that later runs are not faster than the first.
"""

from __future__ import annotations

import contextlib
import mmap
import time
from typing import Any

PAGE = 4096


def first_touch_us_per_page(mib: int = 64) -> float:
    """Microseconds to fault in one fresh 4 KiB page of anonymous memory."""
    m = mmap.mmap(-1, mib << 20)
    try:
        t = time.perf_counter()
        for off in range(0, len(m), PAGE):
            m[off] = 1
        return round((time.perf_counter() - t) / (len(m) // PAGE) * 1e6, 3)
    finally:
        m.close()


def _mem_available() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 30


def warm_memory(size: int) -> dict[str, Any]:
    """Touch and free ``4 * size`` bytes (capped by what the machine has free) before
    measuring; returns how many bytes and how long it took."""
    n = min(4 * size, 4 << 30, _mem_available() // 4)
    n -= n % PAGE
    if n <= 0:
        return {"bytes": 0, "seconds": 0.0}
    t = time.perf_counter()
    m = mmap.mmap(-1, n)
    try:
        for off in range(0, n, PAGE):
            m[off] = 1
    finally:
        m.close()
    return {"bytes": n, "seconds": round(time.perf_counter() - t, 3)}
