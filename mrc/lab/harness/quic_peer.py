"""bench_qp's aioquic reference: one QUIC connection, one unidirectional stream of N bytes.

The Python transport a user would otherwise pick for bulk data is QUIC through aioquic, so
bench_qp (``--compare aioquic``) runs it beside MRC on the same path, as issue 38 asks. The
sender writes the stream in 1 MiB chunks (each stamped with its index, so a misplaced chunk
changes the hash) and keeps at most :data:`IN_FLIGHT` bytes unacknowledged in aioquic's send
buffer, which otherwise takes everything at once; the receiver hashes every byte it is given
(BLAKE3, MRC's default checksum, so both pay a like hash) and answers the digest on a stream of
its own. Each prints one JSON line (through emit_json, so stamped with mrc's version): bytes,
seconds, CPU seconds and the digest; the receiver's window runs from its first byte to its last.

The certificate is self-signed and made at start (the client does not verify it: the
reference measures the transport, not a PKI). QUIC datagrams are ``--dgram`` bytes (aioquic's
``max_datagram_size``), bench_qp passes the size of MRC's data datagram; everything else is
aioquic's default (Reno, 1 MiB of flow-control credit: ``--window`` raises it, which moved
nothing on loopback), as a user would get it. The unacknowledged bytes are read from aioquic's
stream sender (``_buffer_start``/``_buffer_stop``, private: aioquic 1.x has no public measure).
Runnable by hand in two namespaces (or both on loopback)::

    python -m mrc.lab.harness.quic_peer recv --port 5002
    python -m mrc.lab.harness.quic_peer send --to ::1 --port 5002 --size 64M

The lab only: aioquic is in the dev extra, and mrc outside mrc.lab never imports this.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import struct
import sys
import time
from typing import Any

import blake3

from mrc.cli.common import emit_json, size_arg

CHUNK = 1 << 20
IN_FLIGHT = 8 << 20  # bytes written but not yet acknowledged, at most (plus one chunk)
ALPN = ["mrc-bench"]
WINDOW = 1 << 20  # the receiver's flow-control credit, connection and stream: aioquic's own


def missing() -> str | None:
    """Why the reference cannot run here (aioquic not importable), or None."""
    try:
        import aioquic  # noqa: F401
    except ImportError:
        return "--compare aioquic needs aioquic (pip install 'aioquic>=1.0', in the dev extra)"
    return None


def _cpu() -> float:
    return time.process_time()


def _self_signed() -> tuple[Any, Any]:
    """A fresh key and a certificate for it, valid for a day: the server needs one, nobody
    checks it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mrc-bench")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return key, cert


def seed_bytes(seed: int | None) -> bytes:
    """The chunk every chunk of the stream is made from: random, or from ``seed`` so a test
    can make the same stream and hash it itself."""
    if seed is None:
        import os

        return os.urandom(CHUNK)
    import random

    return random.Random(seed).randbytes(CHUNK)


def chunk_data(index: int, seed: bytes, length: int) -> bytes:
    """Chunk ``index`` of the stream: the seed bytes with the index in the first 8."""
    buf = bytearray(seed[:length])
    if length >= 8:
        struct.pack_into("<Q", buf, 0, index)
    return bytes(buf)


# ---- the receiver ----------------------------------------------------------------------


