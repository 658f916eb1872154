"""The receive batch (mrc.transport.rxbatch): the C kernel and its Python twin read the same
real datagrams into the same slots with the same metadata.

Each comparison sends one seeded sequence twice through real loopback sockets (GSO trains of
random segment sizes, single datagrams, empty ones, CE-marked ones, random flow labels, two
source ports), draining it once with each twin in batches of random sizes; every receive's
bytes, length, segment size, CE, label and port must match, and so must the batch results.
Kernel receive timestamps (SO_TIMESTAMPNS) differ from send to send: each twin's must be
the kernel's, within the time around its receive, and 0.0 where the socket gives none.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mrc.transport import ecn, flowlabel, gso, rxbatch
from mrc.transport.sockets import ev_socket, udp_socket

SLOT = 65536
SPACE = gso.GRO_CMSG_SPACE + ecn.CMSG_SPACE + flowlabel.CMSG_SPACE


def _kernels() -> Iterator[tuple[str, object]]:
    yield "python", rxbatch.py_recv_batch
    if rxbatch.native_recv_batch is not None:
        yield "native", rxbatch.native_recv_batch


def _need_native() -> None:
    if rxbatch.native_recv_batch is None:
        pytest.skip("mrc._native is not in use here")


def _send_sequence(seed: int, txs: list[socket.socket]) -> int:
    """Send the seed's datagrams; returns how many receives they make."""
    rng = random.Random(seed)
    receives = 0
    for _ in range(40):
        tx = rng.choice(txs)
        cmsg = [flowlabel.cmsg(rng.randrange(1, 1 << 16))]
        if rng.random() < 0.25:
            cmsg.append((socket.IPPROTO_IPV6, ecn.IPV6_TCLASS, struct.pack("=i", ecn.CE)))
        kind = rng.random()
        if kind < 0.5:
            seg = rng.randrange(40, 1400)
            count = rng.randrange(2, 12)
            data = rng.randbytes(seg * (count - 1) + rng.randrange(1, seg + 1))
            cmsg.append((gso.SOL_UDP, gso.UDP_SEGMENT, struct.pack("=H", seg)))
        elif kind < 0.6:
            data = b""
        else:
            data = rng.randbytes(rng.randrange(1, 9000))
        tx.sendmsg([data], cmsg)
        receives += 1
    return receives


