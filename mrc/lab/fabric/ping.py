"""ICMPv6 echo ("ping") from inside a fabric host, optionally source-routed (here, not in
mrc.lab.fabric, so that srv6 depends on the fabric and never the other way round).

Why our own ping: the machines this runs on need not have iputils, and ``ping -6`` cannot set
an SRv6 segment list anyway.  A raw ICMPv6 socket with the path's sticky SRH pings *over a
chosen spine*; the reply comes back on the plane's default (destination-routed) path.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import time
from dataclasses import dataclass, field

from mrc.srv6.paths import Path

from .pathsock import open_path_socket

ICMP6_ECHO_REQUEST = 128
ICMP6_ECHO_REPLY = 129


@dataclass
class PingResult:
    sent: int = 0
    received: int = 0
    rtts_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # local send errors, e.g. unreachable

    @property
    def ok(self) -> bool:
        return self.received > 0

    @property
    def loss(self) -> float:
        return 1.0 - self.received / self.sent if self.sent else 1.0


def ping(path: Path, count: int = 3, timeout: float = 1.0, interval: float = 0.05) -> PingResult:
    """Send ``count`` echo requests along ``path``; wait up to ``timeout`` s for each reply."""
    ident = (os.getpid() ^ id(path)) & 0xFFFF
    result = PingResult()
    sock = open_path_socket(path, proto=socket.IPPROTO_ICMPV6, blocking=False)
    with contextlib.closing(sock):
        for seq in range(count):
            payload = struct.pack("!d", time.monotonic()) + b"mrc-fabric-ping!"
            # checksum 0: the kernel computes ICMPv6 checksums on raw ICMPv6 sockets
            msg = struct.pack("!BBHHH", ICMP6_ECHO_REQUEST, 0, 0, ident, seq) + payload
            result.sent += 1
            try:
                sock.sendto(msg, (path.dst_address, 0))
            except OSError as e:
                # no route / link down on our own NIC: a lost probe, which is the answer
                result.errors.append(e.strerror or str(e))
                continue
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([sock], [], [], left)
                if not ready:
                    break
                data, _ = sock.recvfrom(2048)
                if len(data) < 16:
                    continue
                rtype, _, _, rid, rseq = struct.unpack_from("!BBHHH", data)
                if rtype == ICMP6_ECHO_REPLY and rid == ident and rseq == seq:
                    (sent_at,) = struct.unpack_from("!d", data, 8)
                    result.received += 1
                    result.rtts_ms.append((time.monotonic() - sent_at) * 1000)
                    break
            if seq + 1 < count:
                time.sleep(interval)
    return result
