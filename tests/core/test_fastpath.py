"""The batch receive path: GRO trains through EndpointCore.receive_train and the train kernel.

Three ways of receiving the same segments must agree on everything observable: the C kernel
(mrc._native), its pure-Python twin (mrc.core.fastpath.py_place_train), and the segments one
by one through receive_datagram. Region bytes, counters, drops, every ACK/NACK/probe reply
datagram and every event are compared, over seeded random trains that mix good segments with
duplicates, reordering, trims, truncation and forgeries of every kind on_data rejects.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from array import array
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc import wire
from mrc.core import Access, EndpointCore, ProtectionDomain, QPConfig, QueuePair, fastpath
from mrc.core.memory import MemoryRegion
from mrc.core.psn import to_psn

P = 48  # payload of a full segment
S = wire.DATA_HDR_LEN + P  # segment size of the trains
SLOTS = 256  # the region holds this many payloads; seq s writes slot s % SLOTS
QPN, OTHER_QPN, PEER_QPN = 7, 9, 0x123
IPSN = wire.PSN_MASK - 40  # the peer's initial PSN: sequence numbers cross the 24-bit wrap
WINDOW = 1024


def _segment(
    mr: MemoryRegion,
    seq: int,
    payload: bytes,
    *,
    qpn: int = QPN,
    rkey: int | None = None,
    va: int | None = None,
    length: int | None = None,
    marks: int = 0,
    ackreq: bool = False,
    tver: int = 0,
    secure: bool = False,
    imm: int | None = None,
) -> bytes:
    hdr = bytearray(
        wire.pack_data(
            qpn,
            to_psn(IPSN, seq),
            mr.addr + (seq % SLOTS) * P if va is None else va,
            mr.rkey if rkey is None else rkey,
            len(payload) if length is None else length,
            ackreq,
            imm,
        )
    )
    hdr[1] |= tver
    hdr[4] |= marks
    if secure:
        hdr[8] |= wire.BTH_SECURE
    return bytes(hdr) + payload


@dataclass
class Train:
    """One receive: its bytes (segments of S bytes, the last may be shorter)."""

    data: bytes
    kinds: list[str] = field(default_factory=list)


KINDS = [
    ("good", 40),
    ("reordered", 6),
    ("duplicate", 6),
    ("trimmed", 3),
    ("wrong_qpn", 2),
    ("other_qp", 2),
    ("bad_version", 2),
    ("bad_rkey", 2),
    ("out_of_window", 2),
    ("out_of_bounds", 2),
    ("bad_length", 2),
    ("write_imm", 2),
    ("secure", 2),
    ("probe", 1),
]


def _trains(seed: int, mr: MemoryRegion, count: int) -> list[Train]:
    """Random trains from a sender whose next new sequence number is ``cursor``."""
    rng = random.Random(seed)
    names = [k for k, _w in KINDS]
    weights = [w for _k, w in KINDS]
    cursor = 0
    sent: list[int] = []
    ahead: list[int] = []  # sequence numbers skipped, to arrive later (reordered)
    out = []
    for _ in range(count):
        train = Train(b"")
        parts = []
        for _i in range(rng.randint(1, 20)):
            kind = rng.choices(names, weights)[0]
            marks = wire.BTH_FECN if rng.random() < 0.1 else 0
            ackreq = rng.random() < 0.05
            body = rng.randbytes(P)  # every copy differs: a duplicate placed again would show
            if kind == "good":
                if rng.random() < 0.1:
                    ahead.append(cursor)  # leave a hole
                    cursor += 1
                seq = cursor
                cursor += 1
            elif kind == "reordered" and ahead:
                seq = ahead.pop(rng.randrange(len(ahead)))
            elif kind == "duplicate" and sent:
                seq = rng.choice(sent[-100:])
            elif kind == "out_of_window":
                seq = cursor + WINDOW + rng.randint(1, 100)
            else:
                seq = cursor
                cursor += 1
            sent.append(seq)
            if kind in ("good", "reordered", "duplicate", "out_of_window"):
                pkt = _segment(mr, seq, body, marks=marks, ackreq=ackreq)
            elif kind == "trimmed":
                pkt = _segment(mr, seq, body, marks=wire.BTH_TRIMMED | marks)
            elif kind == "wrong_qpn":
                pkt = _segment(mr, seq, body, qpn=0x777)
            elif kind == "other_qp":
                pkt = _segment(mr, seq, body, qpn=OTHER_QPN)
            elif kind == "bad_version":
                pkt = _segment(mr, seq, body, tver=1)
            elif kind == "bad_rkey":
                pkt = _segment(mr, seq, body, rkey=mr.rkey ^ 0x5A5A)
            elif kind == "out_of_bounds":
                pkt = _segment(mr, seq, body, va=mr.addr + mr.length - P // 2)
            elif kind == "bad_length":
                pkt = _segment(mr, seq, body, length=P - 1)
            elif kind == "write_imm":
                pkt = _segment(mr, seq, body[:-4], imm=seq & 0xFFFF)
            elif kind == "secure":
                pkt = _segment(mr, seq, body, secure=True)
            else:  # a probe, padded to the segment size: answered with a probe reply
                probe = wire.pack_probe(QPN, seq, 4000 + seq % 7, seq, reply=False)
                pkt = probe + bytes(S - len(probe))
            assert len(pkt) == S
            parts.append(pkt)
            train.kinds.append(kind)
        end = rng.random()
        if end < 0.1:  # the last segment truncated in flight: a trim without the mark
            parts[-1] = parts[-1][: rng.randint(wire.DATA_HDR_LEN, S - 1)]
        elif end < 0.15:  # shorter than any header
            parts.append(bytes(rng.randint(1, wire.BTH_LEN - 1)))
            train.kinds.append("short")
        elif end < 0.25:  # a genuine shorter last packet: still the common case
            parts.append(_segment(mr, cursor, rng.randbytes(P // 2)))
            sent.append(cursor)
            cursor += 1
            train.kinds.append("short_good")
        train.data = b"".join(parts)
        out.append(train)
    return out


class Receiver:
    """An endpoint with two connected QPs over one registered region."""

    def __init__(
        self,
        pd: ProtectionDomain,
        ack_every: int,
        ack_batch_max: int = 64,
        ack_batch_bytes: int = 0,
    ) -> None:
        self.core = EndpointCore(pd)
        self.qps = {}
        for qpn in (QPN, OTHER_QPN):
            # no reverse probes: these tests pin every datagram the receiver sends, and
            # seconds pass between drains (tests/core/test_revprobes.py has the probes)
            cfg = QPConfig(
                payload_size=P,
                ack_every=ack_every,
                ack_batch_max=ack_batch_max,
                ack_batch_bytes=ack_batch_bytes,  # 0: the packet bound alone
                psn_window=WINDOW,
                reverse_probe_interval=0.0,
            )
            qp = QueuePair(qpn, pd, list(range(5000, 5008)), None, cfg)
            qp.connect(PEER_QPN, IPSN)
            self.core.add(qp)
            self.qps[qpn] = qp
        self.out: list[tuple[int, int, bytes]] = []
        self.events: list[object] = []

    def drain(self, now: float) -> None:
        for qpn, qp in self.qps.items():
            for ev, hdr, payload in qp.datagrams_to_send(now):
                d = bytes(hdr) + bytes(payload)
                if d[0] == wire.Opcode.PROBE:  # EV health probes carry a random token
                    d = d[: wire.PROBE_LEN - 8]
                self.out.append((qpn, ev, d))
            while (e := qp.next_event()) is not None:
                self.events.append(e)

    def feed(self, view: memoryview, seg: int, port: int, now: float, mode: str) -> None:
        """One receive of ``seg``-byte segments: as a train ("train") or one datagram at a
        time ("single"), as the two paths the comparisons hold to the same observations."""
        if mode == "train":
            self.core.receive_train(view, seg, port, now)
        else:
            for off in range(0, max(len(view), 1), seg):
                self.core.receive_datagram(view[off : off + seg], port, now)

    def observed(self, region: bytearray) -> dict[str, object]:
        return {
            "region": hashlib.sha256(region).hexdigest(),
            "stats": {qpn: qp.stats.as_dict() for qpn, qp in self.qps.items()},
            "drops": dict(self.core.dropped_by_reason),
            "received": self.core.datagrams_received,
            "out": self.out,
            "events": self.events,
            "cum": {qpn: qp.responder.received_through for qpn, qp in self.qps.items()},
        }


def _mutate(trains: list[Train], seed: int) -> list[Train]:
    """The same trains with a few header bytes of their segments flipped at random."""
    rng = random.Random(seed)
    out = []
    for t in trains:
        data = bytearray(t.data)
        for _ in range(rng.randint(0, 3)):
            pos = rng.randrange(len(data))
            if pos % S < wire.DATA_HDR_LEN:
                data[pos] ^= 1 << rng.randrange(8)
        out.append(Train(bytes(data), t.kinds))
    return out


def _run(
    seed: int, mode: str, ack_every: int, mutate: bool = False
) -> tuple[dict[str, object], int]:
    """Feed the seed's trains to a fresh receiver; returns what it observed and how many
    segments the train kernel placed. ``mode``: "train" (receive_train, with whichever
    kernel fastpath.place_train is) or "single" (each segment through receive_datagram)."""
    pd = ProtectionDomain()
    region = bytearray(SLOTS * P)
    # a new address and rkey each run: the trains carry them, nothing compared does
    mr = pd.register(region, Access.REMOTE_WRITE, "r")
    rx = Receiver(pd, ack_every)
    now = 1.0
    trains = _trains(seed, mr, 150)
    for i, train in enumerate(_mutate(trains, seed) if mutate else trains):
        view = memoryview(bytearray(train.data))
        rx.feed(view, S, 6000 + i % 5, now, mode)
        now += 0.0003  # every other train lets the ACK delay run out
        rx.drain(now)
    assert rx.core.unaccounted() == 0
    fast = sum(qp.responder.fast_placed for qp in rx.qps.values())
    return rx.observed(region), fast


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("ack_every", [1, 3, 16])
def test_trains_observe_exactly_what_single_datagrams_do(
    rx_impl: str, seed: int, ack_every: int
) -> None:
    """A train through the kernel leaves the same bytes, counters, drops, ACKs and events as
    its segments one by one (ACKs too: the kernel's arrivals are recorded in runs that end
    where a single arrival would have made an ACK due)."""
    train, fast = _run(seed, "train", ack_every)
    single, none = _run(seed, "single", ack_every)
    assert none == 0
    assert fast > 500  # most good segments really took the kernel
    assert train["stats"] == single["stats"]
    assert train["drops"] == single["drops"]
    assert train == single


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_mutated_trains_observe_exactly_what_single_datagrams_do(rx_impl: str, seed: int) -> None:
    """Bit flips anywhere in the headers (QPN, PSN, rkey, address, length, marks, opcode):
    still the same fate for every segment, with every datagram accounted for."""
    train, _fast = _run(seed, "train", 5, mutate=True)
    single, _none = _run(seed, "single", 5, mutate=True)
    assert train == single


def test_both_kernels_place_the_same_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    if fastpath.native_place_train is None or fastpath.native_note_runs is None:
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
    monkeypatch.setattr(fastpath, "place_train", fastpath.native_place_train)
    monkeypatch.setattr(fastpath, "note_arrivals", fastpath.native_note_arrivals)
    monkeypatch.setattr(fastpath, "note_runs", fastpath.native_note_runs)
    native = _run(5, "train", 4)
    monkeypatch.setattr(fastpath, "place_train", fastpath.py_place_train)
    monkeypatch.setattr(fastpath, "note_arrivals", fastpath.py_note_arrivals)
    monkeypatch.setattr(fastpath, "note_runs", fastpath.py_note_runs)
    python = _run(5, "train", 4)
    assert native == python  # the fast counts too


def test_every_kind_of_train_occurs() -> None:
    """The generator above really mixes what the comparison claims to cover."""
    pd = ProtectionDomain()
    mr = pd.register(bytearray(SLOTS * P), Access.REMOTE_WRITE, "r")
    kinds = {k for t in _trains(1, mr, 150) for k in t.kinds}
    assert kinds >= {k for k, _w in KINDS} | {"short", "short_good"}


# ---- the kernel on its own ------------------------------------------------------------------


def _kernel_setup() -> tuple[ProtectionDomain, MemoryRegion, bytearray]:
    pd = ProtectionDomain()
    region = bytearray(SLOTS * P)
    return pd, pd.register(region, Access.REMOTE_WRITE, "r"), region


def _place(
    train: bytes,
    mr: MemoryRegion,
    cum: int = -1,
    hi: int = -1,
    blocks: dict[int, int] | None = None,
) -> tuple[tuple[int, int, int], list[int], bytes]:
    seqs = array("q", bytes(8 * 64))
    marks = bytearray(64)
    res = fastpath.place_train(
        memoryview(train), 0, S, QPN, mr.rkey, mr.view, mr.addr, IPSN, cum, hi, WINDOW,
        blocks or {}, seqs, marks,
    )  # fmt: skip
    return res, list(seqs[: res[1]]), bytes(marks[: res[1]])


def test_kernel_places_a_good_train_and_reports_marks(rx_impl: str) -> None:
    _pd, mr, region = _kernel_setup()
    bodies = [bytes([i]) * P for i in range(8)]
    segs = [_segment(mr, i, bodies[i]) for i in range(8)]
    segs[2] = _segment(mr, 2, bodies[2], marks=wire.BTH_FECN)
    segs[5] = _segment(mr, 5, bodies[5], ackreq=True)
    res, seqs, marks = _place(b"".join(segs), mr)
    assert res == (8 * S, 8, 8 * P)
    assert seqs == list(range(8))
    assert marks == bytes([0, 0, 1, 0, 0, 2, 0, 0])
    assert bytes(region[: 8 * P]) == b"".join(bodies)


HOSTILE = {
    "short header": lambda mr: _segment(mr, 3, b"")[:20],
    "wrong qpn": lambda mr: _segment(mr, 3, b"x" * P, qpn=OTHER_QPN),
    "bad version": lambda mr: _segment(mr, 3, b"x" * P, tver=2),
    "trimmed": lambda mr: _segment(mr, 3, b"x" * P, marks=wire.BTH_TRIMMED),
    "secure": lambda mr: _segment(mr, 3, b"x" * P, secure=True),
    "other rkey": lambda mr: _segment(mr, 3, b"x" * P, rkey=mr.rkey + 1),
    "write_imm": lambda mr: _segment(mr, 3, b"x" * (P - 4), imm=1),
    "length short": lambda mr: _segment(mr, 3, b"x" * P, length=P - 1),
    "length long": lambda mr: _segment(mr, 3, b"x" * P, length=P + 1),
    "below region": lambda mr: _segment(mr, 3, b"x" * P, va=mr.addr - 1),
    "past region": lambda mr: _segment(mr, 3, b"x" * P, va=mr.addr + mr.length - P + 1),
    "huge va": lambda mr: _segment(mr, 3, b"x" * P, va=(1 << 64) - 1),
    "out of window": lambda mr: _segment(mr, WINDOW, b"x" * P),
    "behind cum": lambda mr: _segment(mr, -1, b"x" * P),
    "in bitmap": lambda mr: _segment(mr, 40, b"x" * P),
    "in this train": lambda mr: _segment(mr, 1, b"x" * P),
    "ack": lambda mr: wire.pack_ack(QPN, 0, wire.AETH_ACK, 0, 0, 0, 1) + bytes(S - wire.ACK_LEN),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_kernel_stops_at_the_first_segment_it_must_not_place(rx_impl: str, kind: str) -> None:
    _pd, mr, region = _kernel_setup()
    bad = HOSTILE[kind](mr)
    good = [_segment(mr, i, bytes([i + 1]) * P) for i in (0, 1, 2, 4)]
    # a segment shorter than S can only be the last one
    train = b"".join(good[:3]) + bad + (good[3] if len(bad) == S else b"")
    before = bytes(region)
    res, seqs, _m = _place(train, mr, blocks={0: 1 << 40}, hi=40)
    assert res == (3 * S, 3, 3 * P)
    assert seqs == [0, 1, 2]
    assert bytes(region[3 * P :]) == before[3 * P :]  # nothing past the three placed


def test_kernel_fills_holes_below_what_arrived(rx_impl: str) -> None:
    """A reordered segment below the highest arrival is placed when neither the bitmaps nor
    the train already has it."""
    _pd, mr, region = _kernel_setup()
    train = b"".join(_segment(mr, s, bytes([s]) * P) for s in (5, 3, 9, 4))
    res, seqs, _m = _place(train, mr, cum=2, hi=7, blocks={0: 1 << 7})
    assert res == (4 * S, 4, 4 * P) and seqs == [5, 3, 9, 4]
    assert bytes(region[3 * P : 6 * P]) == bytes([3]) * P + bytes([4]) * P + bytes([5]) * P


def test_kernel_stops_when_its_output_is_full(rx_impl: str) -> None:
    _pd, mr, _region = _kernel_setup()
    train = memoryview(b"".join(_segment(mr, s, b"y" * P) for s in range(5)))
    seqs, marks = array("q", bytes(8 * 2)), bytearray(3)
    res = fastpath.place_train(
        train, S, S, QPN, mr.rkey, mr.view, mr.addr, IPSN, -1, -1, WINDOW, {}, seqs, marks
    )
    assert res == (3 * S, 2, 2 * P) and list(seqs) == [1, 2]


def test_kernel_rejects_bad_arguments(rx_impl: str) -> None:
    _pd, mr, _region = _kernel_setup()
    blocks: dict[int, int] = {}
    args = (memoryview(b""), 0, S, QPN, mr.rkey, mr.view, mr.addr, IPSN, -1, -1, WINDOW, blocks)
    outs = (array("q", bytes(8)), bytearray(1))
    with pytest.raises(ValueError):
        fastpath.place_train(args[0], args[1], 0, *args[3:], *outs)
    with pytest.raises(ValueError):
        fastpath.place_train(args[0], -1, *args[2:], *outs)


@pytest.mark.parametrize("seed", range(3))
def test_kernels_agree_on_mutated_trains(seed: int) -> None:
    """Random byte flips in the headers of good trains: both kernels place the same segments,
    leave the same bytes, and never touch memory outside the region (no crash)."""
    if fastpath.native_place_train is None:
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
    rng = random.Random(seed)
    _pd, mr, _region = _kernel_setup()
    good = b"".join(_segment(mr, s, rng.randbytes(P)) for s in range(16))
    for _ in range(300):
        train = bytearray(good[: rng.randint(0, len(good))])
        for _f in range(rng.randint(0, 4)):
            if train:
                pos = rng.randrange(len(train))
                if pos % S < wire.DATA_HDR_LEN:
                    train[pos] = rng.randrange(256)
        results = []
        for impl in (fastpath.native_place_train, fastpath.py_place_train):
            region = bytearray(SLOTS * P)
            seqs, marks = array("q", bytes(8 * 64)), bytearray(64)
            res = impl(
                memoryview(train), 0, S, QPN, mr.rkey, memoryview(region), mr.addr, IPSN,
                -1, 3, WINDOW, {0: 0b1010}, seqs, marks,
            )  # fmt: skip
            results.append((res, bytes(seqs), bytes(marks), bytes(region)))
        assert results[0] == results[1]


def _note_impls() -> list[fastpath.NoteArrivals]:
    if fastpath.native_note_arrivals is None:
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
    return [fastpath.native_note_arrivals, fastpath.py_note_arrivals]


@pytest.mark.parametrize("seed", range(4))
def test_both_note_arrivals_kernels_set_the_same_bits(seed: int) -> None:
    """Random runs (consecutive, reordered, straddling and revisiting 64-packet blocks, with
    AckReq marks anywhere, over bitmaps that already hold bits): the C kernel leaves exactly
    the twin's blocks (insertion order included), dirty set and result, run after run."""
    impls = _note_impls()
    rng = random.Random(seed)
    for _ in range(400):
        count = rng.randint(0, 40)
        base = rng.randint(0, 1000)
        if rng.random() < 0.5:
            seq_list = list(range(base, base + count))  # a burst, as GSO sends it
        else:
            seq_list = [base + rng.randint(0, 200) for _ in range(count)]
        mark_list = [rng.choice((0, 0, 0, 1, 2, 3)) if rng.random() < 0.2 else 0 for _ in seq_list]
        have = {b: rng.getrandbits(64) for b in rng.sample(range(40), rng.randint(0, 5))}
        start = rng.randint(0, count)
        stop = rng.randint(start, count + 3)
        hi = base + rng.randint(-5, 250)
        length = count + rng.choice((0, 4))  # outputs longer than what was placed, or not
        seen = []
        for impl in impls:
            blocks, dirty = dict(have), {7}
            seqs = array("q", seq_list + [0] * 4)[:length]
            marks = bytearray(mark_list + [0] * 4)[:length]
            res = impl(seqs, marks, start, stop, blocks, dirty, hi)
            seen.append((res, list(blocks.items()), dirty))
        assert seen[0] == seen[1]
        (end, new_hi, force), blocks_after, _dirty = seen[1]
        taken = seq_list[start:end]
        assert force == any(m & fastpath.MARK_ACKREQ for m in mark_list[start:end])
        assert new_hi == max([hi, *taken])
        for seq in taken:
            assert dict(blocks_after)[seq >> 6] >> (seq & 63) & 1


