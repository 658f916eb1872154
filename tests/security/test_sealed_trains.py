"""Protected GRO trains: unsealed in place, then placed by the train kernel.

A keyed receiver used to take every segment of a train through the general path, one by one
(``QueuePair.receive_datagram``: unseal, then ``Responder.on_data``). A whole data packet
unseals in place, in either mode, its headers moved up to the payload (encrypt mode: the
plaintext copied to the packet's end first), so the segments of a train can go to the train
kernel ``in_place_skip`` bytes into each. Whatever path a segment
takes, what is observable must be exactly what the one-by-one path gives: region bytes,
counters, drops, every (sealed) ACK/NACK/probe reply and every event, over the same seeded
random trains as tests/core/test_fastpath.py (good segments, duplicates, reordering, trims,
forgeries), sealed by the peer, and then again with bits flipped anywhere.
"""

from __future__ import annotations

import os
import random

import pytest
from core.test_fastpath import OTHER_QPN, QPN, SLOTS, Receiver, S, Train, _trains

from mrc import wire
from mrc.core import Access, ProtectionDomain
from mrc.native import describe
from mrc.security import packet as sec
from mrc.security.packet import DATA_OVERHEAD, DirectionKeys, Mode, Protection, Sealer

_KEYS_IN = DirectionKeys(7, bytes(range(16)), bytes(range(16, 32)))  # what the peer seals with
_KEYS_OUT = DirectionKeys(8, bytes(range(32, 48)), bytes(range(48, 64)))
_HDR: dict[int, int] = {
    wire.Opcode.RDMA_WRITE_ONLY: wire.DATA_HDR_LEN,
    wire.Opcode.RDMA_WRITE_ONLY_IMM: wire.DATA_IMM_HDR_LEN,
}
#: the segment size of a sealed train: every data packet grows by the same bytes
S2 = S + DATA_OVERHEAD


def _seal_train(train: Train, sealer: Sealer, mutate: random.Random | None) -> bytes:
    """The train as the peer would send it with keys: each data packet sealed (a trimmed
    one cut to its headers and security block, as a trimming switch leaves it), anything
    else left as it was; all but the last padded to the sealed segment size."""
    data = train.data
    parts = [data[i : i + S] for i in range(0, len(data), S)]
    out = []
    for i, part in enumerate(parts):
        hdr_len = _HDR.get(part[0]) if part else None
        if hdr_len is not None and len(part) >= hdr_len and not part[8] & wire.BTH_SECURE:
            head, rest = sealer.seal_pair(part[:hdr_len], part[hdr_len:])
            sealed = head + bytes(rest)
            if part[4] & wire.BTH_TRIMMED:
                sealed = sealed[: hdr_len + 28]
        else:
            sealed = part
        if i < len(parts) - 1:
            sealed = sealed[:S2].ljust(S2, b"\0")
        if mutate is not None and sealed and mutate.random() < 0.2:
            flipped = bytearray(sealed)
            pos = mutate.randrange(len(flipped))
            flipped[pos] ^= 1 << mutate.randrange(8)
            sealed = bytes(flipped)
        out.append(sealed)
    return b"".join(out)


def _run(seed: int, mode: str, mutate: bool, security: Mode) -> tuple[dict[str, object], int]:
    """Feed the seed's sealed trains to a fresh keyed receiver, "train" (receive_train) or
    "single" (receive_datagram per segment); what it observed, and how many segments the
    train kernel placed."""
    pd = ProtectionDomain()
    region = bytearray(SLOTS * (S - wire.DATA_HDR_LEN))
    mr = pd.register(region, Access.REMOTE_WRITE, "r")
    rx = Receiver(pd, 5)
    for qp in rx.qps.values():
        qp.protect(Protection(_KEYS_OUT, _KEYS_IN, security))
    sealer = Sealer(_KEYS_IN, security)
    flips = random.Random(seed * 7919) if mutate else None
    now = 1.0
    for i, train in enumerate(_trains(seed, mr, 120)):
        view = memoryview(bytearray(_seal_train(train, sealer, flips)))
        rx.feed(view, S2, 6000 + i % 5, now, mode)
        now += 0.0003
        rx.drain(now)
    assert rx.core.unaccounted() == 0
    fast = sum(qp.responder.fast_placed for qp in rx.qps.values())
    return rx.observed(region), fast


