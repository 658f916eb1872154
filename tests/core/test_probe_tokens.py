"""Probe replies are believed only if they carry a token of ours.

Seen on an earlier main: a probe's token was its send time in microseconds, so anyone who
guessed a live EV port could answer the health probe of an ASSUMED_BAD EV with a made-up reply
and bring back a path that is dead. Now the token carries a tag keyed with a secret of the QP.
"""

from __future__ import annotations

from mrc import wire
from mrc.core import QPConfig, QueuePair
from mrc.core.events import EVReason
from mrc.core.evset import EVState
from mrc.core.memory import ProtectionDomain

PORTS = [41000, 41001, 41002, 41003]


def _probing_qp() -> tuple[QueuePair, int, bytes, float]:
    """A connected QP whose EV 0 is ASSUMED_BAD and has just sent its health probe."""
    qp = QueuePair(7, ProtectionDomain(), PORTS, [0, 0, 0, 0], QPConfig(probe_interval=0.01))
    qp.connect(9, 0)
    now = 1.0
    qp.evs.lost(0, now, EVReason.TIMEOUT)
    assert qp.evs.state[0] is EVState.ASSUMED_BAD
    now += 0.05
    probes = [(ev, h) for ev, h, _p in qp.datagrams_to_send(now) if h[0] == wire.Opcode.PROBE]
    assert [ev for ev, _h in probes] == [0] and qp.evs.is_probing(0)
    return qp, 0, probes[0][1], now


def _reply(probe: bytes, token: int | None = None) -> memoryview:
    (_o, _f, _p, _q, psnw, ev_value, _fl, _r, sent_token) = wire.PROBE_PKT.unpack(probe)
    token = sent_token if token is None else token
    return memoryview(wire.pack_probe(7, psnw & wire.PSN_MASK, ev_value, token, reply=True))


def test_forged_probe_reply_does_not_resurrect_an_ev() -> None:
    qp, ev, probe, now = _probing_qp()
    sent_token = wire.PROBE_PKT.unpack(probe)[8]
    # a forger who knows the port and the clock, not the key: time right, tag guessed
    for guess in (sent_token & ((1 << 40) - 1), sent_token ^ (1 << 40), int(now * 1e6)):
        qp.receive_datagram(_reply(probe, guess), 4791, now + 0.001)
    assert qp.stats.dropped_by_reason["probe_bad_token"] == 3
    assert qp.evs.is_probing(ev) and qp.stats.probes_answered == 0
    # the genuine reply is believed
    qp.receive_datagram(_reply(probe), 4791, now + 0.002)
    assert qp.stats.probes_answered == 1 and not qp.evs.is_probing(ev)
