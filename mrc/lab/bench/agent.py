"""The ``mrc-bench`` agent: one long-lived process per fabric host, inside its namespace.

Started by the coordinator as ``mrc-fabric exec --name F hX -- python -m mrc.lab.bench.agent ...``
and driven over its stdin/stdout: one JSON request per line in, one JSON reply per line out,
strictly in turn. Logs go to stderr. The agent exits when stdin closes (the coordinator died or
is done), so it never outlives a run.

Requests (``op``):

* ``listen`` {transport, opts}: open the transport's server side (MRC listener with a
  registered inbox, or a TCP / MPTCP listening socket);
* ``connect`` {transport, peers, expect, opts}: connect to every host in ``peers`` and wait
  until every host in ``expect`` has connected to us; connections stay up for the whole run;
* ``step`` {transport, k, sends: [[dst, size]], recvs: [[src, size]], timeout}: start every
  send of step k at once, wait for every completion (MRC: the WRITE_IMM acknowledged at the
  sender; the receiver's in-order WRITE_IMM completion with immediate k; TCP/MPTCP: the last
  byte written / read), reply with the CLOCK_MONOTONIC time of each completion;
* ``verify`` {k}: SHA-256 of what step k sent to each peer and of what landed from each peer;
* ``stats`` {transport}: transport counters (retransmissions, trims, EV health, subflows...);
* ``close`` {transport}: drop the transport's connections; ``exit``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mrc.errors import MRCError
from mrc.lab.bench.common import (
    IMM_MASK,
    IPPROTO_MPTCP,
    MPTCP_PORT,
    MRC_PORT,
    TCP_PORT,
    PlaneNicLike,
    dumps,
    make_pool,
    mptcp_setup_commands,
    mptcp_subflows,
    now,
    send_offset,
    sha256,
)
from mrc.lab.bench.schema import Refused, parse_line, read_line

QUEUE_MAX = 64  # requests waiting for their turn (the coordinator sends one at a time)
ASIDE_MAX = 8  # out-of-turn requests running at once (a fault and a heal)
HDR = struct.Struct("!II")  # stream framing: step number, byte count
HELLO = struct.Struct("!I")  # stream hello: the connecting host's index


def log(msg: str) -> None:
    sys.stderr.write(f"[agent] {msg}\n")
    sys.stderr.flush()


# ---- transports --------------------------------------------------------------------------


class Transport:
    name = "?"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def listen(self, opts: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def connect(
        self, peers: list[int], expect: list[int], opts: dict[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def send(self, k: int, dst: int, view: memoryview) -> Awaitable[object]:
        raise NotImplementedError

    async def recv(self, k: int, src: int, size: int) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        return None


class MrcTransport(Transport):
    """MRC queue pairs over every plane, EVs spread over the fabric's SRv6 paths."""

    name = "mrc"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self.listener: Any = None
        self.out: dict[int, Any] = {}  # dst -> Connection (we write into dst's inbox)
        self.inbound: dict[int, Any] = {}  # src -> accepted Connection (src writes to us)
        self.ev_events: dict[str, int] = {}
        self.opts: dict[str, Any] = {}

    def _config(self, opts: dict[str, Any]) -> Any:
        """The QPConfig of every QP: the coordinator's ``--qp`` settings, as mrc-send reads
        them (mrc/cli/qpopts.py), which only names a law: one given as code must be among the
        laws this agent loaded at its start. Callers pass them through
        :meth:`Agent.check_laws` first, which says so in one line."""
        from mrc.cli.qpopts import apply_settings
        from mrc.core.config import QPConfig

        return apply_settings(QPConfig(), [str(s) for s in opts["qp"]])

    async def listen(self, opts: dict[str, Any]) -> dict[str, Any]:
        import mrc

        self.agent.check_laws(opts)
        self.opts = opts
        a = self.agent
        config = mrc.ListenerConfig(
            plane_addrs=a.addrs,
            evs=int(opts["listener_evs"]),
            qp=self._config(opts),
            fabric=a.topo,
            ports=a.ports,
        )
        self.listener = await mrc.listen("::", MRC_PORT, config)
        self.listener.register(a.inbox, name="inbox")
        return {"port": self.listener.port}

    def _ev_counter(self, role: str) -> Any:
        """Count EV transitions by direction (data: our QPs' EVs towards peers; acks: the
        reverse EVs of accepted QPs), new state and kind of reason (numbers stripped)."""

        def count(ev: Any) -> None:
            kind = "".join(c for c in ev.reason_text.split(":")[0] if not c.isdigit()).strip()
            key = f"{role}: {ev.old_label} -> {ev.new_label} ({kind})"
            self.ev_events[key] = self.ev_events.get(key, 0) + 1

        return count

    async def connect(
        self, peers: list[int], expect: list[int], opts: dict[str, Any]
    ) -> dict[str, Any]:
        import mrc

        a = self.agent
        a.check_laws(opts)
        cfg = self._config(opts)
        # the side channel is set up over plane ``side_plane`` (0 unless the coordinator says:
        # for link_down, the plane of the link it breaks, so the failure hits the set-up's
        # plane as it would any plane; no plane is protected). After set-up its paths run over
        # every plane; a set-up whose plane does not answer tries the peer's others.
        side = int(opts.get("side_plane", 0))

        async def one(dst: int) -> None:
            addrs = a.peers[dst].addrs
            first = side if side < len(addrs) else 0
            config = mrc.ConnectConfig(
                evs=int(opts["evs"]),
                local_addrs=a.addrs,
                qp=cfg,
                fabric=a.topo,
                timeout=float(opts.get("timeout", 10.0)),
                ports=a.ports,
            )
            # the first address, then the others beside it if it does not answer
            hosts = [addrs[first], *(x for i, x in enumerate(addrs) if i != first)]
            conn = await mrc.connect(hosts, MRC_PORT, config)
            if "inbox" not in conn.remote:
                raise MRCError(f"h{dst} did not announce its inbox")
            conn.on_ev_change(self._ev_counter("data"))
            self.out[dst] = conn

        await asyncio.gather(*(one(d) for d in peers if d not in self.out))
        by_addr = {p.addrs[0]: p.index for p in a.peers}
        deadline = now() + float(opts.get("timeout", 10.0))
        while any(s not in self.inbound for s in expect):
            left = deadline - now()
            if left <= 0:
                missing = [f"h{s}" for s in expect if s not in self.inbound]
                raise MRCError(f"no MRC connection from {', '.join(missing)} in time")
            conn = await self.listener.accept(timeout=left)
            addrs = conn.peer_addrs
            src = by_addr.get(str(addrs[0])) if addrs else None
            if src is None:
                raise MRCError(f"MRC connection from an unknown host {addrs}")
            conn.on_ev_change(self._ev_counter("acks"))
            self.inbound[src] = conn
        evs = {d: len(c.ev_report()) for d, c in self.out.items()}
        return {"evs": evs, "routes": sorted({r for c in self.out.values() for r in c.routes})}

    def send(self, k: int, dst: int, view: memoryview) -> Awaitable[object]:
        conn = self.out[dst]
        region = conn.remote["inbox"]
        done: Awaitable[object] = conn.post_write(
            view, region, offset=self.agent.me * self.agent.slot, imm=k & IMM_MASK
        )
        return done

    async def recv(self, k: int, src: int, size: int) -> None:
        conn = self.inbound[src]
        imm = await conn.next_immediate()
        if imm != k & IMM_MASK:
            raise MRCError(f"WRITE_IMM from h{src} carried {imm}, expected step {k}")

    def stats(self) -> dict[str, Any]:
        keys = (
            "packets_sent",
            "data_packets_sent",
            "retransmits",
            "retransmits_nack",
            "retransmits_timeout",
            "silent_timeouts",
            "retransmits_tlp",
            "retransmits_sack",
            "nacks",
            "sacks",
            "probes_sent",
        )
        out: dict[str, Any] = {k: 0 for k in keys}
        for conn in self.out.values():
            st = conn.stats()
            for k in keys:
                out[k] += int(st.get(k, 0))
        rx_keys = ("packets_received", "duplicates", "trims_seen", "nacks_sent", "acks_sent")
        for k in rx_keys:
            out[k] = sum(int(c.stats().get(k, 0)) for c in self.inbound.values())
        drops: dict[str, int] = {}
        for conn in list(self.out.values()) + list(self.inbound.values()):
            for reason, n in conn.stats().get("dropped_by_reason", {}).items():
                drops[reason] = drops.get(reason, 0) + int(n)
        out["dropped_by_reason"] = drops
        evs = [c.ev_counters() for c in self.out.values()]
        out["evs_assumed_bad"] = sum(e["evs_assumed_bad"] for e in evs)
        out["evs_resurrected"] = sum(e["evs_resurrected"] for e in evs)
        out["evs_assumed_bad_false"] = sum(e["evs_assumed_bad_false"] for e in evs)
        out["planes_lost"] = sum(e["planes_lost"] for e in evs)
        # losses not held against an EV, data and ACK EVs alike (docs/EV_HEALTH.md)
        both = evs + [c.ev_counters() for c in self.inbound.values()]
        for k in ("ev_losses_congested", "ev_losses_delayed"):
            out[k] = sum(e[k] for e in both)
        out["ev_transitions"] = dict(self.ev_events)
        out["send_errors"] = sum(int(c.stats()["send_errors"]) for c in self.out.values())
        return out

    async def close(self) -> None:
        for conn in self.out.values():
            with contextlib.suppress(Exception):
                await conn.close()
        self.out.clear()
        self.inbound.clear()
        if self.listener is not None:
            with contextlib.suppress(Exception):
                await self.listener.close()
            self.listener = None


