"""Probes of the reverse EVs: the paths our ACKs take, tested while this side only receives.

A side that only receives learns nothing about its ACK paths from its own traffic: an ACK that
a dead path swallows is noticed only when the sender, left without it, sends the data again
and it arrives twice (EVReason.ACK_LOST, docs/EV_HEALTH.md). The MRC paper has the receiver
probe its reverse EVs instead. Here, every ``reverse_probe_interval`` while this side has no
data of its own in flight and has sent ACKs since the last round, the ``reverse_probes_per_plane``
EVs of each plane that most recently carried an ACK are probed (a PROBE the peer answers, as
for any EV). A probe unanswered for its timeout (two intervals, or three times the slowest
recent probe round trip if longer) has the EV probed again next round, which then comes one
interval later even if no ACK leaves meanwhile (the ACKs of a transfer's tail may all have died
on it, and nothing else would show it), with the EV whose probe was last answered as a witness
that the peer still answers; two in a row are a loss on that EV: it is retired and replaced
from its plane (EVReason.REVERSE_PROBE), and the health probes bring it back once the path
answers. Why two: a probe tests a round trip, and the
reply takes whichever of the peer's EVs comes next; one lost reply (the peer's forward path
broke) would retire a reverse EV that works.

As on the sending side, a silence is no evidence: a probe is held against its EV only if one
sent no earlier (on another EV) was answered, so the peer was there to answer it. A peer that
stopped or went away retires nothing, and leaves nothing to probe for ever.

Only state and clocks are kept here; :class:`mrc.core.qp.QueuePair` sends the probes and
reports the answers.
"""

from __future__ import annotations

#: unanswered reverse probes of one EV in a row that retire it
MISSES_IN_A_ROW = 2


class ReverseProbes:
    def __init__(self, interval: float, per_plane: int) -> None:
        self.interval = interval
        self.per_plane = per_plane
        self._used: dict[int, dict[int, None]] = {}  # plane -> EVs that carried ACKs, in order
        self._sent: dict[int, float] = {}  # EV -> when its unanswered reverse probe left
        self._missed: dict[int, int] = {}  # EV -> its probes unanswered in a row, so far
        self._round: float | None = None  # the next round, None while no ACK was sent
        self._answered_sent = float("-inf")  # the latest send time of an answered probe
        self._witness: int | None = None  # the EV whose probe was answered last
        self._wait = 2 * interval  # the probe timeout as of the latest due()
        self.enabled = interval > 0 and per_plane > 0
        # when due() has something to do next (a round, or a probe's timeout as of the
        # latest due()), None for nothing: what the QP checks per batch and arms its timer
        # for, so that nothing here runs per datagram
        self.due_at: float | None = None
        self.sent = 0  # reverse probes sent
        self.lost = 0  # reverse probes unanswered while others were answered (counted misses)
        self.silent = 0  # reverse probes that went unanswered in a silence of the peer

    def ack_sent(self, ev: int, plane: int, now: float) -> None:
        """An ACK left on ``ev``: it is among the reverse EVs to probe next round."""
        used = self._used.setdefault(plane, {})
        used.pop(ev, None)
        used[ev] = None  # the most recent last
        if self._round is None:
            self._round = at = now + self.interval
            if self.due_at is None or at < self.due_at:
                self.due_at = at

    def _refresh(self) -> None:
        self.due_at = self._earliest(self._wait)

    def _earliest(self, wait: float) -> float | None:
        """The next round or the first probe timeout (after ``wait``), None for neither."""
        times = [t + wait for t in self._sent.values()]
        if self._round is not None:
            times.append(self._round)
        return min(times) if times else None

    def timeout(self, probe_rtt: float) -> float:
        return max(2 * self.interval, 3 * probe_rtt)

    def due(
        self, now: float, only_receiving: bool, probe_rtt: float
    ) -> tuple[list[int], list[tuple[int, float]]]:
        """The reverse EVs to probe now (taken as probed at ``now``), and those whose probe
        went unanswered past the timeout while a probe sent no earlier was answered, with
        its send time (each reported once)."""
        lost: list[tuple[int, float]] = []
        if self._sent:
            wait = self._wait = self.timeout(probe_rtt)
            # the same sum as _earliest's: "now - wait" may round the other way, and a
            # timer that stays due would then fire at the same instant for ever
            late = [(ev, sent) for ev, sent in self._sent.items() if sent + wait <= now]
            for ev, sent in late:
                del self._sent[ev]
                if sent > self._answered_sent:
                    self.silent += 1
                    self._missed.pop(ev, None)  # a silence: nothing to hold, nor to repeat
                    continue
                self.lost += 1
                missed = self._missed.get(ev, 0) + 1
                if missed < MISSES_IN_A_ROW:
                    self._missed[ev] = missed  # probed again next round, ACKs or not
                    if self._round is None:
                        self._round = now + self.interval
                else:
                    del self._missed[ev]
                    lost.append((ev, sent))
        due: list[int] = []
        if self._round is None or now < self._round:
            self._refresh()
            return due, lost
        if only_receiving:
            due.extend(ev for ev in self._missed if ev not in self._sent)
            retired = {ev for ev, _sent in lost}  # retired by the caller now
            for used in self._used.values():
                recent = [
                    ev
                    for ev in reversed(used)
                    if ev not in self._sent and ev not in due and ev not in retired
                ]
                due.extend(recent[: self.per_plane])
            witness = self._witness
            if (
                self._missed
                and witness is not None
                and witness not in due
                and witness not in self._sent
                and witness not in retired
            ):
                due.append(witness)  # its answer shows the peer still answers
        for ev in due:
            self._sent[ev] = now
        self.sent += len(due)
        self._used.clear()
        self._round = None  # the next ACK starts the next round
        self._refresh()
        return due, lost

    def answered(self, ev: int) -> bool:
        """A reply to a probe of ``ev`` came back; whether a reverse probe was waiting for it."""
        sent = self._sent.pop(ev, None)
        if sent is None:
            return False
        self._missed.pop(ev, None)
        if sent >= self._answered_sent:
            self._answered_sent = sent
            self._witness = ev
        self._refresh()
        return True

    def forget(self, ev: int) -> None:
        """``ev`` left the rotation: its probe, if any, is the health probes' business now."""
        self._sent.pop(ev, None)
        self._missed.pop(ev, None)
        if self._witness == ev:
            self._witness = None
        self._refresh()

    def next_time(self, probe_rtt: float) -> float | None:
        """:attr:`due_at` as it would be with the timeout of ``probe_rtt``."""
        return self._earliest(self.timeout(probe_rtt))
