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
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

#: seconds between two redraws of a board (updates in between only record the numbers)
REDRAW_INTERVAL = 0.1


def _new_display(console: Console) -> RichProgress:
    """A rich display with mrc's columns: label, bar, percent, bytes, bit rate, time left."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        ProgressColumn,
        Task,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    from mrc.units import human_rate

    class RateColumn(ProgressColumn):
        """Transfer rate in bits per second, as every mrc result line reports it."""

        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(human_rate(speed * 8) if speed else "-", style="progress.data.speed")

    return RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(binary_units=True),
        RateColumn(),
        TimeRemainingColumn(),
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

    def update(self, task: TaskID | None, done: int, force: bool = False) -> None:
        if task is None or self._rich is None:
            return
        self._rich.update(task, completed=done)
        self._draw(force)

    def finish(self, task: TaskID | None) -> None:
        """Print the transfer's final line above the live ones and drop it from the display;
        stop the display after the last."""
        rich = self._rich
        if task is None or rich is None or task not in rich.task_ids:
            return
        rich.stop_task(task)
        line = rich.make_tasks_table([t for t in rich.tasks if t.id == task])
        rich.remove_task(task)
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


class Progress:
    """One transfer's progress line, drawn only when stderr is a terminal (``enabled`` None)
    or when ``enabled`` says so; ``board`` defaults to the process's stderr board."""

    def __init__(
        self,
        total: int,
        label: str,
        enabled: bool | None = None,
        board: ProgressBoard | None = None,
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.board = board if board is not None else (default_board() if self.enabled else None)
        self._task = self.board.add(total, label) if self.enabled and self.board else None

    def update(self, done: int, force: bool = False) -> None:
        if self._task is not None and self.board is not None:
            self.board.update(self._task, done, force)

    def finish(self) -> None:
        if self._task is not None and self.board is not None:
            self.board.finish(self._task)
            self._task = None
