"""A QP's entropy values (EVs) and the order it sprays packets over them.

An EV is an index into the QP's list of paths; the transport maps each index to a UDP source
port (and a local address/plane, and later an SRv6 route). The core only needs the wire value
(the source port, echoed back in ACKs) and the plane of each EV.

Spraying walks a fresh pseudo-random permutation of all EVs each round, so every EV carries the
same number of packets to within one per round while consecutive packets take unrelated paths.
"""

from __future__ import annotations

import random


class EVSet:
    def __init__(self, ports: list[int], planes: list[int] | None = None, seed: int = 0) -> None:
        if not ports:
            raise ValueError("an EV set needs at least one entropy value")
        if len(set(ports)) != len(ports):
            raise ValueError("entropy values (source ports) must be distinct")
        self.ports = list(ports)
        self.planes = list(planes) if planes is not None else [0] * len(ports)
        if len(self.planes) != len(self.ports):
            raise ValueError("need one plane per entropy value")
        self.index_of_port = {p: i for i, p in enumerate(self.ports)}
        self.packets = [0] * len(self.ports)
        self._rng = random.Random(seed)
        self._order = list(range(len(self.ports)))
        self._rng.shuffle(self._order)
        self._pos = 0

    def __len__(self) -> int:
        return len(self.ports)

    def next(self) -> int:
        """The EV for the next packet."""
        pos = self._pos
        if pos == len(self._order):
            self._rng.shuffle(self._order)
            pos = 0
        ev = self._order[pos]
        self._pos = pos + 1
        return ev

    def next_other(self, avoid: int) -> int:
        """The next EV that is not ``avoid`` (used for retransmissions)."""
        ev = self.next()
        # ``while``, not ``if``: the second draw can start a fresh permutation whose first
        # entry is ``avoid`` again.
        while ev == avoid and len(self._order) > 1:
            ev = self.next()
        return ev
