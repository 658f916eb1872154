"""A window law of your own, in one file: DCTCP-style, on the fraction of CE-marked bytes.

Every round trip, ``alpha`` moves a step ``g`` towards the fraction of acknowledged bytes whose
packets arrived CE-marked; a round trip with marks cuts the window by ``alpha / 2`` (DCTCP,
RFC 8257). ACKs without CE grow it by a packet per round trip (doubling, until the first mark
or trim). A trim or a timeout halves it, once per round trip; a SACK-detected loss leaves it
alone (over sprayed paths it is as likely a dead path, which EV health retires).

Written against mrc.core.cc.WindowLaw only. From a command, ``mrc-send --cc
examples/dctcp_window.py:Dctcp --qp cc.g=0.125 ...``; from a program that imported this file,
``QPConfig(cc="dctcp", cc_params={"g": 0.125})``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrc.core.cc import LawContext, WindowLaw, register
from mrc.core.counters import CounterSpec, Source


@dataclass(frozen=True)
class DctcpParams:
    initial_window: int = 16  # packets, before any signal
    g: float = 1 / 16  # weight of the latest round trip's CE fraction in alpha

    def validate(self) -> None:
        if self.initial_window < 1:
            raise ValueError("cc.initial_window must be at least 1 packet")
        if not 0 < self.g <= 1:
            raise ValueError("cc.g must be > 0 and <= 1")


class Dctcp(WindowLaw):
    Params = DctcpParams
    COUNTERS = (  # reach Connection.counters() and stats()
        CounterSpec("cc_ce_cuts", Source.CC, "Cuts for CE-marked round trips", attr="ce_cuts"),
        CounterSpec("cc_trim_cuts", Source.CC, "Cuts for trims and timeouts", attr="trim_cuts"),
    )

    def __init__(self, params: DctcpParams, ctx: LawContext) -> None:
        self.mss = ctx.payload_size
        self.cap = float(self.mss * ctx.max_outstanding)
        self.g = params.g
        self.alpha = 1.0  # no history yet: a first mark cuts as hard as RFC 8257 says
        self.srtt = 0.0  # 0: no RTT sample yet
        self.round_end = 0.0  # when the round trip being observed ends
        self.next_cut = 0.0  # at most one cut per round trip
        self.acked = self.marked = 0  # bytes acknowledged / of them CE-marked, this round
        self.growing = True  # doubling per round trip until the first congestion signal
        self.ce_cuts = self.trim_cuts = 0
        self.resize(self.mss * params.initial_window)

    def resize(self, cwnd: float) -> None:
        self.cwnd = min(max(cwnd, float(self.mss)), self.cap)
        self.limit = int(self.cwnd // self.mss)

    def on_ack(self, now: float, acked: int, rtt: float | None, ce: bool) -> None:
        if rtt is not None:
            self.srtt = rtt if not self.srtt else 0.875 * self.srtt + 0.125 * rtt
        self.acked += acked
        if ce:
            self.marked += acked
        elif not self.marked:
            self.resize(self.cwnd + (acked if self.growing else acked * self.mss / self.cwnd))
        if self.srtt and now >= self.round_end:  # one round trip observed
            self.alpha += self.g * (self.marked / max(self.acked, 1) - self.alpha)
            if self.marked and now >= self.next_cut:
                self.ce_cuts += 1
                self.cut(now, 1 - self.alpha / 2)
            self.acked = self.marked = 0
            self.round_end = now + self.srtt

    def on_trim(self, now: float, rtt_hint: float) -> None:
        if now >= self.next_cut:
            self.trim_cuts += 1
            self.cut(now, 0.5, rtt_hint)

    def on_timeout(self, now: float) -> None:  # (on_loss, a SACK-detected loss: nothing)
        self.on_trim(now, 0.0)

    def cut(self, now: float, factor: float, rtt_hint: float = 0.0) -> None:
        self.growing = False
        self.resize(self.cwnd * factor)
        self.next_cut = now + (self.srtt or rtt_hint)


register("dctcp", Dctcp)

if __name__ == "__main__":  # examples/incast_simulation.py's incast, with this law
    from incast_simulation import SENDERS, SIZE, run

    seconds, trims, timeouts, ok, why = run("dctcp")
    per_packet = trims / (len(SENDERS) * SIZE // 1000)
    verdict = "data ok" if ok else why or "data MISMATCH"
    print(f"dctcp: {seconds * 1e3:.1f} ms, {per_packet:.2f} trims per packet, ", end="")
    print(f"{timeouts} timeouts, {verdict}")
