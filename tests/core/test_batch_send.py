"""The batch send path: bursts straight from the core, their headers from one kernel call.

``fastpath.pack_burst`` exists twice (the C kernel in mrc._native and its pure-Python twin);
both must write exactly what ``wire.pack_data`` gives packet by packet, for any values,
including the hostile ones (PSN wrap, a zero-length or WRITE_IMM last packet, the top of the
64-bit address space). Above it, the requester must hand out bursts GSO can send whole, keep
headers it handed out unchanged (a send may wait in the transport's backlog), keep one timer
entry per burst without losing any packet's timeout, and a seeded simulator run must put the
same bytes on the wire with either kernel.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrc import wire
from mrc.core import Access, ProtectionDomain, QPConfig, QueuePair, fastpath
from mrc.core.events import Burst, EVState, datagrams_of, is_gathered
from mrc.lab.sim import Faults
from mrc.security.packet import DirectionKeys, Mode, Protection

from .mrcsim_harness import RecordingNetwork, fuzz_settings, make_transfer, run_until

if TYPE_CHECKING:
    from mrc.core.fastpath import PackBurst

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
EVS = 8
PROBES = (wire.Opcode.PROBE, wire.Opcode.PROBE_REPLY)


def _impls() -> list[object]:
    native = pytest.param(
        "native",
        marks=pytest.mark.skipif(
            fastpath.native_pack_burst is None, reason=f"mrc._native: {fastpath.describe()}"
        ),
    )
    return [native, "python"]


def _impl(name: str) -> PackBurst:
    fn = fastpath.native_pack_burst if name == "native" else fastpath.py_pack_burst
    assert fn is not None
    return fn


@pytest.fixture(params=_impls())
def pack(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> PackBurst:
    """Each implementation of pack_burst, also installed as the one the requester calls."""
    fn = _impl(request.param)
    monkeypatch.setattr(fastpath, "pack_burst", fn)
    gather = fastpath.native_gather_burst if request.param == "native" else None
    monkeypatch.setattr(fastpath, "gather_burst", gather or fastpath.py_gather_burst)
    return fn


def _expected(
    qpn: int,
    psn: int,
    va: int,
    rkey: int,
    size: int,
    count: int,
    last_size: int,
    last: bool,
    imm: int,
) -> bytes:
    """The same headers, one wire.pack_data call per packet."""
    out = b""
    for i in range(count):
        final = i == count - 1
        out += wire.pack_data(
            qpn,
            (psn + i) & wire.PSN_MASK,
            va + i * size,
            rkey,
            last_size if final else size,
            last and final,
            imm if final and imm >= 0 else None,
        )
    return out


def _check(pack: PackBurst, off: int, *fields: int | bool) -> None:
    want = _expected(*fields)  # type: ignore[arg-type]
    buf = bytearray(b"\xee" * (off + len(want) + 7))
    end = pack(buf, off, *fields)  # type: ignore[arg-type]
    assert end == off + len(want)
    assert bytes(buf[off:end]) == want
    assert buf[:off] == b"\xee" * off and buf[end:] == b"\xee" * 7  # nothing else touched


@pytest.mark.parametrize("impl", _impls())
@fuzz_settings(200)
@given(
    off=st.integers(0, 40),
    qpn=st.integers(0, wire.QPN_MASK),
    psn=st.one_of(st.integers(0, wire.PSN_MASK), st.integers(wire.PSN_MASK - 70, wire.PSN_MASK)),
    rkey=st.integers(0, U32),
    size=st.integers(0, 65_000),
    count=st.integers(1, 64),
    last_size=st.integers(0, 65_000),
    last=st.booleans(),
    imm=st.one_of(st.just(-1), st.integers(0, U32)),
    data=st.data(),
)
def test_both_kernels_write_what_pack_data_writes(
    impl: str,
    off: int,
    qpn: int,
    psn: int,
    rkey: int,
    size: int,
    count: int,
    last_size: int,
    last: bool,
    imm: int,
    data: st.DataObject,
) -> None:
    top = U64 - (count - 1) * size  # the last packet's address still fits 64 bits
    va = data.draw(st.one_of(st.integers(0, top), st.integers(max(0, top - 100), top)))
    _check(_impl(impl), off, qpn, psn, va, rkey, size, count, last_size, last, imm)


@pytest.mark.parametrize(
    "fields",
    [
        # the PSN wraps inside the burst; AckReq and WRITE_IMM on its last packet
        (0x123, wire.PSN_MASK, 1 << 40, 7, 8192, 16, 100, True, 0xDEADBEEF),
        (0x123, wire.PSN_MASK - 3, 1 << 40, 7, 8192, 4, 8192, True, -1),
        # a zero-length work request: one packet, no payload
        (1, 0, 0, 0, 0, 1, 0, True, -1),
        (1, 5, 0, 0, 0, 1, 0, True, 0),
        # the last packet is zero bytes, without and with an immediate
        (wire.QPN_MASK, 9, 4096, U32, 1400, 3, 0, True, U32),
        # not the end of a work request: no AckReq, no immediate
        (2, 77, U64 - 2 * 1400, 9, 1400, 3, 1400, False, -1),
        # every field at its top
        (wire.QPN_MASK, wire.PSN_MASK, U64, U32, U32, 1, U32, True, U32),
    ],
)
def test_hostile_values(pack: PackBurst, fields: tuple[int, ...]) -> None:
    _check(pack, 3, *fields)


@pytest.mark.parametrize(
    "args",
    [
        (0, 1, 0, 0, 0, 0, 0, 0, False, -1),  # no packets
        (0, 1, 0, 0, 0, 0, 0, -1, False, -1),
        (0, wire.QPN_MASK + 1, 0, 0, 0, 0, 1, 0, False, -1),  # QPN beyond 24 bits
        (0, 1, wire.PSN_MASK + 1, 0, 0, 0, 1, 0, False, -1),  # PSN beyond 24 bits
        (0, 1, -1, 0, 0, 0, 1, 0, False, -1),
        (0, 1, 0, -1, 0, 0, 1, 0, False, -1),  # negative address
        (0, 1, 0, U64, 0, 1, 2, 0, False, -1),  # the second packet's address beyond 64 bits
        (0, 1, 0, 1 << 64, 0, 0, 1, 0, False, -1),
        (0, 1, 0, 0, U32 + 1, 0, 1, 0, False, -1),  # rkey
        (0, 1, 0, 0, 0, U32 + 1, 2, 0, False, -1),  # size
        (0, 1, 0, 0, 0, 0, 1, U32 + 1, False, -1),  # last size
        (0, 1, 0, 0, 0, 0, 1, 0, False, -2),  # immediate
        (0, 1, 0, 0, 0, 0, 1, 0, False, U32 + 1),
        (0, 1, 0, 0, 0, 0, 1 << 80, 0, False, -1),  # a count no buffer holds
        (-1, 1, 0, 0, 0, 0, 1, 0, False, -1),  # before the buffer
        (70, 1, 0, 0, 0, 0, 1, 0, False, -1),  # 28 bytes from 70 do not fit 96
        (0, 1, 0, 0, 0, 0, 3, 0, False, 5),  # 2 x 28 + 32 do not fit 86 (below)
    ],
)
def test_out_of_range_is_refused_and_nothing_written(
    pack: PackBurst, args: tuple[int | bool, ...]
) -> None:
    buf = bytearray(86 if args[-1] == 5 else 96)
    with pytest.raises(ValueError):
        pack(buf, *args)  # type: ignore[arg-type]
    assert buf == bytearray(len(buf))


# ---- the requester's bursts ---------------------------------------------------------------


def _pair(
    payload: int = 100, burst: int = 8, cc: str = "fixed", ipsn: int = 0, tlp_max: int = 3
) -> tuple[QueuePair, QueuePair, int, int]:
    """A connected sender and receiver QP in memory; (a, b, region addr, rkey)."""
    cfg = QPConfig(payload_size=payload, burst=burst, cc=cc, max_outstanding=512, tlp_max=tlp_max)
    pd = ProtectionDomain()
    mr = pd.register(bytearray(1 << 20), Access.REMOTE_WRITE, "r")
    a = QueuePair(1, ProtectionDomain(), list(range(4000, 4000 + EVS)), None, cfg, ipsn)
    b = QueuePair(2, pd, list(range(5000, 5000 + EVS)), None, cfg, 300)
    a.connect(2, 300)
    b.connect(1, ipsn)
    return a, b, mr.addr, mr.rkey


def _wire(bursts: list[Burst]) -> list[tuple[int, bytes]]:
    """(EV, datagram bytes) of every datagram, in order."""
    return [(ev, hdr + bytes(payload)) for ev, hdr, payload in datagrams_of(bursts)]


def _head(burst: Burst, k: int) -> Burst:
    """The first ``k`` datagrams of ``burst``, as a burst."""
    ev, bufs, _n, seg = burst
    if is_gathered(bufs, _n):
        return (ev, [memoryview(bufs[0])[: k * seg]], k, seg)
    return (ev, bufs[: 2 * k], k, seg)


def _deliver(a: QueuePair, b: QueuePair, bursts: list[Burst], now: float) -> None:
    for ev, data in _wire(bursts):
        b.receive_datagram(memoryview(data), a.evs.values[ev], now)
    later = now + 2 * b.config.ack_delay  # past the receiver's ACK coalescing
    for ev, hdr, payload in b.datagrams_to_send(later):
        a.receive_datagram(memoryview(hdr + bytes(payload)), b.evs.values[ev], later)


def test_bursts_are_whole_and_the_datagram_list_is_derived_from_them(pack: PackBurst) -> None:
    a, b, addr, rkey = _pair(ipsn=wire.PSN_MASK - 5)  # PSNs wrap inside the first burst
    data = os.urandom(100 * 20 + 37)  # 21 packets: bursts of 8, 8, 5 (the last shorter)
    a.post_write(data, addr, rkey, imm=0xABCD)
    bursts = a.bursts_to_send(1.0)
    assert [(n, seg) for _ev, _b, n, seg in bursts] == [(8, 128), (8, 128), (5, 128)]
    assert len({ev for ev, *_x in bursts}) == 3  # each burst on its own EV
    # datagrams: consecutive PSNs, only the very last one a WRITE_IMM with AckReq
    sent = _wire(bursts)
    for seq, (_ev, dgram) in enumerate(sent):
        final = seq == 20
        want = wire.pack_data(
            2,
            (wire.PSN_MASK - 5 + seq) & wire.PSN_MASK,
            addr + 100 * seq,
            rkey,
            37 if final else 100,
            final,
            0xABCD if final else None,
        )
        assert dgram == want + data[100 * seq : 100 * seq + len(dgram) - len(want)]
    assert a.stats.bursts == 3 and a.stats.data_packets_sent == 21
    assert a.stats.bytes_sent == len(data) and sum(a.evs.packets) == 21
    _deliver(a, b, bursts, 1.0)
    assert a.idle and b.stats.bytes_placed == len(data)


def test_a_longer_write_imm_header_ends_the_gso_run(pack: PackBurst) -> None:
    # the last packet of 98 bytes with its 32-byte header is 130 bytes, longer than the
    # burst's 128-byte segments: GSO may only shorten the last segment, so it goes alone
    a, _b, addr, rkey = _pair()
    a.post_write(os.urandom(100 * 3 + 98), addr, rkey, imm=1)
    a.post_write(os.urandom(100 * 3 + 96), addr, rkey, imm=2)  # 128 bytes: it fits
    bursts = a.bursts_to_send(1.0)
    assert [(n, seg) for _ev, _b, n, seg in bursts] == [(3, 128), (1, 130), (4, 128)]
    assert bursts[0][0] == bursts[1][0] == bursts[2][0]  # still one burst on one EV
    for burst in bursts:
        sizes = [len(hdr) + len(payload) for _ev, hdr, payload in datagrams_of([burst])]
        assert len(sizes) == burst[2]
        assert sizes[0] == burst[3] and all(s <= burst[3] for s in sizes)


def test_a_zero_length_write_is_one_header_only_datagram(pack: PackBurst) -> None:
    a, b, addr, rkey = _pair()
    a.post_write(b"", addr, rkey, imm=7)
    bursts = a.bursts_to_send(1.0)
    assert [(n, seg) for _ev, _b, n, seg in bursts] == [(1, 32)]
    assert _wire(bursts)[0][1] == wire.pack_data(2, 0, addr, rkey, 0, True, 7)
    _deliver(a, b, bursts, 1.0)
    assert a.idle


def test_nscc_asks_for_an_ack_of_the_last_packet_of_a_window(pack: PackBurst) -> None:
    a, _b, addr, rkey = _pair(burst=4, cc="nscc")
    a.post_write(os.urandom(100 * 64), addr, rkey)
    sent = _wire(a.bursts_to_send(1.0))
    window = a.requester.cc.limit if a.requester.cc is not None else 0
    assert len(sent) == window < 64
    ackreq = [i for i, (_ev, d) in enumerate(sent) if d[8] & wire.BTH_ACKREQ]
    assert ackreq == [window - 1]  # not the end of the write: only the window's end


def test_headers_handed_out_are_never_written_again(pack: PackBurst) -> None:
    """What waits in a transport's backlog keeps its bytes while the core goes on sending:
    retransmissions (after a timeout) and enough new bursts to fill several header arenas."""
    a, _b, addr, rkey = _pair(burst=16)
    a.post_write(os.urandom(100 * 4096), addr, rkey)
    first = a.bursts_to_send(1.0)
    kept = _wire(first)
    # every packet times out, after an ACK of something new (as if the peer had answered
    # since they left): else only the oldest of a silent flight would be resent
    a.requester.timers.progress_at = 1.5
    a.handle_timer(1.0 + 10 * a.config.max_rto)
    assert a.stats.retransmits_timeout == 512
    resent: list[Burst] = []
    a.requester.bursts_to_send(2.0, resent)  # 512 retransmissions, one burst each
    assert len(resent) == 512 and a.stats.retransmits == 512
    # the header arena has room for about 2300 headers, the gather arena for about 16000
    # datagrams of 128 bytes: make the core leave each one behind
    a.post_write(os.urandom(100 * 20000), addr, rkey)
    for i in range(48):
        a.requester._outstanding.clear()  # as if all were acknowledged (no ACKs needed here)
        a.requester._snd_una = a.requester._next_seq
        a.bursts_to_send(3.0 + i)
    head = first[0][1][0]
    assert isinstance(head, memoryview)
    assert a.requester._next_seq >= 20000
    assert head.obj is not a.requester._hbuf and head.obj is not a.requester._gbuf
    assert _wire(first) == kept


def test_one_timer_entry_per_burst_and_every_packet_still_times_out(pack: PackBurst) -> None:
    a, b, addr, rkey = _pair(burst=8, tlp_max=0)  # no tail loss probe: timeouts only
    a.post_write(os.urandom(100 * 32), addr, rkey)
    bursts = a.bursts_to_send(1.0)
    req = a.requester
    assert len(bursts) == 4 and len(req.timers._deadlines) == 4
    rto = req.timers._deadlines[0][0]
    assert req.timers._live_top() == rto
    # the first 12 packets arrive (the whole first burst and half the second)
    _deliver(a, b, [bursts[0], _head(bursts[1], 4)], 1.001)
    assert req._snd_una == 12
    assert req.timers._live_top() == rto  # the second burst's entry, trimmed to its live packets
    assert req.timers._deadlines[0][1:] == (12, 4)
    a.handle_timer(rto - 1e-9)
    assert a.stats.retransmits_timeout == 0
    a.handle_timer(rto)
    assert a.stats.retransmits_timeout == 20  # each unacknowledged packet, once
    resent = datagrams_of(a.bursts_to_send(rto))
    psns = [wire.DATA_HDR.unpack_from(hdr)[4] & wire.PSN_MASK for _ev, hdr, _p in resent]
    assert psns == list(range(12, 32))


def test_a_seeded_simulator_run_sends_the_same_bytes_with_either_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same seed, same transfer (lossy, reordered, bursts of 8, writes with immediates): the
    datagrams on the wire are identical byte for byte whichever kernel built the headers, and
    every data header is what wire.pack_data makes of its fields."""
    if fastpath.native_pack_burst is None:
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
    runs: list[list[tuple[float, int, bytes]]] = []
    for fn in (fastpath.native_pack_burst, fastpath.py_pack_burst):
        monkeypatch.setattr(fastpath, "pack_burst", fn)
        net = RecordingNetwork(11, Faults(loss=0.03, delay=20e-6, jitter=30e-6))
        net.add_host("a")
        net.add_host("b")
        cfg = QPConfig(payload_size=512, burst=8, cc="fixed")
        qa, qb = net.connect("a", "b", evs=8, config=cfg)
        t = make_transfer(net, "a", "b", qa, qb, [200_000], 3)
        for k in range(5):
            t.post(0, k * 40_000, bytes((i * 7 + k) % 251 for i in range(39_999)), imm=k)
        assert run_until(net, [t])
        t.check_final()
        assert qa.stats.retransmits > 0  # the losses were repaired: retransmissions compared
        # probes carry a token keyed with a random secret of the QP: all else is compared,
        # the region's address and rkey are random per run: data is compared relative to them
        mr = t.regions[0]
        run: list[tuple[float, int, bytes]] = []
        for s in net.sent:
            d = s.data
            if d[0] in PROBES:
                continue
            if d[0] in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM):
                imm = d[0] == wire.Opcode.RDMA_WRITE_ONLY_IMM
                f = (wire.DATA_IMM_HDR if imm else wire.DATA_HDR).unpack_from(d)
                ackreq = bool(f[4] >> 31)
                want = wire.pack_data(
                    f[3], f[4] & wire.PSN_MASK, f[5], f[6], f[7], ackreq, f[8] if imm else None
                )
                if d[8] & wire.BTH_TLP:  # a tail loss probe's copy: P as well
                    want = want[:8] + bytes([want[8] | wire.BTH_TLP]) + want[9:]
                assert d[: len(want)] == want and len(d) == len(want) + f[7]
                assert f[6] == mr.rkey
                d = d[:12] + (f[5] - mr.addr).to_bytes(8, "big") + b"\0" * 4 + d[24:]
            run.append((s.time, s.ev, d))
        runs.append(run)
    assert len(runs[0]) > 400
    digest = [hashlib.sha256(repr(r).encode()).hexdigest() for r in runs]
    assert digest[0] == digest[1]


