"""How the fabric shapes its links: the tbf on every port and the trimmer's virtual queue
and ECN thresholds derived from it.

Pure arithmetic, kept apart from the netlink code (:mod:`.kernel`) and the BPF maps
(:mod:`.trim.maps`) that both apply it, and from the planner that records the ECN threshold.
"""

from __future__ import annotations

#: A host NIC's queue holds at least this many full frames (see :func:`tbf_params`).
HOST_QUEUE_FRAMES = 64
#: The longest GSO super-packet a socket hands its NIC: a 64 KiB IPv6 payload, an outer
#: IPv6 header (uSID routes) and Ethernet's.
GSO_FRAME = 65535 + 40 + 40 + 14


def tbf_params(rate_bps: int, mtu: int, host: bool = False) -> tuple[int, int, int]:
    """(rate bytes/s, burst bytes, queue limit bytes) of the tbf on a link: ~1 ms of burst,
    ~10 ms of queue.

    Burst must hold at least a couple of full frames or tbf drops them; the queue is kept
    short on purpose (MRC wants shallow buffers; ``--trim`` trims before it overflows, see
    :mod:`mrc.lab.fabric.trim`).  tbf counts frames from the Ethernet header on (+14 bytes).

    ``host``: the tbf on a *host's* NIC (its end of a host-leaf link) stands for the NIC's line
    rate, and its queue for the host's own transmit queue, not for a switch buffer: nothing
    trims there, and a real host does not tail-drop what its own transport hands its NIC.  It
    holds at least :data:`HOST_QUEUE_FRAMES` full frames (>= the longest burst a QP puts on one
    EV, ``QPConfig.burst`` <= 64).  With large frames 10 ms is few of them (~14 at 100 Mbit/s,
    MTU 9000), and a sender whose GSO bursts happen to land two or three in a row on one plane
    overflowed it: tail drops the fabric would have trimmed (docs/FABRIC.md, "Host queues").
    Its burst passes one whole GSO super-packet (:data:`GSO_FRAME`): tbf cannot segment an
    IPv6-in-IPv6 one (a uSID route's burst) and dropped every one longer than its burst,
    where a NIC sends a burst's packets back to back.
    """
    rate_Bps = rate_bps // 8
    frame = mtu + 14
    burst = max(rate_Bps // 1000, 2 * frame, 3200)
    limit = max(rate_Bps // 100, burst + 4 * frame)
    if host:
        burst = max(burst, GSO_FRAME)
        limit = max(limit, HOST_QUEUE_FRAMES * frame, burst + 4 * frame)
    return rate_Bps, burst, limit


#: The virtual queue's limit as a fraction of the real tbf queue's byte limit (10 ms of
#: traffic), but at least tbf's burst + 2 frames. Under a sustained overload the virtual queue
#: runs ahead of tbf's queue by about tbf's burst (tbf passes a burst on saved tokens, the
#: virtual queue has no bucket), so trimming starts when the real queue holds about
#: ``limit - burst`` bytes, far from its own limit: trimmed headers and the odd ACK always find
#: room, and the link stays busy. MRC wants shallow queues; docs/FABRIC.md ("Trimming") has
#: the measurements behind the value.
VQ_FRACTION = 0.25

#: The ECN threshold as a fraction of that virtual queue limit (FabricSpec.ecn_threshold). A
#: packet joining the queue above it is marked CE if ECT, so window-based senders (NSCC) slow
#: down before the queue reaches the trimming limit: trims become the exception
#: (docs/FABRIC.md, "ECN", compares thresholds).
ECN_FRACTION = 0.5
