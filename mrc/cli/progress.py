"""Progress bars on stderr, one line per transfer however many run at once (rich.progress).

``mrc-recv --count N`` may receive N transfers at the same time; bars drawn with a carriage
return each would overwrite one another on the same line. A :class:`ProgressBoard` owns one
live display holding a line per transfer in progress; a transfer that ends leaves its final
line printed above the live ones, and the display goes away when the last one ends. Log lines
and results printed meanwhile appear above the bars (rich redirects stderr, and stdout when it
is the same terminal).

Nothing is drawn unless stderr is a terminal; disabled, a :class:`Progress` costs a method call
per update and creates nothing (rich is not even imported: every command imports this module,
and rich takes longer to import than most of them take to fail). There is no refresh thread:
the display is redrawn when a transfer reports progress, at most ten times a second, from the
caller's (the event loop's) thread.

A line says what phase its transfer is in when bytes are not (yet, or any more) moving at
its pace: ``connecting`` (set-up, which with a large ``--out`` file includes the receiver
reserving it), ``starting`` (until :data:`START_BYTES`, or a hundredth of the transfer, have
moved: the receiver may still be faulting its memory in, the window growing), ``verifying``
(every byte there, the checksums being computed and swapped), then how it ended. Its rate and
time left come from :class:`RateEstimate`, from the end of the start phase on: nothing until
the rate has been measured for :data:`MIN_RATE_SPAN` seconds, then an average smoothed over
:data:`RATE_SMOOTHING` seconds, so a slow start never shows an ETA of hours.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

#: seconds between two redraws of a board (updates in between only record the numbers)
REDRAW_INTERVAL = 0.1
#: no rate (and so no time left) until bytes have moved for this long since the first ones
MIN_RATE_SPAN = 1.0
#: the rate is an average smoothed with this time constant (seconds), once it is measured
RATE_SMOOTHING = 3.0
#: samples closer together than this are not taken apart (their rate is noise)
RATE_SAMPLE = 0.25

#: the start phase lasts until this many bytes moved, or a hundredth of the transfer if less:
#: a receiver faulting a large region in, a window still growing, move next to nothing
#: for a second or more, and a rate measured then would promise hours
START_BYTES = 16 << 20

#: the phases a line shows while no bytes move (:class:`Progress`)
CONNECTING, STARTING, VERIFYING = "connecting", "starting", "verifying"


class RateEstimate:
    """Bytes per second of one transfer, for people: None until bytes have moved for
    :data:`MIN_RATE_SPAN` seconds (the first rate is their average over that span), then
    smoothed exponentially (time constant :data:`RATE_SMOOTHING`), sampled at most every
    :data:`RATE_SAMPLE` seconds. Time is the caller's (``now``), so it is testable."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self._first: tuple[float, int] | None = None  # when bytes first moved, how many
        self._last: tuple[float, int] | None = None

    def add(self, now: float, done: int) -> None:
        """``done`` bytes so far at ``now``."""
        if self._first is None:
            if done > 0:
                self._first = self._last = (now, done)
            return
        assert self._last is not None
        t0, b0 = self._first
        last_t, last_b = self._last
        span = now - last_t
        if span < RATE_SAMPLE:
            return
        self._last = (now, done)
        if self.rate is None:
            if now - t0 >= MIN_RATE_SPAN:
                self.rate = (done - b0) / (now - t0)
            return
        weight = 1.0 - math.exp(-span / RATE_SMOOTHING)
        self.rate += weight * ((done - last_b) / span - self.rate)

    def eta(self, done: int, total: int) -> float | None:
        """Seconds left for ``total - done`` bytes at the smoothed rate (None: not known)."""
        if self.rate is None or self.rate <= 0 or done >= total:
            return None
        return (total - done) / self.rate


