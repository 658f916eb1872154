"""The per-host roles of the failover demo (``tools/failover_demo.py``), one process each.

They live in the package, not in the tool, because the demo runs them inside the fabric's hosts,
which may be containers of an image with mrc installed but not this checkout's tools/: the demo
starts ``python -m mrc.lab.bench.failover_roles ROLE ...`` with ``mrc-fabric exec``, and that maps
its own Python to the image's. Roles:

* ``mrc-recv`` / ``mrc-send``: an MRC transfer through the library API (``mrc.listen`` /
  ``mrc.connect`` with ``fabric=``); the receiver samples bytes placed (total, in order and per
  plane, the sender telling it which EV source port is on which plane) every ``--sample`` s,
  the sender logs every EV state change. The sender sets the side channel up over
  ``--setup-plane`` (it connects to the receiver's address on that plane; the other planes'
  paths join after set-up), and both ends record which plane that was and when a plane was
  lost and came back, on the data path and the side channel (``plane_events``);
* ``tcp-recv`` / ``tcp-send``: one TCP stream, or MPTCP with ``--mptcp`` (its path manager is
  configured from outside, by the demo, as root) over ``--plane`` (MPTCP: its first subflow);
  the receiver timestamps every ``recv``.

With ``--deadline S`` a role gives up S seconds after its transfer started (the sender's
start; the receiver's accept): a transfer over a plane that fails for good and has no other
(TCP pinned to it) never ends by itself. It then writes its result all the same, with
``finished`` false and the bytes moved so far.

Both sides also sample their NICs' byte counters per plane. A receiver prints ``ready`` once it
listens, a sender ``start T`` (CLOCK_MONOTONIC) when its data starts to flow: the demo schedules
the link failure from that. Each role writes one JSON object to ``--result`` (atomically: a
temporary file, then a rename) and exits 0 if its side of the transfer went well.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import mmap
import os
import socket
import sys
import time
from array import array
from typing import IO, Any

from mrc.cli.qpopts import add_qp_arg, apply_settings, with_window
from mrc.core.config import QPConfig
from mrc.core.events import EVStateChanged
from mrc.errors import MRCError
from mrc.lab.bench.common import IPPROTO_MPTCP, mptcp_subflows
from mrc.topology.model import Topology

PROG = "python -m mrc.lab.bench.failover_roles"
DONE_IMM = 0x444F4E45  # "DONE": the immediate of the sender's last, empty WRITE
CHUNK = 16 << 20
#: seconds a role waits for a side-channel message once its data is done
MESSAGE_TIMEOUT = 30.0


def _plane_addrs(topo: Topology, host: str) -> list[str]:
    return [n.address for n in sorted(topo.host(host).nics, key=lambda n: n.plane)]


class _NicCounters:
    """Per-plane rx/tx byte counters of this host's NICs (p0, p1, ...) from /sys.

    ``mrc-fabric exec`` gives the role a /sys that shows its namespace's interfaces (a
    container's own /sys does too); a NIC it cannot see counts 0."""

    def __init__(self, planes: int, what: str) -> None:
        self.files: list[IO[bytes] | None] = []
        for p in range(planes):
            try:
                self.files.append(open(f"/sys/class/net/p{p}/statistics/{what}_bytes", "rb"))  # noqa: SIM115
            except OSError:
                self.files.append(None)

    def read(self) -> list[int]:
        out: list[int] = []
        for f in self.files:
            if f is None:
                out.append(0)
                continue
            f.seek(0)
            out.append(int(f.read()))
        return out


def _deadline(args: argparse.Namespace) -> float | None:
    """CLOCK_MONOTONIC at which this role gives up (``--deadline`` from now), or None."""
    return None if args.deadline is None else time.monotonic() + args.deadline


def _left(deadline: float | None, default: float) -> float:
    """Seconds until ``deadline`` (at least 0), or ``default`` without one."""
    return default if deadline is None else max(0.0, deadline - time.monotonic())