def test_a_silent_flight_resends_its_oldest_packet_only(pack: PackBurst) -> None:
    """Nothing new acknowledged since the flight left (a peer that stopped, or every path
    down): its timeouts are one event. The oldest packet is resent, no EV is blamed, and the
    others wait for the resend's backed-off deadline (handle_timer)."""
    a, _b, addr, rkey = _pair(burst=16, tlp_max=0)
    a.post_write(os.urandom(100 * 64), addr, rkey)
    a.bursts_to_send(1.0)
    req = a.requester
    assert len(req._outstanding) == 64
    a.handle_timer(1.0 + 10 * a.config.max_rto)
    assert a.stats.retransmits_timeout == a.stats.silent_timeouts == 1
    assert list(req._retransmit) == [0]
    assert set(a.evs.state) == {EVState.GOOD}  # nobody blamed
    head_deadline = 1.0 + 10 * a.config.max_rto + req.rtt.backed_off(1)
    assert {p.deadline for s, p in req._outstanding.items() if s} == {head_deadline}
    resent: list[Burst] = []
    req.bursts_to_send(1.0 + 10 * a.config.max_rto, resent)
    assert len(resent) == 1 and a.stats.retransmits == 1


# ---- gathered bursts ------------------------------------------------------------------------


def _gather_args(rng: random.Random, dst: bytearray) -> list[Any]:
    hbuf = memoryview(bytearray(rng.randbytes(2048)))
    data = memoryview(bytearray(rng.randbytes(1 << 15)))
    n = rng.randint(1, 30)
    payload = rng.randint(0, 900)
    last_len = rng.randint(0, payload)
    final = rng.choice([wire.DATA_HDR_LEN, wire.DATA_IMM_HDR_LEN])
    h = rng.randrange(0, len(hbuf) - (n - 1) * wire.DATA_HDR_LEN - final + 1)
    off = rng.randrange(0, len(data) - (n - 1) * payload - last_len + 1)
    pos = rng.randrange(0, 64)
    return [memoryview(dst), pos, hbuf, h, data, off, n, payload, last_len, final]


