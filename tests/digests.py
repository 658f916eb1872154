"""What a transfer's end-to-end digest must be, computed without mrc (tests import it from here:
a helper in conftest.py is not importable by name from every test directory)."""

from __future__ import annotations

import hashlib

import blake3
import xxhash


def expected_digest(
    data: bytes | bytearray | memoryview, name: str, key: bytes | None = None
) -> str:
    """The digest a transfer of ``data`` verified with the end-to-end checksum ``name`` must
    report, computed with the hash libraries themselves (not mrc.app.checksum), so that a test
    comparing the two checks mrc rather than repeating it. ``key``: what keyed BLAKE3 is keyed
    with, for a connection under a pre-shared key K:
    ``hashlib.sha256(b"mrc end-to-end checksum key\0" + K).digest()``."""
    if name == "blake3":
        keyed = blake3.blake3(data) if key is None else blake3.blake3(data, key=key)
        return keyed.hexdigest()
    if key is not None:
        raise ValueError(f"{name} is never keyed")
    if name == "xxh3-128":
        return xxhash.xxh3_128_hexdigest(data)
    if name == "sha256":
        return hashlib.sha256(data).hexdigest()
    raise ValueError(f"no end-to-end checksum named {name!r}")
