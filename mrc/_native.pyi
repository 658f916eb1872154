"""Type stub of the C batch kernels (mrc/_native.c); semantics in mrc/core/fastpath.py."""

from array import array
from collections.abc import Callable

def place_train(
    view: memoryview,
    off: int,
    seg: int,
    qpn: int,
    rkey: int,
    region: memoryview,
    region_addr: int,
    initial_psn: int,
    cum: int,
    hi: int,
    window: int,
    blocks: dict[int, int],
    seqs: array[int],
    marks: bytearray,
    /,
) -> tuple[int, int, int]: ...
def pack_burst(
    buf: bytearray | memoryview,
    off: int,
    qpn: int,
    psn: int,
    va: int,
    rkey: int,
    size: int,
    count: int,
    last_size: int,
    last: bool,
    imm: int,
    /,
) -> int: ...
def note_arrivals(
    seqs: array[int],
    marks: bytearray,
    start: int,
    stop: int,
    blocks: dict[int, int],
    dirty: set[int],
    hi: int,
    /,
) -> tuple[int, int, bool]: ...
def open_in_place(
    data: memoryview,
    hdr_len: int,
    kid: bytes,
    open_header: Callable[..., bytes],
    open_payload: Callable[..., bytes],
    invalid_tag: type,
    seen: bytearray,
    top: int,
    encrypt: bool,
    /,
) -> tuple[str | None, int, int]: ...
def seal_data(
    headers: bytes,
    payload: bytes | memoryview,
    kid: bytes,
    counter: int,
    seal_header: Callable[..., bytes],
    seal_payload: Callable[..., bytes],
    /,
) -> bytes: ...