def test_note_arrivals_rejects_bad_arguments() -> None:
    """Both kernels refuse what the responder never passes, with the same exceptions, and
    change nothing."""
    for impl in _note_impls():
        blocks: dict[int, int] = {}
        dirty: set[int] = set()
        seqs, marks = array("q", [1, 2, 3]), bytearray(3)
        with pytest.raises(ValueError):
            impl(seqs, marks, -1, 3, blocks, dirty, 0)
        assert blocks == {} and dirty == set()
        # stop past either output is cut to the shorter one
        assert impl(seqs, bytearray(2), 0, 99, blocks, dirty, 0) == (2, 2, False)
        assert blocks == {0: 0b110} and dirty == {0}
        # a start past stop takes nothing
        assert impl(seqs, marks, 3, 1, blocks, dirty, 9) == (3, 9, False)
    native = _note_impls()[0]
    with pytest.raises(TypeError):
        native(array("i", [1]), bytearray(1), 0, 1, {}, set(), 0)
    with pytest.raises(TypeError):
        native(array("q", [1]), bytearray(1), 0, 1, {}, [], 0)  # type: ignore[arg-type]  # a list, not a set
    with pytest.raises(TypeError):
        native(array("q", [1]), bytearray(1), 0, 1)  # type: ignore[call-arg]  # too few on purpose