@pytest.mark.parametrize("seed", range(8))
def test_gather_burst_twins_write_the_datagrams_back_to_back(seed: int) -> None:
    """Both kernels write each datagram's header and payload, in order, from pos: the bytes
    the pairs of views record_burst makes would send; nothing else in dst changes."""
    if fastpath.native_gather_burst is None:
        pytest.skip(f"mrc._native is not in use here: {fastpath.describe()}")
    rng = random.Random(seed)
    for _ in range(20):
        state = rng.getstate()
        out = []
        for kernel in (fastpath.native_gather_burst, fastpath.py_gather_burst):
            rng.setstate(state)
            dst = bytearray(b"\xee" * 40000)
            args = _gather_args(rng, dst)
            end = kernel(*args)
            _d, pos, hbuf, h, data, off, n, payload, last_len, final = args
            want = b"".join(
                bytes(hbuf[h + i * 28 : h + i * 28 + (final if i == n - 1 else 28)])
                + bytes(data[off + i * payload : off + i * payload + (last_len if i == n - 1 else
                                                                       payload)])
                for i in range(n)
            )  # fmt: skip
            assert end == pos + len(want)
            assert dst[pos:end] == want
            assert dst[:pos] == b"\xee" * pos and dst[end:] == b"\xee" * (len(dst) - end)
            out.append(bytes(dst))
        assert out[0] == out[1]


