"""mrc-recv's regions: small ones faulted in before the sender is welcomed, large ones by a
thread while data already lands in them (the sender's set-up does not wait for it)."""

from __future__ import annotations

import os
from pathlib import Path

from mrc.cli.prefault import INLINE_LIMIT, POPULATE_LIMIT, map_region

MiB = 1 << 20


def test_a_small_region_is_faulted_in_at_once_and_a_huge_one_lazily() -> None:
    buf, later = map_region(INLINE_LIMIT)
    assert later is None and len(buf) == INLINE_LIMIT
    buf.close()
    buf, later = map_region(POPULATE_LIMIT + 1)  # private memory, never touched: costs nothing
    assert later is None
    buf.close()


def test_data_lands_while_a_large_region_is_faulted_in(tmp_path: Path) -> None:
    size = INLINE_LIMIT + 48 * MiB
    pattern = os.urandom(MiB)
    buf, later = map_region(size)
    assert later is not None
    for off in range(0, size, 8 * MiB):  # while the thread faults pages in
        buf[off : off + MiB] = pattern
    later.stop()
    assert all(buf[off : off + MiB] == pattern for off in range(0, size, 8 * MiB))
    buf.close()

    path = tmp_path / "part"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        buf, later = map_region(size, fd)
        assert later is not None
        buf[size - MiB :] = pattern
        later.stop()
        buf.flush()
        buf.close()
    finally:
        os.close(fd)
    with path.open("rb") as f:
        assert f.read(MiB) == bytes(MiB)  # faulting in writes nothing
        f.seek(size - MiB)
        assert f.read() == pattern
