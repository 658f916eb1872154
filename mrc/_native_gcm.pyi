"""Type stub of keyed mode's C kernels and their AES-GCM (mrc/_native_gcm.c); semantics in
mrc/security/packet.py (Sealer.seal_pair and Opener.unseal's Python paths are the reference) and
mrc/security/trains.py (seal_burst and open_train's pure-Python twins)."""

from typing import Protocol

_Bytes = bytes | bytearray | memoryview

#: ``#define KERNEL_VERSION`` of the source it was built from (mrc.native uses it only when equal
#: to mrc.native.KERNEL_VERSION, and only beside mrc._native of the same)
KERNEL_VERSION: int

class GcmKey:
    """One AES-GCM key (16, 24 or 32 bytes), its encrypting and decrypting contexts made once."""

    def __init__(self, key: bytes, /) -> None: ...
    def encrypt(self, nonce: _Bytes, data: _Bytes, aad: _Bytes | None, /) -> bytes: ...
    def decrypt(self, nonce: _Bytes, data: _Bytes, aad: _Bytes | None, /) -> bytes | None: ...

def seal_packet(
    headers: bytes,
    payload: bytes | memoryview | None,
    kid: bytes,
    counter: int,
    header_key: GcmKey,
    payload_key: GcmKey,
    encrypt: bool,
    /,
) -> tuple[bytes, bytes | memoryview]: ...
def open_in_place(
    data: memoryview,
    hdr_len: int,
    kid: bytes,
    header_key: GcmKey,
    payload_key: GcmKey,
    seen: bytearray,
    top: int,
    encrypt: bool,
    is_data: bool,
    /,
) -> tuple[str | None, int, int, int]: ...
def seal_burst(
    bufs: list[bytes | memoryview],
    count: int,
    kid: bytes,
    counter: int,
    header_key: GcmKey,
    payload_key: GcmKey,
    encrypt: bool,
    /,
) -> tuple[list[bytes | memoryview], int]: ...

class _Window(Protocol):
    seen: bytearray
    top: int

def open_train(
    view: memoryview,
    off: int,
    seg: int,
    cap: int,
    qpn: int,
    kid: bytes,
    header_key: GcmKey,
    payload_key: GcmKey,
    window: _Window,
    encrypt: bool,
    /,
) -> tuple[int, str | None, int, int]: ...
