"""Flow labels in the transport: what the kernel really sends and delivers, how a receive's
control messages become an EV, and the limits of the 16 label bits.

The first test is the kernel contract mrc/transport/flowlabel.py relies on: a connected
socket with a sticky traffic class (ECT(0)) labels each send itself, GSO segments share the
send's label, and the receiver reads label and traffic class from one control message.
"""

from __future__ import annotations

import socket
import struct

import pytest

import mrc
from mrc import wire
from mrc.core.endpoint import EndpointCore
from mrc.errors import MRCError
from mrc.transport import ecn, flowlabel, gso
from mrc.transport.endpoint import Endpoint
from mrc.transport.messages import MAX_EVS
from mrc.transport.rxbatch import rx_meta
from mrc.transport.sockets import ev_socket, udp_socket


def _flowinfo(tclass: int, label: int) -> tuple[int, int, bytes]:
    return (socket.IPPROTO_IPV6, flowlabel.IPV6_FLOWINFO, struct.pack("!I", tclass << 20 | label))


def test_the_kernel_labels_each_send_and_reports_label_and_ecn() -> None:
    rx = udp_socket("::1", 0)
    tx = None
    try:
        assert flowlabel.enable_recv(rx) and gso.enable_gro(rx)
        tx = ev_socket("::1", rx.getsockname()[:2])  # ECT(0) sticky, connected
        assert flowlabel.enable_send(tx)
        sport = tx.getsockname()[1]
        seg = struct.pack("=H", 100)
        for label in (1, 0xBEEF, 0xFFFF):
            cmsg = [(gso.SOL_UDP, gso.UDP_SEGMENT, seg), flowlabel.cmsg(label)]
            tx.sendmsg([bytes([label & 0xFF]) * 300], cmsg)  # three segments of 100
        got = []
        rx.setblocking(True)
        rx.settimeout(5)
        for _ in range(3):
            data, anc, _flags, addr = rx.recvmsg(65536, 256)
            seg_size, ce, label, _stamp = rx_meta(anc)
            assert not ce and addr[1] == sport
            got.append((len(data), seg_size, wire.ev_value(addr[1], label)))
            (info,) = [d for lvl, k, d in anc if flowlabel.is_flowinfo(lvl, k)]
            assert flowlabel.tclass_of(info) & ecn.ECN_MASK == ecn.ECT0  # the label kept it
        assert got == [(300, 100, wire.ev_value(sport, lab)) for lab in (1, 0xBEEF, 0xFFFF)]
    finally:
        rx.close()
        if tx is not None:
            tx.close()


def test_ce_is_read_from_the_flow_information_unless_ecn_is_off() -> None:
    marked = [_flowinfo(ecn.CE, 0x12345)]  # a 20-bit label: the EV keeps the low 16 bits
    assert rx_meta(marked) == (0, True, 0x2345, 0.0)
    assert rx_meta(marked, ecn=False) == (0, False, 0x2345, 0.0)
    assert rx_meta([_flowinfo(ecn.ECT0, 7)]) == (0, False, 7, 0.0)


async def test_a_listener_of_ipv4_and_ipv6_reads_labels_on_its_ipv6_socket() -> None:
    """An IPv4 socket beside an IPv6 one must not turn labels off for both: IPv6 senders'
    EVs would then be their ports alone, and none of their ACKs would match."""
    v4 = udp_socket("127.0.0.1", 0)
    v6 = udp_socket("::1", 0)
    ep = Endpoint(EndpointCore(), [v4, v6])
    try:
        assert ep.labels
        assert v6.getsockopt(socket.IPPROTO_IPV6, flowlabel.IPV6_FLOWINFO) == 1
        # the IPv6 ECN field comes with the flow information, the IPv4 one as the TOS
        assert v6.getsockopt(socket.IPPROTO_IPV6, ecn.IPV6_RECVTCLASS) == 0
        assert v4.getsockopt(socket.IPPROTO_IP, ecn.IP_RECVTOS) == 1
    finally:
        ep.close()


async def test_more_evs_than_labels_is_one_line() -> None:
    with pytest.raises(MRCError, match=f"at most {MAX_EVS} EVs"):
        await mrc.connect("::1", 9, mrc.ConnectConfig(evs=MAX_EVS + 1))
    # the largest request, with its backups, still gives every EV a 16-bit label
    assert MAX_EVS + mrc.connection.backup_count(MAX_EVS, 1) <= wire.EV_LABEL_MASK
