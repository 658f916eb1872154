"""Probes on a slow host: a probe's timeout follows the probe round trips seen, late replies
included (mrc.core.evprobes).

With a fixed 100 ms timeout, a peer whose queues hold a second of packets answers every probe
too late: its answers break streaks instead of completing them, retired EVs stay retired and
each is probed again every 100 ms. 256 QPs into one receiver on loopback built such a storm
(about 20,000 probes a second from the receiver, in 2 of 6 traced runs)."""

from __future__ import annotations

from mrc.core.evprobes import MAX_TIMEOUT, EVProbes

INTERVAL = 0.02
TIMEOUT = 0.1


def _streak(probes: EVProbes, ev: int, reply_delay: float, horizon: float) -> int:
    """One EV probed against a peer that answers each probe ``reply_delay`` after it left,
    the reply teaching its round trip; the best streak of answers before ``horizon``."""
    now = 0.0
    probes.start(ev, now)
    replies: list[tuple[float, float]] = []  # (arrives, its probe's send time)
    best = 0
    while now < horizon:
        due, _silent = probes.due(now)
        if ev in due:
            replies.append((now + reply_delay, now))
        while replies and replies[0][0] <= now:
            _arrives, sent = replies.pop(0)
            probes.sample(now - sent)
            # the reply is taken for the probe that is out now, as QueuePair._on_probe does
            if probes.probing(ev) and probes.answered(ev) is not None:
                best = max(best, probes.count_answer(ev))
        nxt = min([probes.next_time() or horizon] + [r[0] for r in replies])
        now = max(nxt, now + 1e-6)
    return best


def test_the_timeout_follows_slow_replies() -> None:
    probes = EVProbes(INTERVAL, TIMEOUT)
    assert _streak(probes, 5, 0.3, 5.0) >= 3
    assert abs(probes.rtt - 0.3) < 1e-6
    assert abs(probes.current_timeout() - 0.9) < 1e-6
    # and decays back as replies come fast again
    for _ in range(100):
        probes.sample(0.001)
    assert probes.current_timeout() == TIMEOUT


def test_a_fast_peer_keeps_the_configured_timeout() -> None:
    probes = EVProbes(INTERVAL, TIMEOUT)
    assert _streak(probes, 1, 0.002, 1.0) >= 3
    assert probes.current_timeout() == TIMEOUT


def test_the_timeout_has_a_ceiling() -> None:
    probes = EVProbes(INTERVAL, TIMEOUT)
    probes.sample(10.0)  # a reply after ten seconds
    assert probes.current_timeout() == MAX_TIMEOUT


def test_a_dead_path_times_out_at_the_configured_timeout() -> None:
    probes = EVProbes(INTERVAL, TIMEOUT)
    probes.start(2, 0.0)
    due, _ = probes.due(INTERVAL)
    assert due == [2]
    _, silent = probes.due(INTERVAL + TIMEOUT)
    assert silent == [2]  # nothing ever came back: nothing makes the timeout longer
