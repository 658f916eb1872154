"""Regions a listener makes on a sender's request: made off the event loop, always released.

A sender may ask the listener for a region of its transfer's size (``ConnectConfig.
request_size``); the application's ``region_factory`` makes it (a file reserved on disk, its
pages faulted in: seconds for a large one), so it runs in a worker thread while the listener's
other connections keep moving. Whatever is made for a set-up that then fails, or is cancelled
while the factory still runs, goes to ``region_release`` once made: nothing leaks, and
:meth:`RegionMaker.wait` lets a closing listener wait for the ones still being made.
"""

from __future__ import annotations

import asyncio

from mrc.connection.config import Buffer, RegionFactory, RegionRelease
from mrc.core.memory import Access, MemoryRegion, ProtectionDomain
from mrc.errors import MRCError
from mrc.transport.messages import RegionRequest


class RegionMaker:
    """The listener's ``region_factory`` and ``region_release``, run as set-ups need them."""

    def __init__(self, factory: RegionFactory | None, release: RegionRelease | None) -> None:
        self._factory = factory
        self._release = release
        self._making: set[asyncio.Future[Buffer]] = set()  # factory calls running

    async def grant(self, request: RegionRequest, pd: ProtectionDomain) -> MemoryRegion:
        """Make the region ``request`` asks for and register it in ``pd``; MRCError (the
        refusal) if this listener makes none or the factory cannot. Cancelled while the
        factory runs, the region is released once made."""
        if self._factory is None:
            raise MRCError("this receiver does not allocate memory on request")
        made = asyncio.ensure_future(
            asyncio.to_thread(self._factory, request.size, request.to_json())
        )
        self._making.add(made)
        made.add_done_callback(self._making.discard)
        try:
            buf = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(self._release_late)
            raise
        except MRCError:
            raise
        except (OSError, ValueError, TypeError, OverflowError, MemoryError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise MRCError(
                f"cannot allocate the {request.size} bytes asked for: {reason}"
            ) from None
        try:
            return pd.register(buf, Access.REMOTE_WRITE, request.name)
        except (ValueError, TypeError) as exc:
            self.release(buf)
            raise MRCError(f"cannot allocate the {request.size} bytes asked for: {exc}") from None

    def release(self, buf: Buffer | None) -> None:
        """Hand a made region the application will never see to ``region_release``."""
        if buf is not None and self._release is not None:
            self._release(buf)

    def revoke(self, pd: ProtectionDomain, region: MemoryRegion) -> None:
        """Deregister ``region`` from ``pd`` and release its buffer (a set-up that failed
        after its region was granted, or a connection never handed out)."""
        buf = region.view.obj  # (deregister releases the view, and .obj with it)
        pd.deregister(region)
        self.release(buf)

    async def wait(self) -> None:
        """Until every factory call still running has returned (and what it made, if its
        set-up is gone, was released)."""
        await asyncio.gather(*self._making, return_exceptions=True)

    def _release_late(self, made: asyncio.Future[Buffer]) -> None:
        """A region made for a set-up that was cancelled meanwhile: nobody will use it."""
        if not made.cancelled() and made.exception() is None:
            self.release(made.result())