@pytest.mark.parametrize("security", [Mode.INTEGRITY, Mode.ENCRYPT])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sealed_trains_observe_exactly_what_single_datagrams_do(
    rx_impl: str, seed: int, security: Mode
) -> None:
    train, fast = _run(seed, "train", False, security)
    single, none = _run(seed, "single", False, security)
    assert none == 0
    assert fast > 400  # most good segments really took the kernel
    stats = train["stats"]
    assert isinstance(stats, dict) and stats[QPN]["packets_received"] > 500
    assert train == single


@pytest.mark.parametrize("security", [Mode.INTEGRITY, Mode.ENCRYPT])
@pytest.mark.parametrize("seed", [4, 5, 6])
def test_tampered_sealed_trains_observe_exactly_what_single_datagrams_do(
    rx_impl: str, seed: int, security: Mode
) -> None:
    """Bits flipped anywhere (headers, security block, ICV, payload): the same fate for
    every segment, a bad tag dropped once and counted once, whichever path met it."""
    train, fast = _run(seed, "train", True, security)
    single, _none = _run(seed, "single", True, security)
    drops = train["stats"][QPN]["dropped_by_reason"]  # type: ignore[index]
    assert drops["security_bad_tag"] > 10
    assert fast > 200
    assert train == single


@pytest.mark.parametrize("security", [Mode.INTEGRITY, Mode.ENCRYPT])
@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_sealed_trains_unseal_in_place_with_either_opener(
    native: bool, security: Mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both modes leave each datagram where the packet ends, so their trains go to the train
    kernel, opened by the C kernel a train at a time (``open_train``) or by its Python twin
    segment by segment alike, with counters and drops as the one-by-one path has them."""
    if not native:
        monkeypatch.setattr(sec, "open_in_place", None)
        monkeypatch.setattr(sec, "open_train", None)
    elif sec.open_train is None:
        pytest.skip(f"mrc._native_gcm is not in use here: {describe()}")
    for mutate in (False, True):
        train, fast = _run(1, "train", mutate, security)
        single, _none = _run(1, "single", mutate, security)
        assert fast > (200 if mutate else 400)
        assert train == single


def test_a_sealed_train_for_another_qp_is_unsealed_by_neither() -> None:
    """Segments naming the other QP are left to it: a QP never tries its keys on them."""
    pd = ProtectionDomain()
    region = bytearray(SLOTS * (S - wire.DATA_HDR_LEN))
    mr = pd.register(region, Access.REMOTE_WRITE, "r")
    rx = Receiver(pd, 5)
    for qp in rx.qps.values():
        qp.protect(Protection(_KEYS_OUT, _KEYS_IN, Mode.INTEGRITY))
    sealer = Sealer(_KEYS_IN, Mode.INTEGRITY)
    segs = []
    for seq, qpn in ((0, QPN), (1, QPN), (0, OTHER_QPN), (1, OTHER_QPN), (2, QPN)):
        psn = (wire.PSN_MASK - 40 + seq) & wire.PSN_MASK
        hdr = wire.pack_data(qpn, psn, mr.addr, mr.rkey, 20, False, None)
        head, rest = sealer.seal_pair(hdr, os.urandom(20))
        segs.append(head + bytes(rest))
    touched = rx.core.receive_train(memoryview(bytearray(b"".join(segs))), len(segs[0]), 1, 0.0)
    assert touched == {QPN: 3, OTHER_QPN: 2}
    assert rx.core.all_drops() == {}
    assert [rx.qps[q].responder.fast_placed for q in (QPN, OTHER_QPN)] == [3, 2]
