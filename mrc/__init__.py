"""mrc: Multipath Reliable Connection (MRC) in userspace Python.

RDMA-WRITE-style reliable connections whose packets are sprayed over many paths (entropy
values), placed straight into registered memory on arrival, acknowledged selectively, and
retransmitted at once on a trim. See docs/LIBRARY.md for the API and docs/PROTOCOL.md for the wire.

The top-level names are loaded on first use (module ``__getattr__``): ``import mrc.core``
must load only the standard library and the sans-IO core, not asyncio, sockets or the fabric.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mrc.errors import MRCError

if TYPE_CHECKING:
    from mrc.connection import (
        ConnectConfig,
        Connection,
        Listener,
        ListenerConfig,
        RemoteRegion,
        connect,
        listen,
    )
    from mrc.core.config import QPConfig
    from mrc.core.memory import MemoryRegion

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "ConnectConfig": "mrc.connection",
    "Connection": "mrc.connection",
    "ListenerConfig": "mrc.connection",
    "Listener": "mrc.connection",
    "RemoteRegion": "mrc.connection",
    "connect": "mrc.connection",
    "listen": "mrc.connection",
    "QPConfig": "mrc.core.config",
    "MemoryRegion": "mrc.core.memory",
}

__all__ = [
    "ConnectConfig",
    "Connection",
    "ListenerConfig",
    "Listener",
    "MRCError",
    "MemoryRegion",
    "QPConfig",
    "RemoteRegion",
    "connect",
    "listen",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mrc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
