"""The sender's records in C (mrc._native: Packet, record_burst, take_acked, take_ack) and
their pure-Python twins (mrc.core.fastpath: PyPacket, py_record_burst, py_take_acked,
py_take_ack).

Two levels: the kernels alone, over seeded random bursts and ACKs, must leave the same records,
ring, buffers, lists and callbacks; and whole seeded simulations (loss, trims, duplicates,
reordering; one way, both ways, three into one) must put the same datagrams on the wire at
the same times and end with the same events, counters and bytes with either pair.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrc import wire
from mrc.core import QPConfig, fastpath

from .mrcsim_harness import RecordingNetwork, Transfer, make_transfer, plan_writes
from .test_sim_invariants import MIXES, Mix, build, check_run

FIELDS = fastpath.PyPacket.__slots__


def _need_native() -> None:
    if (
        fastpath.native_record_burst is None
        or fastpath.native_take_acked is None
        or fastpath.native_take_ack is None
    ):
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")


def _state(pkt: Any) -> tuple[object, ...]:
    return tuple(getattr(pkt, f) for f in FIELDS)


# ---- the record type ------------------------------------------------------------------------


def test_packet_has_the_reference_attributes_and_defaults() -> None:
    _need_native()
    assert fastpath.native_packet is not None
    wr = object()
    args = (wr, 8192, 1400, True, 3, 1.25, 2.5)
    native, python = fastpath.native_packet(*args), fastpath.PyPacket(*args)
    assert _state(native) == _state(python)
    assert native.wr is wr and native.probed is None and native.timeouts == 0
    # every attribute the requester writes, written the way it writes them
    for pkt in (native, python):
        pkt.ev = 7
        pkt.sent_at = 3.5
        pkt.deadline = float("inf")
        pkt.timeouts += 2
        pkt.nacks += 1
        pkt.nacked = pkt.retransmitted = pkt.ambiguous = pkt.silenced = True
        pkt.probed = [(7, 3.5)]
        pkt.probed.append((1, 0.5))
    assert _state(native) == _state(python)
    native.probed = python.probed = None
    assert _state(native) == _state(python)


def test_packet_refuses_what_the_reference_cannot_hold() -> None:
    _need_native()
    assert fastpath.native_packet is not None
    with pytest.raises(TypeError):
        fastpath.native_packet(None, 0, 0, False, 0, 0.0)  # too few
    with pytest.raises(TypeError):
        fastpath.native_packet(None, "0", 0, False, 0, 0.0, 1.0)
    pkt = fastpath.native_packet(None, 0, 0, False, 0, 0.0, 1.0)
    with pytest.raises(TypeError):
        pkt.deadline = "soon"
    with pytest.raises(AttributeError):
        pkt.colour = 1  # no other attributes, as the reference's __slots__


# ---- record_burst ---------------------------------------------------------------------------


def _burst_args(rng: random.Random, outstanding: dict[int, Any], ring: array[int]) -> list[Any]:
    hbuf = bytearray(rng.randbytes(4096))
    data = bytearray(rng.randbytes(1 << 16))
    n = rng.randint(1, 40)
    payload = rng.randint(0, 1400)
    last_len = rng.randint(0, payload)
    final = rng.choice([wire.DATA_HDR_LEN, wire.DATA_IMM_HDR_LEN])
    h = rng.randrange(0, 4096 - (n - 1) * wire.DATA_HDR_LEN - final + 1)
    off = rng.randrange(0, len(data) - (n - 1) * payload - last_len + 1)
    return [
        outstanding,
        ring,
        ("wr", rng.random()),
        memoryview(hbuf),
        memoryview(data),
        rng.randrange(0, 1 << 30),
        n,
        rng.randrange(0, 64),
        rng.randrange(0, 1 << 20),
        h,
        off,
        payload,
        last_len,
        rng.random() < 0.5,
        final,
        rng.uniform(0, 1e4),
        rng.choice([rng.uniform(0, 1e4), float("inf")]),
        [],
    ]


@pytest.mark.parametrize("seed", range(6))
def test_record_burst_twins_leave_the_same_records_ring_and_buffers(seed: int) -> None:
    _need_native()
    assert fastpath.native_record_burst is not None
    rng = random.Random(seed)
    outs: dict[str, tuple[dict[int, Any], array[int], list[list[object]]]] = {
        "native": ({}, array("q", [0]) * 64, []),
        "python": ({}, array("q", [0]) * 64, []),
    }
    for _ in range(30):
        state = rng.getstate()
        for name, kernel in (
            ("native", fastpath.native_record_burst),
            ("python", fastpath.py_record_burst),
        ):
            rng.setstate(state)
            outstanding, ring, sent = outs[name]
            args = _burst_args(rng, outstanding, ring)
            kernel(*args)
            bufs = args[-1]
            assert len(bufs) == 2 * args[6]
            assert all(isinstance(b, memoryview) and not b.readonly for b in bufs)
            sent.append([(bytes(b), len(b), b.nbytes, b.contiguous, b.format) for b in bufs])
    (n_out, n_ring, n_sent), (p_out, p_ring, p_sent) = outs["native"], outs["python"]
    assert n_sent == p_sent
    assert n_ring == p_ring
    assert n_out.keys() == p_out.keys()
    assert {s: _state(p) for s, p in n_out.items()} == {s: _state(p) for s, p in p_out.items()}
    assert {type(p) for p in n_out.values()} == {fastpath.native_packet}


def test_record_burst_buffers_are_views_into_the_arena_and_the_request() -> None:
    """The header views are written in place after the call (AckReq of a burst's last
    packet): they must be the arena's bytes, not copies, in both twins."""
    _need_native()
    for kernel in (fastpath.native_record_burst, fastpath.py_record_burst):
        assert kernel is not None
        hbuf, data = bytearray(200), bytearray(range(100))
        bufs: list[Any] = []
        ring = array("q", [0]) * 8
        kernel({}, ring, None, memoryview(hbuf), memoryview(data), 0, 3, 0, 1, 10, 5,
               20, 7, True, wire.DATA_IMM_HDR_LEN, 0.0, 1.0, bufs)  # fmt: skip
        assert [len(b) for b in bufs] == [28, 20, 28, 20, 32, 7]
        bufs[4][8] = 0x80
        assert hbuf[10 + 2 * 28 + 8] == 0x80
        assert bytes(bufs[5]) == bytes(data[45:52])