async def _receive(port: int, dgram: int, wait: float, window: int) -> int:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import serve
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    class Receiver(QuicConnectionProtocol):
        """Hashes the client's stream and answers its digest on a stream of its own."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.hash = blake3.blake3()
            self.bytes = 0
            self.t0 = self.cpu0 = 0.0

        def quic_event_received(self, event: QuicEvent) -> None:
            if not isinstance(event, StreamDataReceived):
                return
            if self.bytes == 0 and event.data:
                self.t0, self.cpu0 = time.perf_counter(), _cpu()
            self.bytes += len(event.data)
            self.hash.update(event.data)
            if event.end_stream and not done.done():
                seconds = time.perf_counter() - self.t0
                digest = self.hash.hexdigest()
                result = {
                    "bytes": self.bytes,
                    "seconds": seconds,
                    "bps": self.bytes * 8 / seconds if seconds > 0 else 0.0,
                    "cpu_seconds": _cpu() - self.cpu0,
                    "digest": digest,
                }
                reply = self._quic.get_next_available_stream_id(is_unidirectional=True)
                self._quic.send_stream_data(reply, digest.encode(), end_stream=True)
                self.transmit()
                done.set_result(result)

    config = QuicConfiguration(is_client=False, alpn_protocols=ALPN, max_datagram_size=dgram)
    config.max_data = config.max_stream_data = window
    config.private_key, config.certificate = _self_signed()
    server = await serve("::", port, configuration=config, create_protocol=Receiver)
    print("ready", flush=True)
    try:
        result = await asyncio.wait_for(done, wait)
    except TimeoutError:
        emit_json({"error": f"no complete stream within {wait:g} s"})
        return 1
    finally:
        await asyncio.sleep(0.2)  # the digest's datagram leaves before the socket closes
        server.close()
    emit_json(result)
    return 0


# ---- the sender ------------------------------------------------------------------------


async def _send(remote: str, port: int, size: int, dgram: int, seed: bytes) -> int:
    import ssl

    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    class Sender(QuicConnectionProtocol):
        """Wakes the writer whenever a datagram (an ACK, mostly) came in; keeps the reply."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.progress = asyncio.Event()
            self.reply = bytearray()
            self.answered = asyncio.Event()

        def datagram_received(self, data: bytes | str, addr: Any) -> None:
            super().datagram_received(data, addr)
            self.progress.set()

        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, StreamDataReceived):
                self.reply += event.data
                if event.end_stream:
                    self.answered.set()

    config = QuicConfiguration(is_client=True, alpn_protocols=ALPN, max_datagram_size=dgram)
    config.verify_mode = ssl.CERT_NONE
    async with connect(remote, port, configuration=config, create_protocol=Sender) as client:
        assert isinstance(client, Sender)
        quic = client._quic
        sid = quic.get_next_available_stream_id(is_unidirectional=True)
        digest = blake3.blake3()
        t0, cpu0 = time.perf_counter(), _cpu()
        sent = index = 0
        while sent < size:
            data = chunk_data(index, seed, min(CHUNK, size - sent))
            digest.update(data)
            sent += len(data)
            index += 1
            quic.send_stream_data(sid, data, end_stream=sent >= size)
            client.transmit()
            sender = quic._streams[sid].sender
            # aioquic buffers all it is given: wait for ACKs to drain it below IN_FLIGHT
            while sender._buffer_stop - sender._buffer_start > IN_FLIGHT:
                client.progress.clear()
                await client.progress.wait()
        await asyncio.wait_for(client.answered.wait(), 60 + size / 1e6)
        seconds = time.perf_counter() - t0
        cpu = _cpu() - cpu0
    mine = digest.hexdigest()
    theirs = client.reply.decode()
    emit_json(
        {
            "bytes": sent,
            "seconds": seconds,
            "cpu_seconds": cpu,
            "digest": mine,
            "receiver_digest": theirs,
            "ok": theirs == mine,
        }
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mrc.lab.harness.quic_peer", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("mode", choices=["recv", "send"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dgram", type=int, default=1200, help="QUIC datagram bytes (>= 1200)")
    p.add_argument(
        "--window", type=size_arg, default=WINDOW, help="recv: flow-control credit, bytes"
    )
    p.add_argument("--wait", type=float, default=120.0, help="recv: for the whole stream, s")
    p.add_argument("--to", help="send: the receiver's address")
    p.add_argument("--size", type=size_arg, default=64 << 20, help="send: stream bytes")
    p.add_argument("--seed", type=int, help="send: the data's seed (default: random)")
    a = p.parse_args(argv)
    why = missing()
    if why is not None:
        emit_json({"error": why})
        return 1
    if a.mode == "recv":
        return asyncio.run(_receive(a.port, a.dgram, a.wait, a.window))
    if not a.to:
        p.error("send needs --to")
    return asyncio.run(_send(a.to, a.port, a.size, a.dgram, seed_bytes(a.seed)))


if __name__ == "__main__":
    sys.exit(main())