class _Planes:
    """What one MRC end saw of its planes: the plane the side channel was set up over and,
    with :class:`~mrc.cli.planewatch.PlaneWatch` (as mrc-send and mrc-recv report them), every
    plane lost and back on the data path and the side channel, timed on CLOCK_MONOTONIC like
    every other record of the demo."""

    def __init__(self, conn: Any) -> None:
        from mrc.cli.planewatch import PlaneWatch

        self.conn = conn
        self.watch = PlaneWatch(conn)
        self.watch.start()

    async def report(self) -> dict[str, Any]:
        await self.watch.stop()
        offset = time.time() - time.monotonic()  # PlaneWatch times its events on the wall clock
        side = self.conn.side
        return {
            "side_channel": {
                "setup_plane": side.primary_plane if side.primary_plane >= 0 else None,
                "planes_at_end": side.planes,
            },
            "plane_events": [
                {
                    "t": float(e["t"]) - offset,
                    "plane": e["plane"],
                    "event": e["event"],
                    "layer": e["layer"],
                    "why": e["why"],
                }
                for e in self.watch.events
            ],
        }


def _mrc_config(args: argparse.Namespace) -> QPConfig:
    """The demo's QPConfig: payload and window from the options, then every ``--qp KEY=VALUE``
    (mrc/cli/qpopts.py, as mrc-send reads them)."""
    cfg = apply_settings(with_window(QPConfig(payload_size=args.payload), args.window), args.qp)
    cfg.validate()
    return cfg


async def mrc_recv(args: argparse.Namespace) -> dict[str, Any]:
    import mrc
    from mrc.app.checksum import Checksum
    from mrc.lab.fabric import load_topology

    topo = load_topology(args.fabric)
    addrs = _plane_addrs(topo, args.host)
    size = args.size
    buf = mmap.mmap(-1, max(size, 1))
    view = memoryview(buf)[:size]
    listener = await mrc.listen(
        addrs[0],
        args.port,
        mrc.ListenerConfig(plane_addrs=addrs, evs=args.ack_evs, qp=_mrc_config(args), fabric=topo),
    )
    listener.register(buf, name="data")
    print("ready", flush=True)
    conn = await listener.accept(timeout=60)
    deadline = _deadline(args)
    planes_seen = _Planes(conn)
    # per-EV placement and in-order progress are not in the API (counting them per packet
    # would slow every receiver): this demo alone instruments the core underneath
    qp = conn.qp
    stats = qp.stats
    resp = qp.responder
    per_ev: dict[int, int] = {}
    plane_of: dict[int, int] = {}
    # count placed bytes per EV value of the sender: one extra call per packet
    orig = resp.on_data

    def on_data(data: memoryview, src_ev: int, now: float, imm_op: bool) -> None:
        before = stats.bytes_placed
        orig(data, src_ev, now, imm_op)
        d = stats.bytes_placed - before
        if d:
            per_ev[src_ev] = per_ev.get(src_ev, 0) + d

    resp.on_data = on_data  # type: ignore[method-assign]
    # the segments of GRO trains that the train kernel placed (the rest went to on_data)
    orig_train = resp.on_data_train

    def on_data_train(
        view: memoryview, off: int, seg: int, src_ev: int, now: float, skip: int = 0
    ) -> int:
        before = stats.bytes_placed
        placed = orig_train(view, off, seg, src_ev, now, skip)
        d = stats.bytes_placed - before
        if d:
            per_ev[src_ev] = per_ev.get(src_ev, 0) + d
        return placed

    resp.on_data_train = on_data_train  # type: ignore[method-assign]
    payload = qp.config.payload_size
    nplanes = len(addrs)
    nic = _NicCounters(nplanes, "rx")
    t_s = array("d")
    placed_s = array("q")
    inorder_s = array("q")
    plane_t = array("d")
    plane_s: list[array[int]] = [array("q") for _ in range(nplanes)]
    nic_s: list[array[int]] = [array("q") for _ in range(nplanes)]
    done = asyncio.Event()

    async def sampler() -> None:
        last_plane = 0.0
        while not done.is_set():
            now = time.monotonic()
            t_s.append(now)
            placed_s.append(stats.bytes_placed)
            inorder_s.append(min(size, (resp.received_through + 1) * payload))
            if now - last_plane >= 0.005:
                last_plane = now
                plane_t.append(now)
                sums = [0] * nplanes
                for port, n in per_ev.items():
                    p = plane_of.get(port)
                    if p is not None:
                        sums[p] += n
                for p in range(nplanes):
                    plane_s[p].append(sums[p])
                for p, v in enumerate(nic.read()):
                    nic_s[p].append(v)
            await asyncio.sleep(args.sample)

    async def evmap() -> None:
        msg = await conn.recv_message(timeout=MESSAGE_TIMEOUT)
        if msg and msg.get("type") == "evmap":
            evs: Any = msg["evs"]
            for value, plane, _route in evs:
                plane_of[int(value)] = int(plane)

    sampler_task = asyncio.ensure_future(sampler())
    errors: list[str] = []
    finished = False
    try:
        await evmap()
        while await conn.next_immediate(timeout=_left(deadline, 600)) != DONE_IMM:
            pass
        finished = True
    except TimeoutError:
        errors.append(f"gave up after --deadline {args.deadline:g} s" if deadline else "timeout")
    except MRCError as exc:  # the side channel or the QP broke: say so in the result
        errors.append(str(exc))
    t_done = time.monotonic()
    done.set()
    await sampler_task
    digest = await asyncio.to_thread(Checksum("sha256").of, view)
    msg = None
    if finished:
        try:
            msg = await conn.recv_message(timeout=MESSAGE_TIMEOUT)  # the sender saw its end
            await conn.send_message({"type": "result", "sha256": digest})
        except MRCError as exc:
            errors.append(f"verdict: {exc}")
    evs_counters = conn.ev_counters()
    st = conn.stats()
    seen = await planes_seen.report()
    if finished:
        await asyncio.sleep(0.05)  # (the result on its way before the paths close)
    await listener.close()
    return {
        "ok": finished and msg is not None and msg.get("type") == "done",
        "finished": finished,
        "errors": errors,
        "sha256": digest,
        "bytes": size if finished else stats.bytes_placed,
        "t_done": t_done,
        **seen,
        "samples": {"t": list(t_s), "placed": list(placed_s), "inorder": list(inorder_s)},
        "planes": {
            "t": list(plane_t),
            "placed": [list(a) for a in plane_s],
            "nic_rx": [list(a) for a in nic_s],
        },
        "stats": {
            k: st[k]
            for k in (
                "packets_received",
                "bytes_placed",
                "duplicates",
                "acks_sent",
                "probes_sent",
                "probes_answered",
            )
        },
        "evs": evs_counters,
    }


