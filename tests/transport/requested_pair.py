"""A listener whose regions are made on request, and one connection to it on ::1."""

from __future__ import annotations

import mrc


async def requested_pair(
    size: int, evs: int = 32
) -> tuple[mrc.Listener, mrc.Connection, mrc.Connection, bytearray]:
    """(listener, connection, the listener's side of it, the region it made for ``size``)."""
    buffers: list[bytearray] = []

    def factory(n: int, _request: dict[str, object]) -> bytearray:
        buffers.append(bytearray(max(n, 1)))
        return buffers[-1]

    listener = await mrc.listen("::1", 0, mrc.ListenerConfig(region_factory=factory))
    conn = await mrc.connect(
        "::1",
        listener.port,
        mrc.ConnectConfig(evs=evs, request_size=size, qp=mrc.QPConfig(payload_size=4096)),
    )
    peer = await listener.accept(timeout=5)
    return listener, conn, peer, buffers[0]