def _new_display(console: Console) -> RichProgress:
    """A rich display with mrc's columns: label and phase, bar, percent, bytes, bit rate and
    time left (both from :class:`RateEstimate`, given as the task's ``rate`` and ``eta``)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        ProgressColumn,
        Task,
        TaskProgressColumn,
        TextColumn,
    )
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    from mrc.units import human_rate

    class RateColumn(ProgressColumn):
        """Transfer rate in bits per second, as every mrc result line reports it."""

        def render(self, task: Task) -> Text:
            rate = task.fields.get("rate")
            return Text(human_rate(rate * 8) if rate else "-", style="progress.data.speed")

    class TimeLeftColumn(ProgressColumn):
        """Time left at the smoothed rate, once there is one; nothing in a phase."""

        def render(self, task: Task) -> Text:
            eta = task.fields.get("eta")
            if eta is None:
                return Text("-:--:--", style="progress.remaining")
            minutes, seconds = divmod(int(eta + 0.5), 60)
            hours, minutes = divmod(minutes, 60)
            return Text(f"{hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")

    return RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(binary_units=True),
        RateColumn(),
        TimeLeftColumn(),
        console=console,
        auto_refresh=False,
        transient=True,  # finished lines are printed for good by ProgressBoard.finish
        # stdout is drawn above the bars only when it shares the terminal: a result line on a
        # redirected stdout must stay there, not move to stderr
        redirect_stdout=sys.stdout.isatty(),
        redirect_stderr=True,
    )


class ProgressBoard:
    """One live display for any number of concurrent transfers (see the module docstring).

    ``console``: where to draw (default: stderr); ``enabled`` None: when stderr is a terminal.
    """

    def __init__(self, console: Console | None = None, enabled: bool | None = None) -> None:
        self._console = console
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._rich: RichProgress | None = None
        self._last_draw = 0.0

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True)
        return self._console

    @property
    def active(self) -> int:
        """Transfers with a line in the live display now."""
        return len(self._rich.task_ids) if self._rich is not None else 0

    def add(self, total: int, label: str) -> TaskID | None:
        """A new line for a transfer of ``total`` bytes (None when disabled)."""
        if not self.enabled:
            return None
        if self._rich is None:
            self._rich = _new_display(self.console)
            self._rich.start()
        task = self._rich.add_task(label, total=max(total, 1))
        self._draw(force=True)
        return task

    def update(self, task: TaskID | None, done: int, force: bool = False, **fields: Any) -> None:
        """``done`` bytes of ``task``; ``fields``: ``description``, ``rate``, ``eta``."""
        if task is None or self._rich is None:
            return
        self._rich.update(task, completed=done, **fields)
        self._draw(force)

    def finish(self, task: TaskID | None, keep: bool = True) -> None:
        """Print the transfer's final line above the live ones (unless not ``keep``) and
        drop it from the display; stop the display after the last."""
        rich = self._rich
        if task is None or rich is None or task not in rich.task_ids:
            return
        rich.stop_task(task)
        line = rich.make_tasks_table([t for t in rich.tasks if t.id == task])
        rich.remove_task(task)
        if keep:
            self.console.print(line)
        if rich.task_ids:
            self._draw(force=True)
        else:
            rich.stop()
            self._rich = None

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if self._rich is not None and (force or now - self._last_draw >= REDRAW_INTERVAL):
            self._last_draw = now
            self._rich.refresh()


_default_board: ProgressBoard | None = None


def default_board() -> ProgressBoard:
    """The board of this process's stderr, shared by every :class:`Progress` not given one
    (so mrc-recv's concurrent transfers share one display)."""
    global _default_board
    if _default_board is None:
        _default_board = ProgressBoard(enabled=True)
    return _default_board


def describe(label: str, phase: str | None) -> str:
    """A line's text before its bar: the label, and the phase when there is one."""
    return f"{label} ({phase})" if phase else label


class Progress:
    """One transfer's progress line, drawn only when stderr is a terminal (``enabled`` None)
    or when ``enabled`` says so; ``board`` defaults to the process's stderr board.

    ``phase``: what the line says before bytes move (:data:`STARTING` by default; a sender
    starts :data:`CONNECTING` and calls :meth:`phase` once set up). :data:`START_BYTES` (or a
    hundredth of ``total``) end it; all ``total`` bytes make it :data:`VERIFYING`;
    :meth:`finish` says how it ended."""

    def __init__(
        self,
        total: int,
        label: str,
        enabled: bool | None = None,
        board: ProgressBoard | None = None,
        phase: str | None = STARTING,
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.board = board if board is not None else (default_board() if self.enabled else None)
        self.rate = RateEstimate()
        self.done = 0
        self._started_at = max(1, min(START_BYTES, self.total // 100))
        self._first: float | None = None  # when the first bytes moved
        self._last: float | None = None  # when the last ones did
        self._phase = phase
        self._task = (
            self.board.add(total, describe(label, phase)) if self.enabled and self.board else None
        )

    def phase(self, phase: str | None) -> None:
        """Say ``phase`` on the line (None: none, bytes are moving)."""
        if phase != self._phase:
            self._phase = phase
            self._show(force=True)

    def update(self, done: int, force: bool = False) -> None:
        self.done = done
        if self._task is None:
            return
        now = time.monotonic()
        if self._first is None and done > 0:
            self._first = now
        if self._last is None and done >= self.total:
            self._last = now
        was = self._phase
        if done >= self.total:
            self._phase = VERIFYING
        elif self._phase in (CONNECTING, STARTING) and done >= self._started_at:
            self._phase = None
        if self._phase is None:
            self.rate.add(now, done)
        # a new phase is drawn at once: the last update before a long verification may
        # come within a redraw interval of the one before, and no other follows it
        self._show(force or self._phase != was)

    def _show(self, force: bool) -> None:
        if self._task is None or self.board is None:
            return
        moving = self._phase is None
        self.board.update(
            self._task,
            self.done,
            force,
            description=describe(self.label, self._phase),
            rate=self.rate.rate if moving else None,
            eta=self.rate.eta(self.done, self.total) if moving else None,
        )

    def finish(self, outcome: str | None = None, keep: bool = True) -> None:
        """The transfer is over: its line, saying ``outcome`` (``verified``, ``failed``...)
        and the average rate, is printed for good; or, not ``keep``, goes (a transfer that
        never started: the error line says it all)."""
        if self._task is not None and self.board is not None:
            self.board.update(
                self._task,
                self.done,
                description=describe(self.label, outcome),
                rate=self._average(),
                eta=None,
            )
            self.board.finish(self._task, keep)
            self._task = None

    def _average(self) -> float | None:
        """Bytes per second from the first bytes to the last (or to now)."""
        if self._first is None:
            return None
        span = (self._last or time.monotonic()) - self._first
        return self.done / span if span > 0 else None