def _snmp_tcp() -> dict[str, int]:
    """This namespace's Tcp counters (IPv4 and IPv6 share them)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/net/snmp") as f:
        lines = [ln.split() for ln in f if ln.startswith("Tcp:")]
    if len(lines) >= 2:
        for key, val in zip(lines[0][1:], lines[1][1:], strict=False):
            with contextlib.suppress(ValueError):
                out[key] = int(val)
    return out


class StreamTransport(Transport):
    """Kernel TCP (``proto=0``, plane 0 only) or MPTCP (``proto=262``, subflows per plane)."""

    def __init__(self, agent: Agent, name: str, proto: int, port: int) -> None:
        super().__init__(agent)
        self.name = name
        self.proto = proto
        self.port = port
        self.lsock: socket.socket | None = None
        self.accept_task: asyncio.Task[None] | None = None
        self.out: dict[int, socket.socket] = {}
        self.inbound: dict[int, socket.socket] = {}
        self.inbound_event = asyncio.Event()
        self.hdr = bytearray(HDR.size)
        self.base = _snmp_tcp()
        self.added_endpoints: list[str] = []

    def _socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, self.proto)
        with contextlib.suppress(OSError):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        return s

    def _mptcp_setup(self) -> list[str]:
        """Set the in-kernel path manager up (see :func:`mptcp_setup_commands`). On a shared
        host (a launched rank on a real machine) the host's own endpoints stay, and the ones
        added here are removed again at close."""
        if self.agent.mptcp_ready:
            return ["path manager set up by the coordinator"]
        shared = self.agent.shared_host
        done = []
        for cmd in mptcp_setup_commands(self.agent.nics, flush=not shared):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                if shared and cmd[3] == "add" and "exists" in r.stderr.lower():
                    continue  # the host announces this address already
                raise MRCError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
            if cmd[3] == "add":
                self.added_endpoints.append(cmd[4])
            done.append(" ".join(cmd))
        return done

    def _mptcp_remove_added(self) -> None:
        """Delete the endpoints :meth:`_mptcp_setup` added (by the ids ``ip mptcp`` shows)."""
        if not self.added_endpoints:
            return
        show = subprocess.run(["ip", "mptcp", "endpoint", "show"], capture_output=True, text=True)
        for line in show.stdout.splitlines():
            words = line.split()
            if words and words[0] in self.added_endpoints and "id" in words:
                eid = words[words.index("id") + 1]
                subprocess.run(
                    ["ip", "mptcp", "endpoint", "delete", "id", eid], capture_output=True
                )
        self.added_endpoints.clear()

    async def listen(self, opts: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.proto == IPPROTO_MPTCP:
            info["mptcp"] = self._mptcp_setup()
        s = self._socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # MPTCP: listen on every address, so joins to our announced plane addresses find us
        bind = "::" if self.proto == IPPROTO_MPTCP else self.agent.addrs[0]
        s.bind((bind, self.port))
        s.listen(128)
        self.lsock = s
        self.accept_task = asyncio.get_running_loop().create_task(self._accept_loop())
        return info

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.lsock is not None
        while True:
            conn, _addr = await loop.sock_accept(self.lsock)
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                hello = await asyncio.wait_for(self._read_exact(conn, HELLO.size), 5.0)
            except (TimeoutError, OSError, MRCError):
                conn.close()
                continue
            (src,) = HELLO.unpack(hello)
            old = self.inbound.pop(src, None)
            if old is not None:
                old.close()
            self.inbound[src] = conn
            self.inbound_event.set()

    async def _read_exact(self, sock: socket.socket, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = await loop.sock_recv_into(sock, view[got:])
            if r == 0:
                raise MRCError("peer closed the connection")
            got += r
        return bytes(buf)

    async def connect(
        self, peers: list[int], expect: list[int], opts: dict[str, Any]
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        a = self.agent
        timeout = float(opts.get("timeout", 10.0))

        async def one(dst: int) -> None:
            s = self._socket()
            s.bind((a.addrs[0], 0))
            try:
                await asyncio.wait_for(
                    loop.sock_connect(s, (a.peers[dst].addrs[0], self.port)), timeout
                )
                await loop.sock_sendall(s, HELLO.pack(a.me))
            except (OSError, TimeoutError) as exc:
                s.close()
                raise MRCError(f"{self.name} connect to h{dst}: {exc or 'timed out'}") from None
            self.out[dst] = s

        await asyncio.gather(*(one(d) for d in peers if d not in self.out))
        deadline = now() + timeout
        while any(s not in self.inbound for s in expect):
            left = deadline - now()
            if left <= 0:
                missing = [f"h{s}" for s in expect if s not in self.inbound]
                raise MRCError(f"no {self.name} connection from {', '.join(missing)} in time")
            self.inbound_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inbound_event.wait(), left)
        info: dict[str, Any] = {}
        if self.proto == IPPROTO_MPTCP:
            # wait (briefly) until each connection has its extra subflows: one per other plane
            want = a.planes - 1
            until = now() + float(opts.get("subflow_wait", 3.0))
            while now() < until and any((mptcp_subflows(s) or 0) < want for s in self.out.values()):
                await asyncio.sleep(0.02)
            info["subflows"] = {d: mptcp_subflows(s) for d, s in self.out.items()}
        return info

    async def _send(self, k: int, view: memoryview, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, HDR.pack(k & IMM_MASK, len(view)))
        await loop.sock_sendall(sock, view)

    def send(self, k: int, dst: int, view: memoryview) -> Awaitable[object]:
        return self._send(k, view, self.out[dst])

    async def recv(self, k: int, src: int, size: int) -> None:
        loop = asyncio.get_running_loop()
        sock = self.inbound[src]
        hdr = HDR.unpack(await self._read_exact(sock, HDR.size))
        if hdr != (k & IMM_MASK, size):
            raise MRCError(f"h{src} framed step {hdr[0]} ({hdr[1]} bytes), expected {k}")
        a = self.agent
        view = a.inbox_view[src * a.slot : src * a.slot + size]
        got = 0
        while got < size:
            r = await loop.sock_recv_into(sock, view[got:])
            if r == 0:
                raise MRCError(f"h{src} closed the connection mid-transfer")
            got += r

    def stats(self) -> dict[str, Any]:
        cur = _snmp_tcp()
        out: dict[str, Any] = {
            "retrans_segs": cur.get("RetransSegs", 0) - self.base.get("RetransSegs", 0),
            "out_segs": cur.get("OutSegs", 0) - self.base.get("OutSegs", 0),
        }
        if self.proto == IPPROTO_MPTCP:
            out["subflows"] = {d: mptcp_subflows(s) for d, s in self.out.items()}
        return out

    async def close(self) -> None:
        if self.accept_task is not None:
            self.accept_task.cancel()
            self.accept_task = None
        for s in list(self.out.values()) + list(self.inbound.values()):
            s.close()
        self.out.clear()
        self.inbound.clear()
        if self.lsock is not None:
            self.lsock.close()
            self.lsock = None
        if self.proto == IPPROTO_MPTCP and self.agent.shared_host:
            self._mptcp_remove_added()


# ---- the agent ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlaneNic:
    """One of a host's plane NICs: what MPTCP's path manager is set up with."""

    plane: int
    nic: str
    address: str


@dataclass(frozen=True)
class Peer:
    """A host of the run: its index (the rank, when launched), a name for messages, and its
    address on each plane in plane order."""

    index: int
    name: str
    addrs: tuple[str, ...]


class Agent:
    """The work of one host: its transports, its data pool and the inbox peers write into.

    ``peers`` are every host of the run in index order (``me`` among them); ``topo`` is an
    mrc-fabric or real-network topology when there is one (MRC's EVs then take its SRv6
    paths), None between plain hosts."""

    def __init__(
        self,
        me: int,
        peers: list[Peer],
        nics: Sequence[PlaneNicLike],
        topo: Any,
        max_size: int,
        seed: int,
        mptcp_ready: bool = False,
        ports: Any = None,
        shared_host: bool = False,
        laws: frozenset[str] | None = None,
    ) -> None:
        self.topo = topo
        self.me = me
        self.peers = peers
        self.name = peers[me].name
        self.nics = nics
        self.addrs = list(peers[me].addrs)
        self.planes = len(self.addrs)
        self.ports = ports  # mrc.transport.ports.PortRange or None
        #: a launched rank's host is the user's own: leave its MPTCP endpoints alone
        self.shared_host = shared_host
        #: the window laws named as code (MODULE:CLASS) a request may choose, besides the
        #: registered ones: those of this process's own command line (a launched rank's --cc
        #: and --qp cc=, an agent's --cc), loaded there; None: not checked (a law not loaded
        #: still fails, as the QP's config is validated: nothing here loads code)
        self.laws = laws
        self.slot = max_size
        self.mptcp_ready = mptcp_ready
        self.pool = make_pool(seed, self.me, max_size)
        self.pool_view = memoryview(self.pool)
        self.inbox = bytearray(self.slot * len(peers))
        self.inbox_view = memoryview(self.inbox)
        self.transports: dict[str, Transport] = {}
        self.last: dict[str, Any] = {}  # the last step: k, sends, recvs (for verify)

    @classmethod
    def on_fabric(cls, args: argparse.Namespace) -> Agent:
        """Host ``args.index`` of the mrc-fabric ``args.fabric`` (the coordinator's agents)."""
        from mrc.lab.fabric import load_topology

        topo = load_topology(args.fabric)
        peers = [
            Peer(h.index, h.name, tuple(n.address for n in sorted(h.nics, key=lambda n: n.plane)))
            for h in topo.hosts
        ]
        return cls(
            args.index,
            peers,
            topo.hosts[args.index].nics,
            topo,
            args.max_size,
            args.seed,
            bool(getattr(args, "mptcp_ready", False)),
            laws=load_laws(getattr(args, "cc", None) or []),
        )

    def transport(self, name: str, create: bool = False) -> Transport:
        t = self.transports.get(name)
        if t is None:
            if not create:
                raise MRCError(f"transport {name} is not set up")
            if name == "mrc":
                t = MrcTransport(self)
            elif name == "tcp":
                t = StreamTransport(self, "tcp", 0, TCP_PORT)
            elif name == "mptcp":
                t = StreamTransport(self, "mptcp", IPPROTO_MPTCP, MPTCP_PORT)
            else:
                raise MRCError(f"unknown transport {name!r}")
            self.transports[name] = t
        return t

    def check_laws(self, opts: dict[str, Any]) -> list[str]:
        """The ``--qp`` settings of ``opts``; :class:`Refused` if one names code
        (``cc=MODULE:CLASS``, a law file) other than the laws this agent loaded from its own
        command line (:attr:`laws`): an agent or a launched rank takes code only from there,
        never from its pipe or control connection (and nothing sent there is imported)."""
        from mrc.cli.qpopts import parse_setting
        from mrc.core.cc import names

        settings = [str(s) for s in opts.get("qp", [])]
        if self.laws is None:
            return settings
        for text in settings:
            key, value = parse_setting(text)
            if key == "cc" and value not in names() and value not in self.laws:
                own = ", ".join(sorted(self.laws)) or "none"
                raise Refused(
                    f"--qp {text[:200]!r} names code, which a rank takes only from its own"
                    f" command line: a registered law ({', '.join(names())}) or its --cc"
                    f" ({own})"
                )
        return settings

    def send_view(self, k: int, dst: int, size: int) -> memoryview:
        off = send_offset(k, dst)
        return self.pool_view[off : off + size]

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        if op == "ping":
            return {"host": self.name, "addrs": self.addrs, "pid": os.getpid(), "now": now()}
        if op in ("listen", "connect"):
            self.check_laws(msg.get("opts", {}))  # before anything is set up
        if op == "listen":
            return await self.transport(msg["transport"], create=True).listen(msg.get("opts", {}))
        if op == "connect":
            t = self.transport(msg["transport"])
            return await t.connect(list(msg["peers"]), list(msg["expect"]), msg.get("opts", {}))
        if op == "step":
            return await self.step(msg)
        if op == "verify":
            return self.verify(int(msg["k"]))
        if op == "stats":
            out = self.transport(msg["transport"]).stats()
            # this host's process CPU (every thread, user and system), so that a report can
            # say whether the hosts were CPU-bound; the coordinator sums hosts, diffs series
            out["process_cpu_ms"] = int(time.process_time() * 1000)
            return out
        if op == "close":
            if msg["transport"] in self.transports:
                await self.transports.pop(msg["transport"]).close()
            return {}
        raise MRCError(f"unknown request {op!r}")

    async def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        t_cmd = now()
        k = int(msg["k"])
        sends = [(int(d), int(n)) for d, n in msg.get("sends", [])]
        recvs = [(int(s), int(n)) for s, n in msg.get("recvs", [])]
        for peer, size in sends + recvs:  # a slice of the pool or inbox, never past it
            if not 0 <= peer < len(self.peers) or peer == self.me:
                raise Refused(f"step {k}: no peer h{peer} to exchange with")
            if not 0 <= size <= self.slot:
                raise Refused(f"step {k}: {size} bytes do not fit a slot of {self.slot}")
        t = self.transport(msg["transport"])
        self.last = {"k": k, "sends": sends, "recvs": recvs}
        done: dict[str, float] = {}
        errors: list[str] = []

        async def track(label: str, aw: Awaitable[object]) -> None:
            try:
                await aw
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                errors.append(f"{label}: {exc}")
                return
            done[label] = now()

        tasks: dict[asyncio.Task[None], str] = {}
        loop = asyncio.get_running_loop()
        for src, size in recvs:
            label = f"recv:h{src}"
            tasks[loop.create_task(track(label, t.recv(k, src, size)))] = label
        for dst, size in sends:
            label = f"send:h{dst}"
            try:
                aw = t.send(k, dst, self.send_view(k, dst, size))
            except Exception as exc:  # noqa: BLE001 - e.g. the QP already failed
                errors.append(f"{label}: {exc}")
                continue
            tasks[loop.create_task(track(label, aw))] = label
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=float(msg.get("timeout", 30.0)))
            for task in pending:
                task.cancel()
                errors.append(f"{tasks[task]}: not complete after {msg.get('timeout')} s")
        return {"t_cmd": t_cmd, "done": done, "errors": errors}

    def verify(self, k: int) -> dict[str, Any]:
        if self.last.get("k") != k:
            raise MRCError(f"verify {k}: the last step here was {self.last.get('k')}")
        sent = {str(d): sha256(self.send_view(k, d, n)) for d, n in self.last["sends"]}
        recv = {
            str(s): sha256(self.inbox_view[s * self.slot : s * self.slot + n])
            for s, n in self.last["recvs"]
        }
        return {"sent": sent, "recv": recv}

    async def close(self) -> None:
        for t in list(self.transports.values()):
            with contextlib.suppress(Exception):
                await t.close()
        self.transports.clear()


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve_lines(
    reader: asyncio.StreamReader,
    reply: Callable[[dict[str, Any]], None],
    handle: Handler,
    out_of_turn: frozenset[str] = frozenset(),
    max_line: int | None = None,
    refused: Callable[[str], None] | None = None,
) -> bool:
    """Answer one JSON request per line from ``reader`` with ``handle``, in turn, until the
    stream ends (False) or an ``exit`` request (True). Errors go back as ``{"ok": false,
    "error": ...}``. Requests whose op is in ``out_of_turn`` run beside the others (a fault
    command must not wait for the step it interrupts); their replies carry their ids.
    A line longer than ``max_line``, or not a JSON object, is answered with an error, passed
    to ``refused`` and skipped."""

    async def answer(msg: dict[str, Any]) -> None:
        mid = _id(msg)
        try:
            result = await handle(msg)
            reply({"id": mid, "ok": True, **result})
        except (MRCError, OSError, TimeoutError, KeyError, ValueError, TypeError) as exc:
            reply({"id": mid, "ok": False, "error": str(exc) or type(exc).__name__})
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            log(traceback.format_exc())
            reply({"id": mid, "ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"})

    def refuse(msg: dict[str, Any], why: str) -> None:
        if refused is not None:
            refused(why)
        reply({"id": _id(msg), "ok": False, "error": f"refused: {why}"})

    # in-turn requests go through one worker while this loop keeps reading, so an out-of-turn
    # request is read (and run) even while a long step is being answered
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def in_turn() -> None:
        while True:
            await answer(await queue.get())

    loop = asyncio.get_running_loop()
    worker = loop.create_task(in_turn())
    aside: set[asyncio.Task[None]] = set()
    try:
        while True:
            msg = await _next_request(reader, reply, max_line, refused)
            if msg is None:
                return False
            if msg.get("op") == "exit":  # whatever still runs is abandoned (finally below)
                reply({"id": _id(msg), "ok": True})
                return True
            if msg.get("op") in out_of_turn:
                if len(aside) >= ASIDE_MAX:
                    refuse(msg, f"more than {ASIDE_MAX} {msg.get('op')} requests at once")
                    continue
                task = loop.create_task(answer(msg))
                aside.add(task)
                task.add_done_callback(aside.discard)
            elif queue.qsize() >= QUEUE_MAX:
                refuse(msg, f"more than {QUEUE_MAX} requests waiting")
            else:
                queue.put_nowait(msg)
    finally:
        for task in (worker, *aside):
            task.cancel()
        await asyncio.gather(worker, *aside, return_exceptions=True)


