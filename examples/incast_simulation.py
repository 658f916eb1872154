"""Three senders into one receiver, in the seeded simulator: fixed window against NSCC.

No sockets, no root: mrc.lab.sim drives the same sans-IO core the transport does, here through a
last hop of 100 Mbit/s per plane that trims packets over a 20-packet queue (mrc.lab.sim_links).
With a fixed window of 24 per sender (72 packets for a 20-packet queue) every trimmed packet
is resent at once into the same full queue and trimmed again, until the QPs give up ("trimmed
1001 times"); the NSCC window (QPConfig(cc="nscc"), docs/CONGESTION.md) follows the queue
instead and every byte arrives. Prints one line per mode.
"""

from mrc.core import QPConfig
from mrc.core.events import QPFailed
from mrc.lab.sim import Faults, SimNetwork
from mrc.lab.sim_links import Fabric, LinkSpec

SENDERS = ("a", "b", "c")
SIZE = 1 << 19  # bytes per sender


def run(cc: str) -> tuple[float, int, int, bool, str]:
    """(virtual seconds, trims, timeouts, every byte arrived, why a QP failed) of one incast."""
    fab = Fabric(lasthop=LinkSpec(rate=12.5e6, queue=20_000, trim=True))
    net = SimNetwork(seed=7, faults=Faults(delay=0.0, jitter=0.0), fabric=fab)
    net.add_host("r")
    cfg = QPConfig(payload_size=1000, max_outstanding=24, cc=cc)
    qps, bufs = [], []
    for n, name in enumerate(SENDERS):
        net.add_host(name)
        qa, _qb = net.connect(name, "r", evs=16, config=cfg, planes=2, qpn_a=n + 1, qpn_b=n + 1)
        buf = bytearray(SIZE)
        mr = net.hosts["r"].core.pd.register(buf)
        qa.post_write(bytes([n + 1]) * SIZE, mr.addr, mr.rkey)
        qps.append(qa)
        bufs.append((n + 1, buf))
    done = net.run(lambda: all(q.idle for q in qps), max_time=30.0)
    intact = done and all(buf == bytes([v]) * SIZE for v, buf in bufs)
    timeouts = sum(q.stats.retransmits_timeout for q in qps)
    failures = [e.reason for h in net.hosts.values() for e in h.events if isinstance(e, QPFailed)]
    why = f"{len(failures)} of {len(qps)} QPs failed ({failures[0]})" if failures else ""
    return net.now, fab.total("trimmed"), timeouts, intact, why


if __name__ == "__main__":
    for cc in ("fixed", "nscc"):
        seconds, trims, timeouts, intact, why = run(cc)
        packets = len(SENDERS) * SIZE // 1000
        verdict = "data ok" if intact else why or "data MISMATCH"
        print(
            f"{cc:>5}: {seconds * 1000:6.1f} ms, {trims / packets:6.2f} trims per packet, "
            f"{timeouts} timeouts, {verdict}"
        )