def test_record_burst_twins_cut_views_alike_past_their_end() -> None:
    """A view sliced past its end is cut short, as Python slicing does, by both twins (the C
    one cuts plain byte views by hand, so it must fall back to slicing here)."""
    _need_native()
    got = []
    for kernel in (fastpath.native_record_burst, fastpath.py_record_burst):
        assert kernel is not None
        hbuf, data = bytearray(range(40)), bytearray(range(30))
        bufs: list[Any] = []
        ring = array("q", [0]) * 8
        kernel({}, ring, None, memoryview(hbuf), memoryview(data), 0, 2, 0, 1, 20, 10,
               16, 16, False, 28, 0.0, 1.0, bufs)  # fmt: skip
        got.append([bytes(b) for b in bufs])
    assert got[0] == got[1]
    assert [len(b) for b in got[0]] == [20, 16, 0, 4]


def test_record_burst_twins_refuse_the_same_bad_arguments() -> None:
    _need_native()
    for kernel in (fastpath.native_record_burst, fastpath.py_record_burst):
        assert kernel is not None
        view = memoryview(bytearray(64))
        good: list[Any] = [
            {},
            array("q", [0]) * 8,
            None,
            view,
            view,
            0,
            1,
            0,
            0,
            0,
            0,
            8,
            8,
            False,
            28,
            0.0,
            1.0,
            [],
        ]
        kernel(*good)  # (the good ones are good)
        for pos, bad in ((1, array("q", [0]) * 6), (1, array("q")), (6, 0)):
            args = list(good)
            args[pos] = bad
            with pytest.raises(ValueError):
                kernel(*args)
        # the ring is an array of 64-bit entries, nothing else
        for ring in ([0] * 8, array("i", [0]) * 8, bytearray(64)):
            args = list(good)
            args[1] = ring
            with pytest.raises(TypeError):
                kernel(*args)


# ---- take_acked -----------------------------------------------------------------------------


def _flight(rng: random.Random, kind: type, evs: int) -> dict[int, Any]:
    """A seeded flight of records of ``kind``, some queued for a resend (deadline inf)."""
    out: dict[int, Any] = {}
    for seq in range(1000, 1200):
        if rng.random() < 0.8:
            deadline = float("inf") if rng.random() < 0.1 else rng.uniform(0, 50)
            out[seq] = kind(None, 0, 8, False, rng.randrange(evs), rng.uniform(0, 40), deadline)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("track", [False, True])