async def mrc_send(args: argparse.Namespace) -> dict[str, Any]:
    import mrc
    from mrc.lab.fabric import load_topology

    topo = load_topology(args.fabric)
    src = _plane_addrs(topo, args.host)
    dst = _plane_addrs(topo, args.peer)
    fd = os.open(args.data, os.O_RDONLY)
    try:
        data = memoryview(mmap.mmap(fd, args.size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)
    # the side channel is set up over --setup-plane (the receiver's address there; its other
    # addresses only if that one does not answer), its other planes' paths join afterwards
    setup = args.setup_plane
    conn = await mrc.connect(
        [dst[setup], *(a for i, a in enumerate(dst) if i != setup)],
        args.port,
        mrc.ConnectConfig(evs=args.evs, local_addrs=src, qp=_mrc_config(args), fabric=topo),
    )
    planes_seen = _Planes(conn)
    routes = conn.routes
    events: list[list[Any]] = []

    def on_ev(e: EVStateChanged) -> None:  # e.time is the loop's clock = CLOCK_MONOTONIC
        events.append(
            [
                e.time,
                e.ev,
                e.value,
                e.plane,
                routes[e.ev] if routes else "direct",
                e.old_label,
                e.new_label,
                e.reason_text,
            ]
        )

    conn.on_ev_change(on_ev)
    rows: list[dict[str, Any]] = conn.ev_report()
    await conn.send_message(
        {"type": "evmap", "evs": [[r["value"], r["plane"], r["route"]] for r in rows]}
    )
    region = conn.remote["data"]
    planes = [int(r["plane"]) for r in rows]
    nplanes = max(planes) + 1
    nic = _NicCounters(nplanes, "tx")
    pt = array("d")
    pk: list[array[int]] = [array("q") for _ in range(nplanes)]
    nic_s: list[array[int]] = [array("q") for _ in range(nplanes)]
    finished = asyncio.Event()

    async def sampler() -> None:
        while not finished.is_set():
            pt.append(time.monotonic())
            sums = [0] * nplanes
            report: list[dict[str, Any]] = conn.ev_report()
            for i, row in enumerate(report):
                sums[planes[i]] += int(row["packets"])
            for p in range(nplanes):
                pk[p].append(sums[p])
            for p, v in enumerate(nic.read()):
                nic_s[p].append(v)
            await asyncio.sleep(0.01)

    t_start = time.monotonic()
    deadline = _deadline(args)
    print(f"start {t_start:.6f}", flush=True)
    sampler_task = asyncio.ensure_future(sampler())
    n = args.size
    writes = [conn.post_write(data[off : off + CHUNK], region, off) for off in range(0, n, CHUNK)]
    errors: list[str] = []
    done = False
    try:
        await asyncio.wait_for(
            asyncio.shield(conn.post_write(b"", region, n, imm=DONE_IMM)), _left(deadline, 3600)
        )
        done = True
    except TimeoutError:
        errors.append(f"gave up after --deadline {args.deadline:g} s")
    except MRCError as exc:
        errors.append(str(exc))
    for w in writes:  # (their outcome is the last write's; read so none goes unretrieved)
        if w.done() and not w.cancelled():
            w.exception()
    t_end = time.monotonic()
    finished.set()
    await sampler_task
    reply = None
    if done:
        try:
            await conn.send_message({"type": "done"})
            reply = await conn.recv_message(timeout=MESSAGE_TIMEOUT)
        except MRCError as exc:
            errors.append(f"verdict: {exc}")
    st = conn.stats()
    report = conn.ev_report()
    counters = conn.ev_counters()
    seen = await planes_seen.report()
    await conn.close()
    return {
        "ok": bool(reply and reply.get("type") == "result"),
        "finished": done,
        "errors": errors,
        "t_start": t_start,
        "t_end": t_end,
        **seen,
        "stats": {
            k: st[k]
            for k in (
                "packets_sent",
                "data_packets_sent",
                "retransmits",
                "retransmits_timeout",
                "retransmits_sack",
                "retransmits_nack",
                "send_errors",
                "srtt",
                "rto",
                "probes_sent",
                "probes_answered",
            )
        },
        "evs": counters,
        "ev_report": report,
        "ev_events": events,
        "planes": {
            "t": list(pt),
            "packets": [list(a) for a in pk],
            "nic_tx": [list(a) for a in nic_s],
        },
    }


def stream_recv(args: argparse.Namespace) -> dict[str, Any]:
    proto = IPPROTO_MPTCP if args.mptcp else 0
    topo_addrs = None
    if args.fabric:
        from mrc.lab.fabric import load_topology

        topo_addrs = _plane_addrs(load_topology(args.fabric), args.host)
    nplanes = len(topo_addrs) if topo_addrs else 1
    ls = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, proto)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("::", args.port))
    ls.listen(1)
    print("ready", flush=True)
    ls.settimeout(60)
    size = args.size
    while True:
        c, peer = ls.accept()
        c.settimeout(None)
        first = c.recv(1)  # G: data follows; R: the sender starts again (subflows missing)
        if first != b"R":
            break
        c.close()
    ls.close()
    buf = mmap.mmap(-1, max(size, 1))
    view = memoryview(buf)
    got = 0
    deadline = _deadline(args)
    if deadline is not None:  # wake up now and then to look at the clock
        c.settimeout(0.5)
    t_s = array("d")
    n_s = array("q")
    nic = _NicCounters(nplanes, "rx")
    plane_t = array("d")
    nic_s: list[array[int]] = [array("q") for _ in range(nplanes)]
    recv_into = c.recv_into
    mono = time.monotonic
    last_plane = 0.0
    while got < size:
        try:
            n = recv_into(view[got:], min(1 << 20, size - got))
        except TimeoutError:  # (only with a deadline)
            if deadline is not None and mono() < deadline:
                continue
            break
        if n == 0:
            break
        got += n
        now = mono()
        if deadline is not None and now >= deadline:
            t_s.append(now)
            n_s.append(got)
            break
        t_s.append(now)
        n_s.append(got)
        if now - last_plane >= 0.005:
            last_plane = now
            plane_t.append(now)
            for p, v in enumerate(nic.read()):
                nic_s[p].append(v)
    t_done = mono()
    digest = hashlib.sha256(view[:got]).hexdigest()
    with contextlib.suppress(OSError):
        if got == size:
            c.sendall(b"k")
        c.close()
    return {
        "ok": got == size,
        "finished": got == size,
        "sha256": digest,
        "bytes": got,
        "t_done": t_done,
        "peer": str(peer[0]),
        "samples": {"t": list(t_s), "placed": list(n_s), "inorder": list(n_s)},
        "planes": {"t": list(plane_t), "nic_rx": [list(a) for a in nic_s]},
    }


