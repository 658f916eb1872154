"""iperf3-style interval reports for mrc-send: counters of its streams sampled while they run.

A background task samples every stream's connection: every ``interval`` seconds it closes one
interval (bytes acknowledged, goodput, retransmissions and trims in it, and how many EVs are in
each state at its end), and every ``PEAK_TICK`` seconds it notes the goodput since the last
tick, whose maximum is the summary's peak bandwidth. ``stop()`` closes the last, partial
interval with each stream's exact byte count, so the intervals' bytes add up to the total.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mrc.app.rounds import Posted
from mrc.connection import Connection
from mrc.units import human_bytes, human_rate

#: seconds between the samples the peak bandwidth is taken over
PEAK_TICK = 0.1
#: EV states as interval records count them (``ev_report()`` labels, lower-cased; a GOOD EV
#: waiting in the backup pool counts as ``backup``)
EV_STATES = ("good", "backup", "skip", "assumed_bad", "denied")


def _state_key(label: object) -> str:
    text = str(label)
    return "backup" if text == "GOOD (backup)" else text.lower()


@dataclass
class Stream:
    """One connection being measured; what it ``posted`` bounds its progress, since
    ``bytes_acked`` counts whole packets and so runs slightly ahead."""

    conn: Connection
    posted: Posted

    def progress(self) -> int:
        return min(self.conn.bytes_acked, self.posted.bytes)


@dataclass
class _Sample:
    time: float
    bytes: int
    retransmits: int
    trims: int


def _sample(streams: list[Stream], now: float, final: list[int] | None = None) -> _Sample:
    done = final if final is not None else [s.progress() for s in streams]
    # the two counters straight from each QP's stats: Connection.stats() reads every counter
    # (about 65 us), ten times a second for each of up to 256 streams
    stats = [s.conn.qp.stats for s in streams]
    return _Sample(
        now,
        sum(done),
        sum(st.retransmits for st in stats),
        # retransmissions a trimmed-packet NACK queued: one per trim the receiver reported
        sum(st.retransmits_nack for st in stats),
    )


def ev_states(streams: list[Stream]) -> dict[str, int]:
    """How many EVs of all streams are in each state right now."""
    out = dict.fromkeys(EV_STATES, 0)
    for s in streams:
        for row in s.conn.ev_report():
            key = _state_key(row["state"])
            out[key] = out.get(key, 0) + 1
    return out


class Meter:
    """Samples ``streams`` from ``start()`` to ``stop()``; ``on_interval`` sees each closed
    interval record (``interval`` None: no intervals, only the peak)."""

    def __init__(
        self,
        streams: list[Stream],
        interval: float | None = None,
        on_interval: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.streams = streams
        self.interval = interval
        self.on_interval = on_interval
        self.intervals: list[dict[str, Any]] = []
        self.peak_bps = 0.0
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._first = self._last_interval = self._last_tick = _sample(self.streams, self._t0)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        next_tick = self._t0 + PEAK_TICK
        next_interval = self._t0 + self.interval if self.interval else float("inf")
        while True:
            await asyncio.sleep(max(min(next_tick, next_interval) - time.perf_counter(), 0.0))
            now = time.perf_counter()
            sample = _sample(self.streams, now)
            if now >= next_tick:
                self._tick(sample)
                next_tick += PEAK_TICK * max(1, int((now - next_tick) / PEAK_TICK) + 1)
            if now >= next_interval and self.interval:
                self._close_interval(sample)
                while next_interval <= now:  # a loop held up past a boundary: one long interval
                    next_interval += self.interval

    def _tick(self, sample: _Sample) -> None:
        span = sample.time - self._last_tick.time
        if span > 0:
            self.peak_bps = max(self.peak_bps, (sample.bytes - self._last_tick.bytes) * 8 / span)
        self._last_tick = sample

    def _close_interval(self, sample: _Sample) -> None:
        last = self._last_interval
        span = sample.time - last.time
        record = {
            "start": round(last.time - self._t0, 6),
            "end": round(sample.time - self._t0, 6),
            "bytes": sample.bytes - last.bytes,
            "goodput_bps": round((sample.bytes - last.bytes) * 8 / span) if span > 0 else 0,
            "retransmits": sample.retransmits - last.retransmits,
            "trims": sample.trims - last.trims,
            "evs": ev_states(self.streams),
        }
        self._last_interval = sample
        self.intervals.append(record)
        if self.on_interval is not None:
            self.on_interval(record)

    def cancel(self) -> None:
        """Stop sampling without a last interval (the run failed)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self, final_bytes: list[int]) -> None:
        """Stop sampling; the last interval ends now, with each stream at ``final_bytes``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        final = _sample(self.streams, time.perf_counter(), final_bytes)
        if self.interval and final.time > self._last_interval.time:
            self._close_interval(final)
        if not self.peak_bps:  # shorter than a tick: the peak is the average
            span = final.time - self._first.time
            self.peak_bps = final.bytes * 8 / span if span > 0 else 0.0


def interval_header() -> str:
    return f"{'interval [s]':>15}  {'transfer':>10}  {'goodput':>12}  {'rtx':>6}  {'trims':>6}  EVs"


def interval_line(record: dict[str, Any]) -> str:
    """One interval as a human line, iperf3's columns plus MRC's trims and EV states."""
    evs = record["evs"]
    states = " ".join(f"{k} {evs[k]}" for k in EV_STATES if evs.get(k) or k == "good")
    return (
        f"{record['start']:7.2f}-{record['end']:<7.2f}  {human_bytes(record['bytes']):>10}  "
        f"{human_rate(record['goodput_bps']):>12}  {record['retransmits']:>6}  "
        f"{record['trims']:>6}  {states}"
    )