@pytest.mark.parametrize("judging", [False, True])
def test_take_acked_twins_take_and_note_the_same(seed: int, track: bool, judging: bool) -> None:
    _need_native()
    assert fastpath.native_take_acked is not None and fastpath.native_packet is not None
    results = []
    for kernel, kind in (
        (fastpath.native_take_acked, fastpath.native_packet),
        (fastpath.py_take_acked, fastpath.PyPacket),
        # either kernel must take the other's records too (tests swap kernels)
        (fastpath.native_take_acked, fastpath.PyPacket),
    ):
        rng = random.Random(seed)
        evs = 12
        planes = [rng.randrange(3) for _ in range(evs)]
        route_ix = [rng.randrange(5) for _ in range(evs)]
        outstanding = _flight(rng, kind, evs)
        calls: list[tuple[int, float]] = []
        seen = []
        for _ack in range(25):
            start = rng.randrange(990, 1210)
            stop = start + rng.randrange(0, 20)
            sacked = rng.sample(range(990, 1210), rng.randrange(0, 10))
            delivered = [float("-inf")] * 3
            route_alive = [rng.choice([float("-inf"), rng.uniform(0, 40)]) for _ in range(5)]
            res = kernel(
                outstanding,
                start,
                stop,
                sacked,
                planes,
                delivered,
                route_ix if track else None,
                route_alive,
                (lambda ev, at: calls.append((ev, at))) if judging else None,  # noqa: B023
            )
            seen.append((res, delivered, route_alive))
        results.append((seen, sorted(outstanding), calls))
    assert results[0] == results[1] == results[2]
    assert any(r[0][0] for r in results[0][0])  # something was taken
    assert any(r[0][1] for r in results[0][0])  # and some were queued resends


def test_take_acked_passes_on_what_judging_raises() -> None:
    _need_native()

    def judge(ev: int, at: float) -> None:
        raise RuntimeError("judged")

    for kernel, kind in (
        (fastpath.native_take_acked, fastpath.native_packet),
        (fastpath.py_take_acked, fastpath.PyPacket),
    ):
        assert kernel is not None and kind is not None
        outstanding = {5: kind(None, 0, 8, False, 0, 1.0, 2.0)}
        with pytest.raises(RuntimeError, match="judged"):
            kernel(outstanding, 5, 6, [], [0], [0.0], None, [], judge)
        with pytest.raises(IndexError):  # an EV beyond the planes' list
            kernel({6: kind(None, 0, 8, False, 9, 1.0, 2.0)}, 6, 7, [], [0], [0.0], None, [], None)


# ---- take_ack -------------------------------------------------------------------------------