def _send_until(s: socket.socket, data: memoryview, deadline: float) -> int:
    """Send ``data`` on ``s`` until all of it is sent or ``deadline`` has passed; the bytes
    the kernel took (``sendall`` would lose count of them when it times out)."""
    s.settimeout(0.5)
    sent = 0
    n = len(data)
    while sent < n and time.monotonic() < deadline:
        try:
            sent += s.send(data[sent : min(n, sent + (1 << 20))])
        except TimeoutError:
            continue
        except OSError:  # the receiver gave up first (reset): what was sent stays counted
            break
    return sent


def stream_send(args: argparse.Namespace) -> dict[str, Any]:
    from mrc.lab.fabric import load_topology

    topo = load_topology(args.fabric)
    src = _plane_addrs(topo, args.host)
    dst = _plane_addrs(topo, args.peer)
    proto = IPPROTO_MPTCP if args.mptcp else 0
    subflows = None
    attempts = 0
    while True:
        attempts += 1
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, proto)
        s.bind((src[args.plane], 0))
        s.settimeout(10)
        s.connect((dst[args.plane], args.port))
        s.settimeout(None)
        if not args.mptcp:
            break
        # let the path manager open the other planes' subflows (one per ADD_ADDR the
        # receiver announces) before any data flows; an ADD_ADDR whose echo is lost is only
        # repeated after net.mptcp.add_addr_timeout (120 s), so start again rather than wait
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            subflows = mptcp_subflows(s)
            if subflows is not None and subflows >= args.want_subflows - 1:
                break
            time.sleep(0.01)
        if (subflows is not None and subflows >= args.want_subflows - 1) or attempts >= 3:
            break
        s.sendall(b"R")  # tells the receiver to accept again
        s.close()
        print(f"retry: {subflows} extra subflows", file=sys.stderr, flush=True)
    fd = os.open(args.data, os.O_RDONLY)
    try:
        data = memoryview(mmap.mmap(fd, args.size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)
    s.sendall(b"G")
    t_start = time.monotonic()
    give_up = _deadline(args)
    print(f"start {t_start:.6f}", flush=True)
    step = 1 << 20
    sent = 0
    if give_up is None:
        for off in range(0, args.size, step):
            s.sendall(data[off : off + step])
        sent = args.size
    else:
        sent = _send_until(s, data, give_up)
    t_end = time.monotonic()
    ack = b""
    if sent == args.size:
        s.shutdown(socket.SHUT_WR)
        s.settimeout(_left(give_up, 120) or 0.001)
        with contextlib.suppress(OSError):  # (no answer in time, or the receiver gave up)
            ack = s.recv(1)
    if args.mptcp:
        subflows = mptcp_subflows(s) if subflows is None else subflows
    s.close()
    return {
        "ok": ack == b"k",
        "finished": ack == b"k",
        "bytes_sent": sent,
        "t_start": t_start,
        "t_end": t_end,
        "subflows": subflows,
        "attempts": attempts,
    }


def main(argv: list[str] | None = None) -> int:
    """Run one role; the exit status says whether its side of the transfer went well."""
    p = argparse.ArgumentParser(prog=PROG)
    p.add_argument("role", choices=["mrc-recv", "mrc-send", "tcp-recv", "tcp-send"])
    p.add_argument("--fabric", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--peer")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--data")
    p.add_argument("--result", required=True)
    p.add_argument("--payload", type=int, default=8192)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--evs", type=int, default=128)
    p.add_argument("--ack-evs", type=int, default=16)
    p.add_argument("--sample", type=float, default=0.001)
    add_qp_arg(p, ", after --payload and --window")
    p.add_argument("--mptcp", action="store_true")
    p.add_argument("--plane", type=int, default=0, help="TCP's plane (MPTCP: its first subflow's)")
    p.add_argument("--want-subflows", type=int, default=1)
    p.add_argument(
        "--setup-plane", type=int, default=0, help="MRC: the plane the side channel is set up over"
    )
    p.add_argument(
        "--deadline",
        type=float,
        help="give up this many seconds after the transfer started; the result then says"
        " finished: false, with the bytes moved so far",
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.role.startswith("mrc"):
        from mrc.transport.loop import run

        fn = mrc_recv if args.role == "mrc-recv" else mrc_send
        out = run(fn(args))
    elif args.role == "tcp-recv":
        out = stream_recv(args)
    else:
        out = stream_send(args)
    tmp = args.result + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh)
    os.replace(tmp, args.result)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
