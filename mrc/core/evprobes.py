"""The health probes of a QP's ASSUMED_BAD EVs: when each is due, and its answered streak.

A part of :class:`mrc.core.evset.EVSet` kept on its own: the EV set starts probing an EV when
it retires it, stops when the EV is resurrected or denied, and decides what an answer or a
silence means (docs/EV_HEALTH.md, transition #6 and "False retirements"). This keeps the
clock of it: one probe every ``probe_interval`` per EV, at most one unanswered at a time, and
a probe unanswered for its timeout breaks the streak.

The timeout is ``probe_timeout`` or three times the slowest recent probe round trip, whichever
is longer, every reply teaching the round trip (its token carries its probe's send time), even
one to a probe already given up. With a fixed 100 ms, a host whose queues held a second of
packets (256 QPs into one receiver on loopback) took every probe for lost, so no retired EV
came back, every one of them was probed again each 100 ms, and the probes and their replies
filled the very queue that made them late: 20,000 probes a second, and transfers that failed
(docs/EV_HEALTH.md, "Probes on a slow host").
"""

from __future__ import annotations

#: the longest a probe waits for its reply, however slow recent replies were (seconds)
MAX_TIMEOUT = 2.0


class EVProbes:
    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self.next: dict[int, float] = {}  # EV being probed -> its next probe time
        self._sent: dict[int, float] = {}  # EV -> when its unanswered probe left
        self._ok: dict[int, int] = {}  # EV -> consecutive answered probes
        self.rtt = 0.0  # the slowest recent probe round trip, decaying by 1/8 per sample

    def start(self, ev: int, now: float) -> None:
        """Probe ``ev`` from one interval after ``now``, its streak at 0."""
        self.next[ev] = now + self.interval
        self._ok[ev] = 0

    def stop(self, ev: int) -> None:
        self.next.pop(ev, None)
        self._sent.pop(ev, None)
        self._ok.pop(ev, None)

    def due(self, now: float) -> tuple[list[int], list[int]]:
        """The EVs to probe now, taken as probed at ``now``; and the EVs whose probe went
        unanswered for ``timeout`` (their streak starts again)."""
        due: list[int] = []
        silent: list[int] = []
        sent_at = self._sent
        timeout = self.current_timeout()
        for ev, when in self.next.items():
            sent = sent_at.get(ev)
            if sent is not None and sent + timeout <= now:  # as next_time
                del sent_at[ev]
                self._ok[ev] = 0
                silent.append(ev)
                sent = None
            if sent is None and when <= now:
                due.append(ev)
        for ev in due:
            self.next[ev] = now + self.interval
            sent_at[ev] = now
        return due, silent

    def current_timeout(self) -> float:
        """How long a probe may go unanswered: ``timeout``, or 3 x the recent round trip (at
        most MAX_TIMEOUT: a dead path's next probe, the one that finds it healed, waits for
        the unanswered one to time out)."""
        slow = 3.0 * self.rtt
        if slow > MAX_TIMEOUT:
            slow = MAX_TIMEOUT
        return slow if slow > self.timeout else self.timeout

    def sample(self, rtt: float) -> None:
        """The round trip of one probe reply, of any EV, answered in time or not."""
        old = self.rtt
        self.rtt = rtt if rtt > old else old + (rtt - old) / 8

    def answered(self, ev: int) -> float | None:
        """A reply to ``ev``'s probe: when that probe left (None: no probe of it was out)."""
        return self._sent.pop(ev, None)

    def count_answer(self, ev: int) -> int:
        """One more answered probe of ``ev`` in a row: the streak so far."""
        ok = self._ok.get(ev, 0) + 1
        self._ok[ev] = ok
        return ok

    def next_time(self) -> float | None:
        """When :meth:`due` will next have something to do (a probe or a probe timeout)."""
        if not self.next:
            return None
        sent = self._sent
        timeout = self.current_timeout()
        return min(sent[ev] + timeout if ev in sent else when for ev, when in self.next.items())

    def probing(self, ev: int) -> bool:
        """Whether a probe of ``ev`` is out, unanswered."""
        return ev in self._sent
