"""Result lines written by a thread of their own, so a reader that is slow or gone never stops
the event loop.

``mrc-recv --count N`` prints a line per transfer (``--json``: an object) while other transfers
are still moving. A plain ``print`` on the event loop blocks in ``write()`` once stdout is a
full pipe: a harness that reads the output only at the end (64 KiB of pipe, about forty result
lines) stopped every transfer still running, and their senders gave up for lack of ACKs. Here
the loop only queues the line; a daemon thread does the blocking write, in order, on whichever
stream the line is for. :meth:`LineWriter.close` waits for the queue to drain once no transfer
is left to stall.
"""

from __future__ import annotations

import queue
import threading
from typing import TextIO


class LineWriter:
    """Ordered lines for stdout and stderr, written off the caller's thread."""

    def __init__(self) -> None:
        self._lines: queue.SimpleQueue[tuple[TextIO, str] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._broken: BrokenPipeError | None = None

    def put(self, stream: TextIO, line: str) -> None:
        """Queue ``line`` (without its newline) for ``stream``; never blocks."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mrc-lines", daemon=True)
            self._thread.start()
        self._lines.put((stream, line))

    def _run(self) -> None:
        while (item := self._lines.get()) is not None:
            stream, line = item
            if self._broken is not None:
                continue  # the reader left: what is left to say goes nowhere
            try:
                stream.write(line + "\n")
                stream.flush()
            except BrokenPipeError as exc:
                self._broken = exc

    def close(self) -> None:
        """Wait until every queued line is written; a reader that closed its end early is
        reported as the BrokenPipeError a direct write would have raised."""
        if self._thread is not None:
            self._lines.put(None)
            self._thread.join()
            self._thread = None
        if self._broken is not None:
            raise self._broken