def _ack_fields(rng: random.Random, ip: int, una: int, nxt: int) -> tuple[int, int, int]:
    """An ACK's cumulative PSN word, bitmap base and bitmap as a receiver (or a forger) sends
    them: mostly near what was sent, sometimes beyond it or far behind, with the top byte of
    the PSN word set (it carries other fields on the wire)."""
    cum = rng.choice([una - 1, rng.randint(una - 3, nxt + 2), rng.randint(0, 1 << 24)])
    psnw = ((ip + cum) & wire.PSN_MASK) | (rng.getrandbits(8) << 24)
    base_seq = rng.choice([cum + 1, (cum + 1) & ~63, rng.randint(una - 70, nxt + 70)])
    base = ((ip + base_seq) & wire.PSN_MASK) | (rng.choice([0, 1 << 31]))
    bitmap = rng.choice([0, rng.getrandbits(64), (1 << 64) - 1, rng.getrandbits(8) << 40])
    return psnw, base, bitmap


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("track", [False, True])
@pytest.mark.parametrize("judging", [False, True])
def test_take_ack_twins_take_and_move_alike(seed: int, track: bool, judging: bool) -> None:
    """Random flights and ACKs (cumulative, SACKs in and beyond what was sent, far-off PSNs,
    the initial PSN near the wrap): the C kernel and its twin return the same, leave the same
    records and lists and make the same calls, with either kind of record."""
    _need_native()
    assert fastpath.native_take_ack is not None and fastpath.native_packet is not None
    results = []
    for kernel, kind in (
        (fastpath.native_take_ack, fastpath.native_packet),
        (fastpath.py_take_ack, fastpath.PyPacket),
        (fastpath.native_take_ack, fastpath.PyPacket),
    ):
        rng = random.Random(seed)
        evs = 12
        planes = [rng.randrange(3) for _ in range(evs)]
        route_ix = [rng.randrange(5) for _ in range(evs)]
        ip = rng.choice([0, wire.PSN_MASK - 40, rng.randrange(1 << 24)])
        outstanding = _flight(rng, kind, evs)  # sequence numbers 1000-1199, some missing
        una, nxt = min(outstanding), 1200
        calls: list[tuple[int, float]] = []
        seen = []
        for _ack in range(40):
            psnw, base, bitmap = _ack_fields(rng, ip, una, nxt)
            delivered = [float("-inf")] * 3
            route_alive = [rng.choice([float("-inf"), rng.uniform(0, 40)]) for _ in range(5)]
            res = kernel(
                outstanding,
                ip,
                una,
                nxt,
                psnw,
                base,
                bitmap,
                planes,
                delivered,
                route_ix if track else None,
                route_alive,
                (lambda ev, at: calls.append((ev, at))) if judging else None,  # noqa: B023
            )
            una = res[2]
            seen.append((res, delivered, route_alive))
        results.append((seen, sorted(outstanding), calls))
    assert results[0] == results[1] == results[2]
    rows = [r[0] for r in results[0][0]]
    assert any(r[3] for r in rows) and any(r[5] for r in rows)  # took some; saw "beyond"
    assert any(r[2] > r[0] for r in rows)  # SACKs moved the cumulative point further


def test_take_ack_twins_refuse_the_same_bad_arguments() -> None:
    """Fields no ACK or sender has (beyond their widths, negative, una past nxt): ValueError
    from both, and nothing taken."""
    _need_native()
    lim = 1 << 62
    good = [0, 5, 10, 6, 0, 0]  # ip, una, nxt, psnw, base, bitmap
    bad = [
        (0, -1), (0, 1 << 24), (1, -1), (1, 11), (2, lim), (3, -1), (3, 1 << 32),
        (4, 1 << 32), (5, -1), (5, 1 << 64), (2, 1 << 70),
    ]  # fmt: skip
    for kernel, kind in (
        (fastpath.native_take_ack, fastpath.native_packet),
        (fastpath.py_take_ack, fastpath.PyPacket),
    ):
        assert kernel is not None and kind is not None
        for i, value in bad:
            args = [*good]
            args[i] = value
            outstanding = {s: kind(None, 0, 8, False, 0, 1.0, 2.0) for s in range(5, 10)}
            ip, una, nxt, psnw, base, bitmap = args
            with pytest.raises(ValueError):
                kernel(outstanding, ip, una, nxt, psnw, base, bitmap, [0], [0.0], None, [], None)
            assert sorted(outstanding) == list(range(5, 10)), (i, value)
        outstanding = {s: kind(None, 0, 8, False, 0, 1.0, 2.0) for s in range(5, 10)}
        # 5 and 6 acknowledged cumulatively, then the SACK of 8 alone (seq = PSN here)
        assert kernel(outstanding, 0, 5, 10, 6, 0, 1 << 8, [0], [0.0], None, [], None) == (
            7,
            0,
            7,
            3,
            0,
            False,
        )
        assert sorted(outstanding) == [7, 9]
        with pytest.raises(IndexError):  # an EV beyond the planes' list
            kernel({5: kind(None, 0, 8, False, 9, 1.0, 2.0)}, 0, 5, 6, 5, 0, 0, [0], [0.0],
                   None, [], None)  # fmt: skip


class _Float(float):
    """A float of another type: read through, never held in C (take_one's Held)."""


