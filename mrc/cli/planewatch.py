"""What mrc-send and mrc-recv say when a plane is lost and when it comes back.

Two layers can lose a plane. The data path: a QP takes a plane out when its NIC (ours, or the
peer's, as its port-state bits say) loses its link, or after a streak of losses; its probes
bring it back. The side channel: its path over a plane breaks (mrc.transport.sidechannel), and
is joined again once the plane answers. Each change is one line on stderr naming the plane's
addresses and this host's interface (not an index), and an entry of ``plane_events`` in
``--json``, with its time. The data path's state is read every :data:`POLL` seconds, never
per packet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from mrc.transport.linkstate import interface_of

if TYPE_CHECKING:
    from mrc.connection import Connection

log = logging.getLogger("mrc.cli")

POLL = 0.1  # seconds between two looks at the data path's plane state


def _interface(address: str) -> str | None:
    index = interface_of(address)
    if index is None:
        return None
    try:
        return socket.if_indextoname(index)
    except OSError:
        return None


class PlaneWatch:
    """Watches one connection's planes (data path and side channel) while it runs."""

    def __init__(self, conn: Connection, label: str = "") -> None:
        self.conn = conn
        self.label = label  # e.g. "stream 2: " when there are several
        self.events: list[dict[str, Any]] = []
        self._pairs = conn.plane_pairs
        evs = conn.qp.evs
        self._down = [False] * evs.nplanes
        self._task: asyncio.Task[None] | None = None
        conn.side.on_path = self._side_change

    def name(self, plane: int) -> dict[str, Any]:
        """The plane's addresses and this host's interface on it."""
        if not 0 <= plane < len(self._pairs):
            return {"plane": plane, "local": None, "peer": None, "interface": None}
        local, peer = self._pairs[plane]
        return {"plane": plane, "local": local, "peer": peer, "interface": _interface(local)}

    def _say(self, plane: int, event: str, layer: str, why: str) -> None:
        where = self.name(plane)
        record = {"t": round(time.time(), 6), "event": event, "layer": layer, **where, "why": why}
        self.events.append(record)
        nic = f" on {where['interface']}" if where["interface"] else ""
        addrs = (
            f"[{where['local']}]{nic} -> [{where['peer']}]"
            if where["local"] is not None
            else "the set-up's connection"
        )
        what = "data" if layer == "data" else "side channel"
        text = f"{self.label}plane {plane} {event} ({what}): {addrs}"
        if event == "lost":
            log.warning("%s: %s", text, why)
        else:
            log.warning("%s", text)

    def _side_change(self, plane: int, up: bool, why: str) -> None:
        if up:
            self._say(plane, "back", "side_channel", "joined again")
            return
        left = [p for p in self.conn.side.planes]
        rest = f"; carrying on over plane {', '.join(map(str, left))}" if left else ""
        self._say(plane, "lost", "side_channel", why + rest)

    def poll(self) -> None:
        """Compare the data path's plane state with the last look."""
        evs = self.conn.qp.evs
        for plane in range(evs.nplanes):
            ours, theirs = evs.plane_down[plane], evs.peer_plane_down[plane]
            down = ours or theirs
            if down == self._down[plane]:
                continue
            self._down[plane] = down
            if down:
                whose = "this host's side" if ours else "the peer's side (its port-state bits)"
                self._say(plane, "lost", "data", f"taken out on {whose}")
            else:
                self._say(plane, "back", "data", "its probes answered again")

    def start(self) -> None:
        if self._task is None and self.conn.qp.evs.nplanes > 1:
            self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(POLL)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.poll()


def merged(watches: list[PlaneWatch]) -> list[dict[str, Any]]:
    """Every watch's events, in time order (each with its stream when there are several)."""
    out: list[dict[str, Any]] = []
    for i, w in enumerate(watches):
        out.extend({**e, "stream": i} if len(watches) > 1 else e for e in w.events)
    return sorted(out, key=lambda e: float(e["t"]))
