"""The scheduling policy a transfer's hash steps run under: SCHED_IDLE while they keep up,
where a command allows it.

The end-to-end hash runs in worker threads beside the event loop (mrc.app.checksum,
mrc.app.stream). Where the cores are few and the loop threads run under SCHED_BATCH (mrc-send
and mrc-recv, ``--scheduling batch``), a loop thread that wakes while a hash step holds a core
waits for the end of that step's turn, up to a scheduler tick (4 ms at HZ=250), and every
round trip the window law sees grows by it. Under SCHED_IDLE the step gives the core up at
once to any thread that wakes. Idle threads get only what is left over, so a step runs
under its thread's own policy again as soon as it is *urgent*: its digest has been awaited
for :data:`GRACE` seconds, or it lags :data:`LAG` bytes behind what it may hash
(:func:`piece`). Leaving SCHED_IDLE needs
CAP_SYS_NICE or an RLIMIT_NICE that allows the thread's nice value, so a process without
either never enters it (:func:`allow`). docs/PERFORMANCE.md, "A hash step gives way".

The library never changes a thread's policy by itself: only a command's :func:`allow` does.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: seconds a hash step may go on giving way once its digest is awaited: what a starved
#: step can add to a verdict (or a round's answer) where other work fills every core
GRACE = 0.1
#: bytes a hash may lag behind what it may hash before its steps stop giving way
LAG = 64 << 20
#: CAP_SYS_NICE's bit in /proc/PID/status's CapEff
_CAP_SYS_NICE = 23
_allowed = False
_local = threading.local()


def can_leave_idle() -> bool:
    """Whether a thread of this process that enters SCHED_IDLE may leave it again: root or
    CAP_SYS_NICE, or an RLIMIT_NICE that allows the process's nice value."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if soft == resource.RLIM_INFINITY or soft >= 20 - nice:
        return True
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    except (OSError, ValueError):
        pass
    return False


def allow(on: bool) -> bool:
    """Let hash steps run under SCHED_IDLE while they are not urgent (a command's choice);
    returns whether they will: only where :func:`can_leave_idle`."""
    global _allowed
    _allowed = on and hasattr(os, "SCHED_IDLE") and can_leave_idle()
    return _allowed


def allowed() -> bool:
    """Whether hash steps may give way (:func:`allow`); if not, they hash as they always did."""
    return _allowed


@contextmanager
def step() -> Iterator[None]:
    """Around one hash step, in its worker thread: the thread's policy is put back as it
    was when the step ends (the worker may run other work next)."""
    _local.saved = None
    try:
        yield
    finally:
        saved = _local.saved
        if saved is not None:
            _local.saved = None
            _set(saved)


def piece(awaited: float | None, lag: int) -> None:
    """Before each piece of a step (inside :func:`step`): SCHED_IDLE, unless the piece is
    urgent, then the thread's own policy. Urgent: its digest has been awaited since
    ``awaited`` (``time.monotonic()``; None: not awaited) for :data:`GRACE` seconds, or it
    lies more than :data:`LAG` bytes behind what may be hashed (``lag``). A policy the
    kernel refuses turns the idle policy off."""
    global _allowed
    if not _allowed:
        return
    urgent = lag > LAG or (awaited is not None and time.monotonic() - awaited > GRACE)
    saved = getattr(_local, "saved", None)
    if urgent:
        if saved is not None:
            _local.saved = None
            if not _set(saved):
                _allowed = False
    elif saved is None:
        policy = os.sched_getscheduler(0)
        if _set(os.SCHED_IDLE):
            _local.saved = policy
        else:
            _allowed = False


def _set(policy: int) -> bool:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True