def _id(msg: dict[str, Any]) -> int | None:
    """A request's id to put in its reply: an integer, or None (never an echo of junk)."""
    mid = msg.get("id")
    return mid if type(mid) is int else None


async def _next_request(
    reader: asyncio.StreamReader,
    reply: Callable[[dict[str, Any]], None],
    max_line: int | None = None,
    refused: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """The next request object from ``reader`` (malformed lines answered and skipped), or
    None when the stream ends or breaks."""
    while True:
        try:
            if max_line is None:
                line = await reader.readline()
            else:
                line = await read_line(reader, max_line, skip_long=True)
            if not line:
                return None
            return parse_line(line)
        except Refused as exc:  # a line too long, not JSON, nested too deep
            if refused is not None:
                refused(str(exc))
            reply({"id": None, "ok": False, "error": f"refused: {exc}"})
        except (ConnectionError, ValueError):  # a reset, or a line past the reader's limit
            return None


def load_laws(texts: Sequence[str]) -> frozenset[str]:
    """Load the window laws of an agent's own command line (``--cc MODULE:CLASS``, which the
    coordinator passes as it loaded them: mrc.core.cc.load) and name them as requests may."""
    from mrc.core.cc import load

    return frozenset(load(text) for text in texts)


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer

    def reply(obj: dict[str, Any]) -> None:
        out.write(dumps(obj))
        out.flush()

    try:
        agent = Agent.on_fabric(args)
    except Exception as exc:  # noqa: BLE001 - one line to the coordinator
        reply({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    reply({"ready": True, "host": agent.name, "pid": os.getpid()})
    try:
        await serve_lines(reader, reply, agent.handle)
    finally:
        await agent.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrc.lab.bench.agent")
    p.add_argument("--fabric", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--max-size", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--cc",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="a window law given as code, loaded at the start: the only code a request's"
        " cc= setting may name (repeatable)",
    )
    p.add_argument(
        "--mptcp-ready",
        action="store_true",
        help="the MPTCP path manager was set up from outside (a container host whose user "
        "may not configure it)",
    )
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    from mrc.transport.loop import run

    try:
        return run(serve(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
