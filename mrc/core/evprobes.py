"""The health probes of a QP's ASSUMED_BAD EVs: when each is due, and its answered streak.

A part of :class:`mrc.core.evset.EVSet` kept on its own: the EV set starts probing an EV when
it retires it, stops when the EV is resurrected or denied, and decides what an answer or a
silence means (docs/EV_HEALTH.md, transition #6 and "False retirements"). This keeps the
clock of it: one probe every ``probe_interval`` per EV, at most one unanswered at a time, and
a probe unanswered for ``probe_timeout`` breaks the streak.
"""

from __future__ import annotations


class EVProbes:
    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self.next: dict[int, float] = {}  # EV being probed -> its next probe time
        self._sent: dict[int, float] = {}  # EV -> when its unanswered probe left
        self._ok: dict[int, int] = {}  # EV -> consecutive answered probes

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
        for ev, when in self.next.items():
            sent = sent_at.get(ev)
            if sent is not None and sent + self.timeout <= now:  # as next_time
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
        timeout = self.timeout
        return min(sent[ev] + timeout if ev in sent else when for ev, when in self.next.items())

    def probing(self, ev: int) -> bool:
        """Whether a probe of ``ev`` is out, unanswered."""
        return ev in self._sent
