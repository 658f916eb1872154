"""The core's secrets from a seeded generator, for simulations that must repeat byte for byte.

The core draws rkeys, region addresses and probe keys from ``secrets`` (as it must on a real
network); those values travel in datagrams, so two seeded simulations differ in those bytes
unless the draws are seeded too. Only for the lab: tools/sim_digest.py and the tests that
compare the datagrams of two runs.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import mrc.core.memory
import mrc.core.qp

#: the core's modules that draw from ``secrets``
SECRET_USERS = (mrc.core.memory, mrc.core.qp)


class SeededSecrets:
    """``secrets`` as the core uses it (``randbits``, ``token_bytes``), from ``seed``."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def randbits(self, k: int) -> int:
        return self._rng.getrandbits(k)

    def token_bytes(self, n: int) -> bytes:
        return self._rng.randbytes(n)


@contextlib.contextmanager
def seeded_secrets(seed: int = 1) -> Iterator[SeededSecrets]:
    """While inside, the core's secrets come from one generator seeded with ``seed``."""
    seeded = SeededSecrets(seed)
    saved = [(module, module.__dict__["secrets"]) for module in SECRET_USERS]
    for module, _ in saved:
        module.__dict__["secrets"] = seeded
    try:
        yield seeded
    finally:
        for module, value in saved:
            module.__dict__["secrets"] = value
