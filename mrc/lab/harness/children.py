"""Helper processes of a benchmark: started in a process group of their own, their output
collected as it comes, and always stopped.

A benchmark starts receivers and senders (mrc-recv, mrc-send, the failover roles, the socket
peers) in fabric hosts and must not leave one running when it fails, times out or is
interrupted: a stray receiver holds its port, a stray sender keeps loading the machine the next
run measures. So every child gets its own session (a Ctrl-C in the terminal reaches only the
benchmark, which then stops them in order) and :class:`Children` stops all of them on the way
out: SIGTERM to each group, a grace period for them to exit, then SIGKILL to each group, which
also ends whatever a child started and left behind.

Threads read stdout and stderr line by line from the start, so a chatty child never blocks on a
full pipe and :meth:`Child.expect` can wait for a line ("ready") while the child runs on.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import TracebackType
from typing import IO, Any, TypeVar

from mrc.errors import MRCError
from mrc.lab.harness.output import json_objects, last_json

#: seconds the children of a group have to exit after SIGTERM before their groups get SIGKILL
STOP_GRACE = 2.0
#: seconds to wait for the pipes to drain once a child has exited
DRAIN = 5.0
#: seconds between looks at children whose exit times are wanted (:func:`exit_times`)
POLL = 0.01

Key = TypeVar("Key", bound=Hashable)


def signal_group(pid: int, signum: int) -> None:
    """Send ``signum`` to the process group that ``pid`` leads (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


class Child:
    """One helper process and what it has printed so far."""

    def __init__(self, argv: list[str], label: str, env: dict[str, str] | None = None) -> None:
        self.label = label
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.stopped = False  # its group has had its SIGKILL: never signal that id again
        self._lines: queue.Queue[str] = queue.Queue()
        self._pumps = [
            self._pump(self.proc.stdout, self._keep_out),
            self._pump(self.proc.stderr, self.err.append),
        ]

    @staticmethod
    def _pump(stream: IO[str] | None, put: Callable[[str], None]) -> threading.Thread:
        def run() -> None:
            assert stream is not None
            for line in stream:
                put(line.rstrip("\n"))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def _keep_out(self, line: str) -> None:
        self.out.append(line)
        self._lines.put(line)

    # ---- while it runs ------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def expect(self, prefix: str, timeout: float) -> str:
        """The next stdout line that starts with ``prefix``; MRCError (with the child's last
        stderr lines) if it exits first or none comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MRCError(
                    f"{self.label}: no '{prefix}' in {timeout:g} s; stderr: {self.err_tail(5)}"
                )
            try:
                line = self._lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self._lines.empty():
                    self._drain()
                    if self._lines.empty():
                        raise MRCError(
                            f"{self.label} exited ({self.proc.returncode}) "
                            f"before '{prefix}': {self.err_tail(8)}"
                        ) from None
                continue
            if line.startswith(prefix):
                return line

    # ---- when it ends -------------------------------------------------------------------

    def finished(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the child to exit (it is left running if not);
        True once it has exited and everything it printed has been read."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self._drain()
        return True

    def wait(self, timeout: float) -> int:
        """The child's exit status; one that has not exited in ``timeout`` seconds is stopped
        and reported as an MRCError."""
        if not self.finished(timeout):
            stop([self])
            raise MRCError(f"{self.label} did not finish in {timeout:g} s")
        return self.proc.returncode

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def result(self) -> dict[str, Any] | None:
        """The last JSON object the child printed (its result), if any."""
        return last_json(self.stdout)

    def results(self) -> list[dict[str, Any]]:
        """Every JSON object the child printed, in order (``mrc-recv --count N``: one per
        transfer)."""
        return json_objects(self.stdout)

    def err_tail(self, lines: int) -> str:
        """The last ``lines`` lines of stderr on one line."""
        return " | ".join(self.err[-lines:])

    def _drain(self) -> None:
        for pump in self._pumps:
            pump.join(DRAIN)


def exit_times(
    children: Mapping[Key, Child],
    timeout: float,
    poll: float = POLL,
    on_poll: Callable[[float], None] | None = None,
) -> dict[Key, float]:
    """Wait up to ``timeout`` seconds for every one of ``children`` to exit; when each did, on
    :func:`time.monotonic`'s clock (seen within ``poll`` seconds), everything it printed read.
    One still running at the end has no entry and is left running: its caller says which, and
    :class:`Children` stops it. ``on_poll(now)``, if given, runs at every look while any of
    them runs (a benchmark that acts or samples on a schedule meanwhile: bench_share's link
    failure and last-hop counters); an exit is seen that much later while it runs.

    Why not :meth:`Child.finished` one after the other: that says only that all had exited by
    the time the last had, and a benchmark that puts several children's own durations on one
    clock (bench_share: when each sender sent) needs when each ended."""
    deadline = time.monotonic() + timeout
    exits: dict[Key, float] = {}
    while True:
        now = time.monotonic()
        for key, child in children.items():
            if key not in exits and not child.running:
                exits[key] = now
        if len(exits) == len(children) or now > deadline:
            break
        if on_poll is not None:
            on_poll(now)
        time.sleep(poll)
    for key in exits:
        children[key].finished(DRAIN)
    return exits


def stop(children: Iterable[Child], grace: float = STOP_GRACE) -> None:
    """Stop ``children``: SIGTERM to the group of each that still runs, up to ``grace`` seconds
    for them to exit (all at once, not one after the other), then SIGKILL to every group.

    A child is stopped once: a group id signalled long after its processes are gone could name
    somebody else's group by then."""
    children = [c for c in children if not c.stopped]
    live = [c for c in children if c.running]
    for c in live:
        signal_group(c.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for c in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(max(0.0, deadline - time.monotonic()))
    for c in children:
        signal_group(c.pid, signal.SIGKILL)
        c.stopped = True
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(DRAIN)
        c._drain()


class Children:
    """The children of one run: ``with Children() as kids: kids.start(...)`` stops every one
    of them when the block ends, however it ends."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def start(self, argv: list[str], label: str, env: dict[str, str] | None = None) -> Child:
        child = Child(argv, label, env)
        self.started.append(child)
        return child

    def stop(self) -> None:
        stop(self.started)

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
