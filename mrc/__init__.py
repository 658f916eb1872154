"""mrc: Multipath Reliable Connection (MRC) in userspace Python.

RDMA-WRITE-style reliable connections whose packets are sprayed over many paths (entropy
values), placed straight into registered memory on arrival, acknowledged selectively, and
retransmitted at once on a trim. See README.md for the API and docs/PROTOCOL.md for the wire.
"""

from mrc.connection import Connection, Listener, MRCError, RemoteRegion, connect, listen
from mrc.core.config import QPConfig
from mrc.core.memory import MemoryRegion

__all__ = [
    "Connection",
    "Listener",
    "MRCError",
    "MemoryRegion",
    "QPConfig",
    "RemoteRegion",
    "connect",
    "listen",
]
__version__ = "0.1.0"