def _odd_lists(case: str, rng: random.Random) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(planes, delivered, route_ix, route_alive) that the C kernels' held send times must
    treat as the twin does: items not floats, lists that are one, more routes than are held,
    indexes out of range part way, NaN."""
    nan, ninf = float("nan"), float("-inf")
    planes: list[Any] = [ev % 3 for ev in range(12)]
    delivered: list[Any] = [ninf] * 3
    route_ix: list[Any] = [ev % 5 for ev in range(12)]
    route_alive: list[Any] = [rng.choice([ninf, rng.uniform(0, 40)]) for _ in range(5)]
    if case == "ints":
        delivered = [0, 5, -3]
        route_alive = [0, 10, 20, 30, True]
    elif case == "subclass":
        delivered = [_Float(ninf), _Float(7.0), ninf]
        route_alive = [_Float(3.0)] * 5
    elif case == "delivered_is_route_alive":
        delivered = route_alive = [ninf] * 5
    elif case == "planes_is_delivered":
        delivered = planes = [0, 1, 2] + [0] * 9
    elif case == "route_ix_is_route_alive":
        route_ix = route_alive = [0, 1, 2, 3, 4] + [0] * 7
    elif case == "many_routes":  # more than the kernel holds in C (512)
        route_ix = [rng.randrange(700) for _ in range(12)]
        route_alive = [rng.choice([ninf, rng.uniform(0, 40)]) for _ in range(700)]
    elif case == "short_planes":  # an IndexError part way, after some records were taken
        planes = [0, 1, 2, 0, 1, 2, 0, 1]
    elif case == "short_routes":
        route_ix = [ev % 7 for ev in range(12)]
    elif case == "nan":
        delivered = [nan, ninf, 5.0]
        route_alive = [nan, 1.0, ninf, nan, 3.0]
    return planes, delivered, route_ix, route_alive


_ODD = [
    "ints", "subclass", "delivered_is_route_alive", "planes_is_delivered",
    "route_ix_is_route_alive", "many_routes", "short_planes", "short_routes", "nan",
]  # fmt: skip


@pytest.mark.parametrize("case", _ODD)
@pytest.mark.parametrize("seed", range(4))
def test_take_ack_twins_note_alike_in_odd_lists(case: str, seed: int) -> None:
    """The C kernels hold the latest send times of an ACK in C and write them back once
    (KERNEL_VERSION 11): whatever the lists hold or however they overlap, what they end
    with, the records left and the exception raised (its type) are the twin's, ACK after
    ACK, for take_ack and take_acked alike."""
    _need_native()
    assert fastpath.native_take_ack is not None and fastpath.native_take_acked is not None
    assert fastpath.native_packet is not None
    seen = []
    for ack, acked, kind in (
        (fastpath.native_take_ack, fastpath.native_take_acked, fastpath.native_packet),
        (fastpath.py_take_ack, fastpath.py_take_acked, fastpath.PyPacket),
        (fastpath.native_take_ack, fastpath.native_take_acked, fastpath.PyPacket),
    ):
        rng = random.Random(seed)
        outstanding = _flight(rng, kind, 12)
        if case == "nan":
            for pkt in list(outstanding.values())[::7]:
                pkt.sent_at = float("nan")
        planes, delivered, route_ix, route_alive = _odd_lists(case, rng)
        una, nxt, rows = min(outstanding), 1200, []
        for i in range(30):
            try:
                if i % 2:
                    start = rng.randrange(990, 1210)
                    sacked = rng.sample(range(990, 1210), rng.randrange(0, 10))
                    res: object = acked(outstanding, start, start + rng.randrange(0, 20),
                                        sacked, planes, delivered, route_ix, route_alive,
                                        None)  # fmt: skip
                else:
                    psnw, base, bitmap = _ack_fields(rng, 0, una, nxt)
                    res = ack(outstanding, 0, una, nxt, psnw, base, bitmap, planes, delivered,
                              route_ix, route_alive, None)  # fmt: skip
                    una = res[2]
            except (IndexError, TypeError) as exc:
                res = type(exc)
            # repr: NaN compares unequal to itself; the items' types count too
            rows.append((res, repr(delivered), repr(route_alive), repr(planes),
                         [type(x).__name__ for x in (*delivered, *route_alive)]))  # fmt: skip
        seen.append((rows, sorted(outstanding)))
    assert seen[0] == seen[1] == seen[2]


_WIDE = st.integers(min_value=-(1 << 65), max_value=1 << 65)


@settings(max_examples=400, deadline=None)
@given(
    ip=st.integers(min_value=0, max_value=wire.PSN_MASK) | _WIDE,
    una=st.integers(min_value=990, max_value=1210) | _WIDE,
    span=st.integers(min_value=0, max_value=300),
    psnw=st.integers(min_value=0, max_value=(1 << 32) - 1) | _WIDE,
    base=st.integers(min_value=0, max_value=(1 << 32) - 1) | _WIDE,
    bitmap=st.integers(min_value=0, max_value=(1 << 64) - 1) | _WIDE,
)
def test_take_ack_twins_agree_on_any_fields(
    ip: int, una: int, span: int, psnw: int, base: int, bitmap: int
) -> None:
    """Whatever an ACK's fields and the sender's counters (in range or not): the same result
    and records left from both, or the same exception and nothing taken; C never crashes."""
    _need_native()
    assert fastpath.native_take_ack is not None and fastpath.native_packet is not None
    seen: list[object] = []
    for kernel, kind in (
        (fastpath.native_take_ack, fastpath.native_packet),
        (fastpath.py_take_ack, fastpath.PyPacket),
    ):
        outstanding = {s: kind(None, 0, 8, False, s % 3, s / 7, 2.0) for s in range(1000, 1200)}
        delivered = [float("-inf")] * 3
        try:
            res: object = kernel(outstanding, ip, una, una + span, psnw, base, bitmap,
                                 [0, 1, 2], delivered, None, [], None)  # fmt: skip
        except ValueError as exc:
            res = type(exc)
        seen.append((res, sorted(outstanding), delivered))
    assert seen[0] == seen[1]


# ---- whole simulations ----------------------------------------------------------------------


def _bursty(mix: Mix, seed: int) -> tuple[RecordingNetwork, list[Transfer]]:
    """Fixed bursts of 8 over 4 planes: most records are made 8 at a time."""
    rng = random.Random(seed)
    net = RecordingNetwork(seed, mix.faults())
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, burst=8, cc="fixed", max_outstanding=64)
    qa, qb = net.connect("a", "b", evs=16, planes=4, config=cfg, psn_a=wire.PSN_MASK - 50)
    t = make_transfer(net, "a", "b", qa, qb, [300_000], seed)
    plan_writes(t, rng, 250_000)
    return net, [t]


def _simulate(mix: Mix, seed: int, kind: str) -> dict[str, Any]:
    net, transfers = _bursty(mix, seed) if kind == "bursty" else build(mix, seed, kind)
    check_run(mix, net, transfers)
    qps = [q for h in net.hosts.values() for q in h.core.qps.values()]
    # what each datagram was, when and where it went (not its bytes: region addresses, rkeys
    # and probe tokens are random in every run) and every data transmission decoded
    sent = [(s.time, s.host, s.qpn, s.ev, s.data[0], len(s.data)) for s in net.sent]
    data = {k: [(d.time, d.seq, d.ev, d.length, d.imm, d.trimmed_flag) for d in v]
            for k, v in net.data_tx.items()}  # fmt: skip
    return {
        "wire": hashlib.sha256(repr((sent, data)).encode()).hexdigest(),
        "datagrams": len(net.sent),
        "events": [(t, h, repr(e)) for t, h, e in net.event_times],
        "stats": [q.stats.as_dict() for q in qps],
        "evs": [(q.evs.packets, q.evs.values) for q in qps],
        "regions": [hashlib.sha256(b).hexdigest() for t in transfers for b in t.buffers],
        "end": net.now,
    }


@pytest.mark.parametrize("kind", ["one_way", "bidirectional", "three_to_one", "bursty"])
@pytest.mark.parametrize("mix", MIXES, ids=[m.name for m in MIXES])
def test_simulations_are_identical_with_either_pair_of_sender_kernels(
    monkeypatch: pytest.MonkeyPatch, mix: Mix, kind: str
) -> None:
    _need_native()
    runs = {}
    for name, record, take, ack in (
        ("native", fastpath.native_record_burst, fastpath.native_take_acked,
         fastpath.native_take_ack),
        ("python", fastpath.py_record_burst, fastpath.py_take_acked, fastpath.py_take_ack),
    ):  # fmt: skip
        monkeypatch.setattr(fastpath, "record_burst", record)
        monkeypatch.setattr(fastpath, "take_acked", take)
        monkeypatch.setattr(fastpath, "take_ack", ack)
        runs[name] = [_simulate(mix, seed, kind) for seed in (3, 4)]
    assert runs["native"] == runs["python"]
    assert all(r["datagrams"] for r in runs["native"])
    if kind == "bursty":  # the runs did send whole bursts
        assert all(r["stats"][0]["data_packets_sent"] >= 4 * r["stats"][0]["bursts"]
                   for r in runs["native"])  # fmt: skip