def test_gather_burst_twins_refuse_the_same_bad_arguments_and_write_nothing() -> None:
    kernels: list[Any] = [fastpath.py_gather_burst]
    if fastpath.native_gather_burst is not None:
        kernels.append(fastpath.native_gather_burst)
    for kernel in kernels:
        hbuf, data = memoryview(bytearray(200)), memoryview(bytearray(range(256)))
        dst = bytearray(300)
        good: list[Any] = [memoryview(dst), 0, hbuf, 0, data, 0, 3, 50, 50, 28]
        assert kernel(*good) == 3 * 78
        dst[:] = bytes(300)
        for pos, bad in (
            (1, -1), (1, 100), (3, 150), (5, 120), (6, 0), (7, -1), (8, 51), (9, 27),
        ):  # fmt: skip
            args = list(good)
            args[pos] = bad
            with pytest.raises(ValueError):
                kernel(*args)
            assert dst == bytes(300)
        with pytest.raises(BufferError):
            kernel(memoryview(b"x" * 300), *good[1:])  # read-only: no place to write


def test_a_gathered_burst_sends_what_pairs_of_views_send(pack: PackBurst) -> None:
    """Gathering (the default below gather_max) changes how a burst is held, not one byte on
    the wire: the same writes, with and without it, give the same datagrams; a QP that seals
    (keys) never gathers."""
    wires = []
    for gather_max in (9000, 0):
        cfg = QPConfig(payload_size=100, burst=8, cc="fixed", max_outstanding=512,
                       gather_max=gather_max)  # fmt: skip
        a = QueuePair(1, ProtectionDomain(), list(range(4000, 4000 + EVS)), None, cfg, 7)
        a.connect(2, 300)
        rng = random.Random(5)
        a.post_write(rng.randbytes(100 * 13 + 98), 1 << 20, 9, imm=1)  # a lone longer last
        a.post_write(rng.randbytes(100 * 9 + 3), 1 << 21, 9, imm=2)
        a.post_write(rng.randbytes(100 * 4), 1 << 22, 9)
        bursts = a.bursts_to_send(1.0)
        gathered = [is_gathered(bufs, n) for _ev, bufs, n, _seg in bursts]
        assert all(gathered) if gather_max else not any(gathered)
        wires.append(_wire(bursts))
    assert wires[0] == wires[1]
    keyed = _pair()[0]
    keys = DirectionKeys(7, bytes(range(16)), bytes(range(16, 32)))
    keyed.protect(Protection(keys, keys, Mode.INTEGRITY))
    keyed.post_write(b"x" * 1000, 1 << 20, 9)
    sealed = keyed.bursts_to_send(1.0)
    assert sealed and not any(is_gathered(bufs, n) for _ev, bufs, n, _seg in sealed)


