"""Event loop choice: uvloop (about 3x the receive rate here), else asyncio's own.

uvloop is one of mrc's dependencies, so a plain ``pip install mrc-transport`` brings it wherever
it has wheels (CPython on Linux and macOS). Where it cannot be imported (another platform, an
install made with ``--no-deps``, a broken build) everything still works, only slower, on
asyncio's loop; ``loop_name()`` says which one runs, and ``mrc-bench`` records it with every
result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run() on the fastest loop available."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
