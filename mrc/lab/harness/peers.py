"""The reference senders and receivers bench_qp runs beside MRC, one per process.

What one machine can move between two namespaces, measured by the simplest programs that can
move it, so an MRC figure always has its limits next to it:

* ``udp-send`` / ``udp-recv``: a tight Python loop of one ``send`` per datagram, and one
  ``recv_into`` per datagram (the per-datagram kernel cost MRC pays without GSO);
* the same with ``--gso K`` / ``--gro``: K datagrams per ``sendmsg`` (UDP_SEGMENT) and GRO
  trains per receive (the kernel's batched limit MRC's bursts aim at);
* ``tcp-send`` / ``tcp-recv``: kernel TCP, 1 MiB per ``send`` (TSO/GRO all the way), each
  also reporting its process's CPU seconds over the bytes it reports (:func:`tcp_recv`).

Receivers print ``ready``, count from their first byte for ``--duration`` seconds, then print
one JSON line; senders keep going a little longer and report their own rate over the
receiver's window. Internal to bench_qp (:mod:`mrc.lab.bench.qp`), but runnable by hand inside
two namespaces: ``python -m mrc.lab.harness.peers udp-recv --port 5001 --dgram 8220``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import socket
import struct
import sys
import time
from collections.abc import Callable

from mrc.transport.gso import SOL_UDP, UDP_GRO, UDP_SEGMENT
from mrc.transport.sockets import SO_RCVBUFFORCE, SO_SNDBUFFORCE, udp6_counters

RCVBUF = 64 << 20
SNDBUF = 4 << 20
CHUNK = 256  # sends or receives per tight inner loop between clock checks
IDLE = 1  # seconds of silence after which a receiver stops
TCP_CHUNK = 1 << 20


def _emit(obj: dict[str, object]) -> None:
    print(json.dumps(obj), flush=True)


def _rate(count: float, size: int, seconds: float) -> dict[str, float]:
    ok = seconds > 0
    return {
        "pps": count / seconds if ok else 0.0,
        "bps": count * size * 8 / seconds if ok else 0.0,
    }


def _timed_socket(kind: int, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6, kind)
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    if kind == socket.SOCK_STREAM:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port))
    return s


def _wait_first(recv: Callable[[bytearray], int], buf: bytearray, wait: float) -> int | None:
    deadline = time.monotonic() + wait
    while True:
        try:
            return recv(buf)
        except OSError:
            if time.monotonic() > deadline:
                return None


def udp_recv(port: int, size: int, duration: float, wait: float, gro: bool) -> int:
    """Count datagrams (GRO trains counted by their segments) for ``duration`` s."""
    s = _timed_socket(socket.SOCK_DGRAM, port)
    if gro:
        s.setsockopt(SOL_UDP, UDP_GRO, 1)
    # a blocking receive that gives up after IDLE s of silence (EAGAIN): no poll() per call
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", IDLE, 0))
    buf = bytearray(65536)
    bufs = [buf]
    space = socket.CMSG_SPACE(4)
    print("ready", flush=True)
    first = _wait_first(s.recv_into, buf, wait)
    if first is None:
        _emit({"error": f"no datagram within {wait:g} s"})
        return 1
    before = udp6_counters()
    t0 = now = time.perf_counter()
    end = t0 + duration
    count = 1
    stopped_early = False
    recvmsg = s.recvmsg_into
    recv = s.recv_into
    try:
        while now < end:
            for _ in range(CHUNK):
                if gro:
                    n, anc, _f, _a = recvmsg(bufs, space)
                    seg = struct.unpack("=i", anc[0][2][:4])[0] if anc else n
                    count += -(-n // seg) if seg else 1
                else:
                    recv(buf)
                    count += 1
            now = time.perf_counter()
    except OSError:  # the sender stopped: the last IDLE s were silence, not receiving
        now = time.perf_counter() - IDLE
        stopped_early = True
    seconds = now - t0
    after = udp6_counters()
    _emit(
        {
            "received": count,
            "seconds": seconds,
            **_rate(count, size, seconds),
            "first_size": first if not gro else size,
            "stopped_early": stopped_early,
            "rcvbuf_errors": after.get("Udp6RcvbufErrors", 0) - before.get("Udp6RcvbufErrors", 0),
        }
    )
    return 0


def udp_send(
    targets: list[tuple[str, str]], port: int, size: int, duration: float, window: float, gso: int
) -> int:
    """``size``-byte datagrams round-robin over (local, remote) pairs, ``gso`` per send."""
    socks = []
    for local, remote in targets:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SNDBUF)
        s.bind((local, 0))
        s.connect((remote, port))
        socks.append(s)
    sends: list[Callable[[], int]]
    if gso > 1:
        cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))]
        burst = [bytes(size * gso)]
        sends = [functools.partial(s.sendmsg, burst, cmsg) for s in socks]
    else:
        one = bytes(size)
        sends = [functools.partial(s.send, one) for s in socks]
    seq = sends * max(1, CHUNK // max(1, gso) // len(socks))
    per = max(1, gso)
    errors = count = 0
    t0 = now = time.perf_counter()
    end, mark = t0 + duration, t0 + min(window, duration)
    in_window: tuple[int, float] | None = None
    while now < end:
        i = 0
        try:
            for send in seq:
                send()
                i += per
        except OSError:  # ENOBUFS and friends: count them, keep going
            errors += 1
        count += i
        now = time.perf_counter()
        if in_window is None and now >= mark:
            in_window = (count, now - t0)
    wcount, wsecs = in_window or (count, now - t0)
    _emit({"sent": count, "seconds": now - t0, **_rate(wcount, size, wsecs), "send_errors": errors})
    return 0


def tcp_recv(port: int, duration: float, wait: float) -> int:
    """Bytes received on one TCP connection for ``duration`` s from its first byte, and the
    process's CPU seconds (user + system, :func:`time.process_time`) over the same span.

    The loop is Python, but one ``recv_into`` moves up to 1 MiB, so the CPU is nearly all the
    kernel's: copying to user space and TCP's receive path (and whatever of the softirq work
    the kernel charges to this process). :func:`tcp_send` counts its side the same way, over
    its send loop: the CPU kernel TCP costs per byte, the reference MRC's CPU per GiB is held
    against.
    """
    srv = _timed_socket(socket.SOCK_STREAM, port)
    srv.listen(1)
    srv.settimeout(wait)
    print("ready", flush=True)
    try:
        conn, _peer = srv.accept()
    except OSError:
        _emit({"error": f"no TCP connection within {wait:g} s"})
        return 1
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", IDLE, 0))
    buf = bytearray(TCP_CHUNK)
    if _wait_first(conn.recv_into, buf, wait) is None:
        _emit({"error": "no data"})
        return 1
    recv = conn.recv_into
    cpu0 = time.process_time()
    t0 = now = time.perf_counter()
    end = t0 + duration
    total = 0
    try:
        while now < end:
            for _ in range(16):
                n = recv(buf)
                if not n:
                    raise OSError("closed")
                total += n
            now = time.perf_counter()
    except OSError:
        now = time.perf_counter()
    cpu = time.process_time() - cpu0
    seconds = now - t0
    bps = total * 8 / seconds if seconds else 0.0
    _emit({"bytes": total, "seconds": seconds, "bps": bps, "cpu_seconds": cpu})
    conn.close()
    return 0


def tcp_send(local: str, remote: str, port: int, duration: float) -> int:
    """1 MiB ``sendall`` calls for ``duration`` s (or until the receiver closes): the bytes
    sent, and the process's CPU seconds over the send loop (kernel TCP's, mostly: see
    :func:`tcp_recv`)."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.bind((local, 0))
    s.connect((remote, port))
    data = memoryview(bytes(TCP_CHUNK))
    total = 0
    cpu0 = time.process_time()
    t0 = now = time.perf_counter()
    end = t0 + duration
    with contextlib.suppress(OSError):  # the receiver closing first ends the run
        while now < end:
            for _ in range(16):
                s.sendall(data)
                total += TCP_CHUNK
            now = time.perf_counter()
    cpu = time.process_time() - cpu0
    s.close()
    _emit({"bytes": total, "seconds": now - t0, "cpu_seconds": cpu})
    return 0