def test_a_gather_arena_is_reused_once_no_send_views_it(
    pack: PackBurst, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full gather arena makes way for the one before it when no view of that one is left
    (its sends done), not for a fresh, zeroed one; one still viewed (a send in the backlog)
    is never written again (test_headers_handed_out_are_never_written_again)."""
    from mrc.core import requester as requester_module

    made: list[int] = []

    def counting(size: int) -> bytearray:
        if size >= requester_module._GATHER_ARENA:
            made.append(size)
        return bytearray(size)

    monkeypatch.setattr(requester_module, "bytearray", counting, raising=False)
    a, _b, addr, rkey = _pair(burst=16)
    a.post_write(os.urandom(100 * 200_000), addr, rkey)
    req = a.requester
    switches = 0
    for i in range(220):  # 512 datagrams of 128 bytes a round: an arena per 32 rounds
        req._outstanding.clear()  # as if all were acknowledged
        req._snd_una = req._next_seq
        before = req._gpos
        assert a.bursts_to_send(1.0 + i)  # and sent at once: nothing keeps a view
        switches += req._gpos < before
    assert switches >= 6
    assert len(made) == 2  # the first two arenas; every later one is one of them again
    req._outstanding.clear()
    req._snd_una = req._next_seq
    kept = a.bursts_to_send(300.0)  # now a send waits: its arena must not come back
    kept_bytes = _wire(kept)
    for i in range(100):  # two switches at least: the second finds the kept one viewed
        req._outstanding.clear()
        req._snd_una = req._next_seq
        a.bursts_to_send(301.0 + i)
    assert len(made) == 3 and kept and _wire(kept) == kept_bytes