def test_single_datagram_is_a_train_of_one(rx_impl: str) -> None:
    pd, mr, region = _kernel_setup()
    rx = Receiver(pd, 16)
    one = _segment(mr, 0, b"z" * P)
    for seg in (0, S, 5 * S):
        rx.core.receive_train(memoryview(one), seg, 1, 0.0)
    assert rx.core.receive_train(memoryview(b""), 0, 1, 0.0) == {}
    qp = rx.qps[QPN]
    assert qp.stats.packets_received == 3 and qp.stats.duplicates == 2
    assert qp.responder.fast_placed == 1 and bytes(region[:P]) == b"z" * P
    assert rx.core.dropped_by_reason == {"short": 1} and rx.core.unaccounted() == 0


def test_mrc_native_0_forces_the_python_kernel() -> None:
    code = "from mrc.core import fastpath as f; print(f.NATIVE, f.place_train is f.py_place_train)"
    env = dict(os.environ, MRC_NATIVE="0")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.stdout.split() == ["False", "True"], res.stderr
    assert (
        "MRC_NATIVE=0"
        in subprocess.run(
            [sys.executable, "-c", "from mrc.core import fastpath; print(fastpath.describe())"],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    )


def test_train_acks_keep_ack_every_ackreq_and_ce(rx_impl: str) -> None:
    """What a train's ACKs must say on their own (not only as the single path says it),
    each ACK sent as it falls due (``ack_batch_max=1``): an ACK per ``ack_every`` arrivals,
    one at once for an AckReq'd segment, BECN when the subject carried CE, and the rest
    after the ACK delay."""
    pd, mr, _region = _kernel_setup()
    rx = Receiver(pd, 16, ack_batch_max=1)
    segs = [_segment(mr, s, b"a" * P) for s in range(40)]
    segs[5] = _segment(mr, 5, b"a" * P, ackreq=True)
    segs[21] = _segment(mr, 21, b"a" * P, marks=wire.BTH_FECN)
    assert rx.core.receive_train(memoryview(b"".join(segs)), S, 1, 0.0) == {QPN: 40}
    rx.drain(0.0)
    acks = [wire.parse_ack(d) for _q, _ev, d in rx.out]
    # AckReq at 5; then 16 more arrivals (6..21), the last with CE; then 16 more (22..37)
    assert [to_psn(IPSN, s) for s in (5, 21, 37)] == [a.subject_psn for a in acks]
    assert [bool(d[4] & wire.BTH_BECN) for _q, _ev, d in rx.out] == [False, True, False]
    assert [a.ack_psn for a in acks] == [to_psn(IPSN, s) for s in (5, 21, 37)]
    rx.drain(1.0)  # the ACK delay ran out: the two arrivals left waiting are acknowledged
    last = [wire.parse_ack(d) for _q, _ev, d in rx.out[len(acks) :]]
    assert [(a.subject_psn, a.ack_psn) for a in last] == [(to_psn(IPSN, 39), to_psn(IPSN, 39))]
    assert rx.qps[QPN].responder.fast_placed == 40


def test_acks_due_within_one_batch_go_out_as_one(rx_impl: str) -> None:
    """The ACKs that fall due while one batch is taken in (here a train) go out as one
    when the QP is next asked, about the batch's latest arrival; one whose subject
    carried CE goes at once (the mark is blamed on the EV it echoes). Fewer ACKs is what
    a receiver that falls behind its sender needs most (docs/PROTOCOL.md, section 6)."""
    pd, mr, _region = _kernel_setup()
    rx = Receiver(pd, 16)  # ack_batch_max 64, the default
    segs = [_segment(mr, s, b"a" * P) for s in range(100)]
    segs[5] = _segment(mr, 5, b"a" * P, ackreq=True)
    segs[21] = _segment(mr, 21, b"a" * P, marks=wire.BTH_FECN)
    assert rx.core.receive_train(memoryview(b"".join(segs[:40])), S, 1, 0.0) == {QPN: 40}
    assert rx.qps[QPN].get_timer() == 0.0  # an ACK is due now, for a caller that asks
    rx.drain(0.0)
    acks = [wire.parse_ack(d) for _q, _ev, d in rx.out]
    # due at 5 (AckReq), at 21 (16 later, with CE: at once), at 37: sent as 39's
    assert [(a.subject_psn, a.ack_psn) for a in acks] == [
        (to_psn(IPSN, 21), to_psn(IPSN, 21)),
        (to_psn(IPSN, 39), to_psn(IPSN, 39)),
    ]
    assert [bool(d[4] & wire.BTH_BECN) for _q, _ev, d in rx.out] == [True, False]
    assert rx.qps[QPN].get_timer() is None  # nothing waits for the delay
    # 60 more in one train: due at 55 and 71, then 64 unacknowledged arrivals at 103, which
    # is past the train: one flush again, one ACK: of the two 64-PSN blocks it saw, the
    # first is wholly below the cumulative point (99), which the second's ACK PSN says
    rx.core.receive_train(memoryview(b"".join(segs[40:100])), S, 1, 0.001)
    rx.drain(0.001)
    later = [wire.parse_ack(d) for _q, _ev, d in rx.out[2:]]
    assert [(a.subject_psn, a.sack_base, a.ack_psn) for a in later] == [
        (to_psn(IPSN, 99), to_psn(IPSN, 64), to_psn(IPSN, 99)),
    ]


def test_a_long_batch_still_acks_every_ack_batch_max_arrivals(rx_impl: str) -> None:
    """Coalescing is bounded: a batch longer than ``ack_batch_max`` gets an ACK at that
    many arrivals, so that a sender's window does not wait for the whole batch."""
    pd, mr, _region = _kernel_setup()
    rx = Receiver(pd, 4, ack_batch_max=10)
    segs = [_segment(mr, s, b"a" * P) for s in range(25)]
    assert rx.core.receive_train(memoryview(b"".join(segs)), S, 1, 0.0) == {QPN: 25}
    rx.drain(0.0)
    subjects = [wire.parse_ack(d).subject_psn for _q, _ev, d in rx.out]
    assert subjects == [to_psn(IPSN, s) for s in (9, 19, 24)]


def test_the_batch_bound_in_bytes_raises_the_one_in_packets(rx_impl: str) -> None:
    """Where ``ack_batch_bytes`` of a train's datagrams are more than ``ack_batch_max``
    of them, a batch gets an ACK at that many arrivals instead (small payloads: per bytes
    owed); where they are fewer, ``ack_batch_max`` holds."""
    pd, mr, _region = _kernel_setup()
    segs = [_segment(mr, s, b"a" * P) for s in range(25)]
    for batch_bytes, acked in ((20 * S, (19, 24)), (5 * S, (9, 19, 24))):
        rx = Receiver(pd, 4, ack_batch_max=10, ack_batch_bytes=batch_bytes)
        assert rx.core.receive_train(memoryview(b"".join(segs)), S, 1, 0.0) == {QPN: 25}
        rx.drain(0.0)
        subjects = [wire.parse_ack(d).subject_psn for _q, _ev, d in rx.out]
        assert subjects == [to_psn(IPSN, s) for s in acked]


def test_the_batch_bound_in_bytes_holds_for_lone_datagrams() -> None:
    """The same bound where datagrams come one by one (no GRO): within one batch, an ACK at
    ``ack_batch_bytes`` of them."""
    pd, mr, _region = _kernel_setup()
    rx = Receiver(pd, 4, ack_batch_max=10, ack_batch_bytes=20 * S)
    for s in range(25):
        rx.core.receive_datagram(memoryview(_segment(mr, s, b"a" * P)), 1, 0.0)
    rx.drain(0.0)
    subjects = [wire.parse_ack(d).subject_psn for _q, _ev, d in rx.out]
    assert subjects == [to_psn(IPSN, s) for s in (19, 24)]


def _runs_impls() -> list[fastpath.NoteRuns]:
    if fastpath.native_note_runs is None:
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
    return [fastpath.native_note_runs, fastpath.py_note_runs]


def _runs_case(rng: random.Random) -> tuple[list[int], list[int], dict[int, int], list[int]]:
    """Arrivals as trains bring them (consecutive, reordered, revisiting blocks, from below
    the cumulative point), marks anywhere (CE, AckReq), bitmaps holding bits already, and the
    responder's counters: (seqs, marks, blocks, [start, count, hi, cum, pending, next_due,
    ack_due, ack_every, ack_batch_max])."""
    count = rng.randint(0, 70)
    cum = rng.randint(-1, 600)
    base = cum + rng.randint(-3, 70)
    if rng.random() < 0.5:
        seqs = list(range(base, base + count))
    else:
        seqs = [base + rng.randint(0, 200) for _ in range(count)]
    marks = [rng.choice((0, 1, 2, 3)) if rng.random() < 0.15 else 0 for _ in seqs]
    near = max(cum, 0) >> 6
    blocks = {b: rng.getrandbits(64) for b in rng.sample(range(near, near + 6), rng.randint(0, 4))}
    if rng.random() < 0.3:  # the cumulative point's block holds a run above it
        blocks[(cum + 1) >> 6] = rng.getrandbits(64) | (1 << ((cum + 1) & 63))
    ack_every = rng.choice((1, 2, 3, 16, 40))
    ack_batch_max = rng.choice((1, 5, 64, 100))
    pending = rng.randint(0, 80)
    next_due = pending + rng.randint(0, ack_every)
    start = rng.randint(0, count)
    return (
        seqs,
        marks,
        blocks,
        [
            start,
            count,
            base + rng.randint(-5, 250),
            cum,
            pending,
            next_due,
            rng.random() < 0.3,
            ack_every,
            ack_batch_max,
        ],
    )


@pytest.mark.parametrize("seed", range(4))
def test_both_note_runs_kernels_record_the_same_runs(seed: int) -> None:
    """Random trains, each taken to its end as the responder takes it (a flush between calls
    resets the counters): the C kernel leaves exactly the twin's results, blocks (insertion
    order included) and dirty set, call after call."""
    impls = _runs_impls()
    rng = random.Random(seed)
    flushes = dues = advanced = 0
    for _ in range(500):
        seq_list, mark_list, have, args = _runs_case(rng)
        seen = []
        for impl in impls:
            blocks, dirty = dict(have), {3}
            seqs, marks = array("q", seq_list), bytearray(mark_list)
            start, count, hi, cum, pending, next_due, due, every, most = args
            ack_due = bool(due)
            calls = []
            i = start
            while True:
                res = impl(seqs, marks, i, count, blocks, dirty, hi, cum, pending, next_due,
                           ack_due, every, most)  # fmt: skip
                calls.append(res)
                i, hi, cum, pending, next_due, flags = res
                if flags & fastpath.RUN_FLUSH:
                    pending, next_due, ack_due = 0, every, False
                elif flags & fastpath.RUN_DUE:
                    ack_due = True
                if i >= count:
                    break
            seen.append((calls, list(blocks.items()), dirty))
        assert seen[0] == seen[1]
        calls = seen[1][0]
        flushes += sum(bool(c[5] & fastpath.RUN_FLUSH) for c in calls)
        dues += sum(bool(c[5] & fastpath.RUN_DUE) for c in calls)
        advanced += calls[-1][2] != args[3]
    assert flushes > 50 and dues > 50 and advanced > 50  # every branch was taken


def test_note_runs_rejects_bad_arguments() -> None:
    """Both kernels refuse what the responder never passes (indices outside the arrivals,
    counters out of range, which in C could overflow), with the same exceptions, and change
    nothing; an empty range returns the counters as they were."""
    lim = 1 << 62
    ok = [0, 0, 1, 1, 0, 16, False, 16, 64]  # hi, cum, pending, next_due, ack_due, every, max
    bad = {
        "start<0": {0: -1},
        "count>len": {1: 4},
        "start>count": {0: 3, 1: 2},
        "hi": {2: lim},
        "cum": {3: -lim},
        "pending": {4: -1},
        "next_due": {5: lim},
        "ack_every": {7: 0},
        "ack_batch_max": {8: lim},
    }
    for impl in _runs_impls():
        seqs, marks = array("q", [5, 6, 7]), bytearray(3)
        for name, change in bad.items():
            args = [*ok]
            args[1] = 3
            for k, v in change.items():
                args[k] = v
            blocks: dict[int, int] = {0: 1}
            dirty: set[int] = set()
            start, count, *rest = args
            with pytest.raises(ValueError):
                impl(seqs, marks, start, count, blocks, dirty, *rest)  # type: ignore[arg-type]
            assert blocks == {0: 1} and dirty == set(), name
        # a count past the shorter output is refused, not cut: the responder never asks it
        with pytest.raises(ValueError):
            impl(seqs, bytearray(2), 0, 3, {}, set(), 0, 1, 0, 16, False, 16, 64)
        assert impl(seqs, marks, 2, 2, {}, set(), 9, 4, 7, 16, True, 16, 64) == (2, 9, 4, 7, 16, 0)
        # huge sequence numbers from the array itself stay in 64 bits
        big = array("q", [(1 << 63) - 1, -(1 << 63)])
        blocks2: dict[int, int] = {}
        res = impl(big, bytearray(2), 0, 2, blocks2, set(), 0, 0, 0, 99, False, 99, 99)
        assert res[:2] == (2, (1 << 63) - 1)
    native = _runs_impls()[0]
    with pytest.raises(TypeError):
        native(array("i", [1]), bytearray(1), 0, 1, {}, set(), 0, 0, 0, 1, False, 1, 1)
    with pytest.raises(TypeError):
        native(array("q", [1]), bytearray(1), 0, 1, {}, [], 0, 0, 0, 1, False, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native(array("q", [1]), bytearray(1), 0, 1)  # type: ignore[call-arg]


_ANY = st.integers(min_value=-(1 << 64), max_value=1 << 64)
_NEAR = st.integers(min_value=-3, max_value=300)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=st.lists(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1) | _NEAR, max_size=40),
    marks=st.binary(max_size=44),
    start=st.integers(min_value=-2, max_value=45),
    count=st.integers(min_value=-2, max_value=45),
    counters=st.lists(_ANY | _NEAR, min_size=6, max_size=6),
    ack_due=st.booleans(),
)
def test_note_runs_kernels_agree_on_anything(
    seqs: list[int],
    marks: bytes,
    start: int,
    count: int,
    counters: list[int],
    ack_due: bool,
) -> None:
    """Any arguments of the right types, in range or not: the C kernel and its twin give the
    same result, or both raise the same exception; the C one never crashes."""
    impls = _runs_impls()
    hi, cum, pending, next_due, every, most = counters
    seen: list[object] = []
    for impl in impls:
        blocks: dict[int, int] = {0: 0b1011, 1: 1 << 63}
        dirty: set[int] = set()
        try:
            res: object = impl(array("q", seqs), bytearray(marks), start, count, blocks, dirty,
                               hi, cum, pending, next_due, ack_due, every, most)  # fmt: skip
        except (ValueError, OverflowError) as exc:
            res = type(exc)
        seen.append((res, list(blocks.items()), dirty))
    assert seen[0] == seen[1]
