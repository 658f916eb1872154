"""Type stub of the C batch kernels (mrc/_native.c); semantics in mrc/core/fastpath.py and
mrc/transport/rxbatch.py (keyed mode's kernels: mrc/_native_gcm.pyi)."""

from array import array
from collections.abc import Callable

#: ``#define KERNEL_VERSION`` of the source it was built from (mrc.native uses it only when equal
#: to mrc.native.KERNEL_VERSION)
KERNEL_VERSION: int

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
    skip: int = 0,
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
def note_runs(
    seqs: array[int],
    marks: bytearray,
    start: int,
    count: int,
    blocks: dict[int, int],
    dirty: set[int],
    hi: int,
    cum: int,
    pending: int,
    next_due: int,
    ack_due: bool,
    ack_every: int,
    ack_batch_max: int,
    /,
) -> tuple[int, int, int, int, int, int]: ...

class Packet:
    wr: object
    offset: int
    length: int
    last: bool
    ev: int
    sent_at: float
    deadline: float
    timeouts: int
    nacks: int
    nacked: bool
    retransmitted: bool
    ambiguous: bool
    probed: list[tuple[int, float]] | None
    silenced: bool
    def __init__(
        self,
        wr: object,
        offset: int,
        length: int,
        last: bool,
        ev: int,
        sent_at: float,
        deadline: float,
    ) -> None: ...

def record_burst(
    outstanding: dict[int, object],
    ring: array[int],
    wr: object,
    hview: memoryview,
    view: memoryview,
    seq: int,
    n: int,
    ev: int,
    ev_value: int,
    h: int,
    off: int,
    payload: int,
    last_len: int,
    last: bool,
    final_hdr: int,
    now: float,
    deadline: float,
    bufs: list[bytes | memoryview] | None,
    /,
) -> None: ...
def gather_burst(
    dst: memoryview,
    pos: int,
    hview: memoryview,
    h: int,
    view: memoryview,
    off: int,
    n: int,
    payload: int,
    last_len: int,
    final_hdr: int,
    /,
) -> int: ...
def take_acked(
    outstanding: dict[int, object],
    start: int,
    stop: int,
    sacked: list[int],
    planes: list[int],
    delivered: list[float],
    route_ix: list[int] | None,
    route_alive: list[float],
    judge: Callable[[int, float], None] | None,
    /,
) -> tuple[int, int]: ...
def take_ack(
    outstanding: dict[int, object],
    initial_psn: int,
    una: int,
    nxt: int,
    psnw: int,
    base: int,
    bitmap: int,
    planes: list[int],
    delivered: list[float],
    route_ix: list[int] | None,
    route_alive: list[float],
    judge: Callable[[int, float], None] | None,
    /,
) -> tuple[int, int, int, int, int, bool]: ...
def recv_batch(
    sock: object,
    buf: bytearray,
    slot: int,
    most: int,
    ecn: bool,
    space: int,
    /,
) -> tuple[list[tuple[int, int, bool, int, int]], int, bool]: ...
