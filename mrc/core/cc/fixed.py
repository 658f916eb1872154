"""The fixed window (``QPConfig.cc = "fixed"``): ``max_outstanding`` packets in flight,
whatever the network says. The control that the core's tests of window mechanics pin, and
what a sender needs when a deliberately unresponsive flow is the point of a test."""

from __future__ import annotations

from mrc.core.cc.base import NoParams, WindowLaw


class FixedWindow(WindowLaw):
    """Every hook of :class:`WindowLaw` does nothing: ``limit`` stays ``max_outstanding``,
    bursts are ``QPConfig.burst`` exactly (1 unset: every packet sprayed), and nothing is
    paced. Packets queued for a resend hold their place in the window (records never exceed
    ``max_outstanding``), so retransmissions are never held back by it."""

    __slots__ = ()

    Params = NoParams
    adaptive = False