def _targets(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        local, sep, remote = item.partition("/")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected LOCAL/REMOTE pairs, got {item!r}")
        pairs.append((local, remote))
    return pairs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mrc.lab.harness.peers", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("mode", choices=["udp-recv", "udp-send", "tcp-recv", "tcp-send"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dgram", type=int, default=0, help="datagram bytes (udp)")
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--window", type=float, default=None, help="senders: seconds to rate")
    p.add_argument("--wait", type=float, default=10.0, help="receivers: wait for the first")
    p.add_argument("--targets", type=_targets, help="LOCAL/REMOTE[,...] (senders)")
    p.add_argument("--gso", type=int, default=1, help="udp-send: datagrams per sendmsg")
    p.add_argument("--gro", action="store_true", help="udp-recv: UDP_GRO")
    a = p.parse_args(argv)
    if a.mode == "udp-recv":
        return udp_recv(a.port, a.dgram, a.duration, a.wait, a.gro)
    if a.mode == "tcp-recv":
        return tcp_recv(a.port, a.duration, a.wait)
    if not a.targets:
        p.error("senders need --targets")
    if a.mode == "udp-send":
        return udp_send(a.targets, a.port, a.dgram, a.duration, a.window or a.duration, a.gso)
    return tcp_send(a.targets[0][0], a.targets[0][1], a.port, a.duration)


if __name__ == "__main__":
    sys.exit(main())
