"""A benchmark's fabric: built for one run and always removed, also on Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from mrc.lab.fabric import Fabric, FabricSpec, Topology


def unwind_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does: the ``finally`` blocks that stop
    children and remove fabrics and namespaces then run for a ``kill`` or a timeout too, and
    :func:`mrc.cli.common.run_main` reports it as an interruption."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def fabric(spec: FabricSpec) -> Iterator[Topology]:
    """``with fabric(spec) as topo:`` the fabric ``spec`` describes, removed when the block
    ends however it ends (a half-built one too: removal is idempotent)."""
    try:
        yield Fabric.up(spec)
    finally:
        Fabric.down(spec.name)
