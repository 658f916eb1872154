"""The sans-IO MRC protocol core: no sockets, no clocks, no asyncio.

Datagrams and the current time go in; datagrams to send (each tagged with the entropy value to
send it on), one timer deadline and events come out. The asyncio layer in ``mrc.transport``
drives it; tests drive it with a simulated network.
"""

from mrc.core.config import QPConfig
from mrc.core.endpoint import EndpointCore
from mrc.core.events import (
    Event,
    EVReason,
    EVState,
    EVStateChanged,
    ImmediateReceived,
    ProbeReplied,
    QPFailed,
    WCStatus,
    WriteCompleted,
    WriteFailed,
)
from mrc.core.memory import Access, MemoryRegion, ProtectionDomain
from mrc.core.qp import QueuePair
from mrc.core.stats import QPStats

__all__ = [
    "Access",
    "EndpointCore",
    "Event",
    "EVReason",
    "EVState",
    "EVStateChanged",
    "ImmediateReceived",
    "MemoryRegion",
    "ProbeReplied",
    "ProtectionDomain",
    "QPConfig",
    "QPFailed",
    "QPStats",
    "QueuePair",
    "WCStatus",
    "WriteCompleted",
    "WriteFailed",
]
