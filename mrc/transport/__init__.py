"""The asyncio I/O layer: UDP sockets, the side channel, and the loop that drives the core."""

from mrc.transport.loop import new_event_loop, run

__all__ = ["new_event_loop", "run"]