def _drain(kernel: object, rx: socket.socket, expect: int, seed: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    buf = bytearray(4 * SLOT)
    out: list[tuple[Any, ...]] = []
    while True:
        most = rng.randrange(1, 6)
        metas, tries, empty = kernel(rx, buf, SLOT, most, True, SPACE)  # type: ignore[operator]
        assert len(metas) <= min(most, 4) and tries <= most
        for i, (n, seg, ce, label, port, stamp) in enumerate(metas):
            assert type(ce) is bool and stamp == 0.0  # no SO_TIMESTAMPNS on rx
            out.append((n, seg, ce, label, port, bytes(buf[i * SLOT : i * SLOT + n])))
        out.append(("batch", len(metas), tries, empty))
        if empty:
            break
    assert sum(1 for r in out if r[0] != "batch") == expect
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_both_twins_read_the_same_receives(seed: int) -> None:
    _need_native()
    rx = udp_socket("::1", 0)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    txs = []
    try:
        assert gso.enable_gro(rx) and flowlabel.enable_recv(rx) and ecn.enable_recv(rx, False)
        for _ in range(2):
            tx = ev_socket("::1", rx.getsockname()[:2])
            assert flowlabel.enable_send(tx)
            txs.append(tx)
        seen = {}
        for name, kernel in _kernels():
            n = _send_sequence(seed, txs)
            seen[name] = _drain(kernel, rx, n, seed)
        assert seen["native"] == seen["python"]
        got = [r for r in seen["native"] if r[0] != "batch"]
        assert any(r[1] > 0 for r in got) and any(r[2] for r in got)  # trains, CE
        assert any(not r[2] for r in got) and any(r[0] == 0 for r in got)  # not CE, empty
        assert {r[4] for r in got} == {tx.getsockname()[1] for tx in txs}
    finally:
        rx.close()
        for tx in txs:
            tx.close()


def test_both_twins_read_ipv4_tos_and_stop_where_told() -> None:
    _need_native()
    rx = udp_socket("127.0.0.1", 0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert ecn.enable_recv(rx)
        tx.connect(rx.getsockname())
        seen = {}
        for name, kernel in _kernels():
            for i in range(6):
                tos = ecn.CE if i % 2 else ecn.ECT0
                tx.sendmsg([bytes([i]) * (10 + i)], [(socket.IPPROTO_IP, ecn.IP_TOS, bytes([tos]))])
            buf = bytearray(4 * SLOT)
            first, tries, empty = kernel(rx, buf, SLOT, 2, True, SPACE)  # type: ignore[operator]
            assert (len(first), tries, empty) == (2, 2, False)  # `most` tries, not empty
            rest, tries, empty = kernel(rx, buf, SLOT, 99, True, SPACE)  # type: ignore[operator]
            assert (len(rest), tries, empty) == (4, 4, False)  # the four slots are full
            assert kernel(rx, buf, SLOT, 99, True, SPACE) == ([], 0, True)  # type: ignore[operator]
            seen[name] = first + rest
        assert seen["native"] == seen["python"]
        port = tx.getsockname()[1]
        assert seen["native"] == [(10 + i, 0, bool(i % 2), 0, port, 0.0) for i in range(6)]
    finally:
        rx.close()
        tx.close()


def test_a_call_takes_at_most_max_slots_receives() -> None:
    _need_native()
    rx = udp_socket("::1", 0)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        tx.connect(rx.getsockname()[:2])
        for _name, kernel in _kernels():
            for _ in range(rxbatch.MAX_SLOTS + 3):
                tx.send(b"m")
            buf = bytearray(100 * 16)
            metas, tries, empty = kernel(rx, buf, 16, 1000, True, SPACE)  # type: ignore[operator]
            assert (len(metas), tries, empty) == (rxbatch.MAX_SLOTS, rxbatch.MAX_SLOTS, False)
            metas, tries, empty = kernel(rx, buf, 16, 1000, True, SPACE)  # type: ignore[operator]
            assert (len(metas), tries, empty) == (3, 3, True)
    finally:
        rx.close()
        tx.close()


def test_a_pending_socket_error_uses_a_try_and_reads_nothing() -> None:
    """An ICMP error queued on the socket (a connected one that sent to a closed port) is
    what the endpoint's loop skips: one try, no receive, then the datagrams behind it."""
    _need_native()
    for _name, kernel in _kernels():
        closed = udp_socket("::1", 0)
        dead_port = closed.getsockname()[1]
        closed.close()
        rx = udp_socket("::1", 0)
        other = udp_socket("::1", 0)
        try:
            rx.connect(("::1", dead_port))
            rx.send(b"x")  # answered by ICMP port unreachable: ECONNREFUSED on rx
            buf = bytearray(2 * SLOT)
            for _ in range(200):  # the ICMP error arrives asynchronously
                res = kernel(rx, buf, SLOT, 1, True, SPACE)  # type: ignore[operator]
                if res != ([], 0, True):
                    break
            assert res == ([], 1, False)
            assert kernel(rx, buf, SLOT, 4, True, SPACE) == ([], 0, True)  # type: ignore[operator]
        finally:
            rx.close()
            other.close()


def test_both_twins_refuse_a_slot_of_nothing() -> None:
    rx = udp_socket("::1", 0)
    try:
        for _name, kernel in _kernels():
            with pytest.raises(ValueError):
                kernel(rx, bytearray(10), 0, 1, True, SPACE)  # type: ignore[operator]
    finally:
        rx.close()


def test_both_twins_return_the_kernel_receive_timestamp() -> None:
    """With SO_TIMESTAMPNS each receive comes with its CLOCK_REALTIME arrival: after the
    send, before the receive, and in order; a train is one receive with one timestamp."""
    rx = udp_socket("::1", 0)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        assert rxbatch.enable_timestamps(rx) and gso.enable_gro(rx)
        space = SPACE + rxbatch.TIMESTAMP_CMSG_SPACE
        tx.connect(rx.getsockname()[:2])
        _until_stamped_on_arrival(rx, tx, space)
        for _name, kernel in _kernels():
            before = time.time()
            for i in range(3):
                tx.send(bytes([i]) * 100)
            tx.sendmsg([b"t" * 250], [(gso.SOL_UDP, gso.UDP_SEGMENT, struct.pack("=H", 100))])
            time.sleep(0.02)  # they wait in the socket
            buf = bytearray(8 * SLOT)
            metas, _tries, _empty = kernel(rx, buf, SLOT, 8, True, space)  # type: ignore[operator]
            after = time.time()
            assert [m[0] for m in metas] == [100, 100, 100, 250]
            stamps = [m[5] for m in metas]
            assert all(type(t) is float for t in stamps)
            # the kernel's clock is CLOCK_REALTIME too; a little slack for its granularity
            assert before - 0.001 <= stamps[0] <= stamps[-1] <= after - 0.015
    finally:
        rx.close()
        tx.close()


def _until_stamped_on_arrival(rx: socket.socket, tx: socket.socket, space: int) -> None:
    """Wait until the kernel stamps datagrams as they arrive. The first socket to ask for
    timestamps turns arrival stamping on through deferred work; until it runs, recvmsg stamps
    a datagram when it is read (a wait of 0, which the endpoint takes as none)."""
    for _ in range(200):
        tx.send(b"w")
        time.sleep(0.005)  # the datagram waits in the socket: what the stamp must show
        metas, _tries, _empty = rxbatch.py_recv_batch(rx, bytearray(SLOT), SLOT, 1, True, space)
        if metas and metas[0][5] <= time.time() - 0.004:
            return
    raise AssertionError("the kernel never stamped a datagram on arrival")


def test_a_timestamp_message_reads_as_seconds_as_the_c_kernel_reads_it() -> None:
    """rx_meta's arithmetic (seconds + nanoseconds x 1e-9) is the C kernel's, and a short or
    absent message is no timestamp."""
    spec = struct.pack("@qq", 1_764_000_000, 123_456_789)
    msg = (socket.SOL_SOCKET, rxbatch.SO_TIMESTAMPNS, spec)
    assert rxbatch.rx_meta([msg]) == (0, False, 0, 1_764_000_000 + 123_456_789 * 1e-9)
    assert rxbatch.rx_meta([(socket.SOL_SOCKET, rxbatch.SO_TIMESTAMPNS, spec[:8])])[3] == 0.0
    assert rxbatch.rx_meta([]) == (0, False, 0, 0.0)
