"""``mrc-bench`` as a launched job: one process per host, started by mpiexec, srun or torchrun.

Every rank runs this module's :func:`run_rank`. The launcher gives each its rank and rank 0's
control address (:mod:`mrc.lab.bench.rendezvous`); each rank finds its plane addresses
(:mod:`mrc.lab.bench.planes`). Rank 0 then is the coordinator of the built-in mode
(:class:`~mrc.lab.bench.coordinator.Bench`, the same steps, barriers, hashes and rows) over a
TCP control connection to every other rank instead of pipes to agents it started, and serves
its own host's part in-process. No fabric is built: the hosts are whatever the launcher ran on,
and a plane failure is a command the user gives (``--fault-cmd``/``--heal-cmd``) that one rank
runs on its own host.

Control protocol: a rank connects to rank 0 and sends one hello line (``{"hello": 1, "rank",
"world", "token", "name", "addrs", "mtus", "net_admin", "pid"}``); rank 0 answers
``{"ok": true}`` or ``{"ok": false, "error"}`` and from then on sends the agents' requests
(mrc.lab.bench.agent) plus ``init`` (every rank's addresses), ``fault`` and ``heal``; ``exit``
ends the rank. A hello with a wrong token, rank or world size is refused and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mrc.errors import AgentError, MRCError, UsageError
from mrc.lab.bench.agent import Agent, Peer, PlaneNic, serve_lines
from mrc.lab.bench.common import dumps
from mrc.lab.bench.coordinator import AgentLink, Bench, BenchConfig
from mrc.lab.bench.planes import Planes
from mrc.lab.bench.rendezvous import Rendezvous, new_token

HELLO_TIMEOUT = 10.0  # a connection that sends no hello in this long is dropped
CONNECT_TRY = 2.0  # one attempt to reach rank 0
FAULT_TIMEOUT = 60.0  # a --fault-cmd/--heal-cmd that runs longer fails
LAUNCHED_CONDITIONS = ("clean", "link_down")


@dataclass
class LaunchOptions:
    """What a launched run needs beyond :class:`BenchConfig`."""

    rendezvous_timeout: float = 120.0
    control_addr: str | None = None
    fault_cmd: str | None = None
    heal_cmd: str | None = None
    fault_rank: int = 0
    rate_bps: int | None = None  # the planes' link rate, for the ideal step time
    payload_given: bool = False  # --payload on the command line: else from the NICs' MTU
    transports_given: bool = False
    ports: Any = None  # mrc.transport.ports.PortRange


CAP_NET_ADMIN = 12


def has_net_admin(status: str = "/proc/self/status") -> bool:
    """Whether this process holds CAP_NET_ADMIN (MPTCP's path manager, link faults need it)."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _mtu(nic: str) -> int | None:
    try:
        with open(f"/sys/class/net/{nic}/mtu") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


# ---- a rank's side ---------------------------------------------------------------------------


class RankServer:
    """One rank's host: the agent (made at ``init``) and its own fault and heal commands."""

    def __init__(self, rv: Rendezvous, planes: Planes, opts: LaunchOptions) -> None:
        self.rv = rv
        self.planes = planes
        self.opts = opts
        self.agent: Agent | None = None

    def hello(self) -> dict[str, Any]:
        return {
            "hello": 1,
            "rank": self.rv.rank,
            "world": self.rv.world,
            "token": self.rv.token,
            "name": socket.gethostname() + f"/{self.rv.rank}",
            "addrs": list(self.planes.addrs),
            "mtus": [_mtu(n) if n else None for n in self.planes.nics],
            "net_admin": has_net_admin(),
            "pid": os.getpid(),
        }

    def _init(self, msg: dict[str, Any]) -> dict[str, Any]:
        peers = [
            Peer(int(p["rank"]), str(p["name"]), tuple(str(a) for a in p["addrs"]))
            for p in msg["peers"]
        ]
        if [p.index for p in peers] != list(range(len(peers))) or self.rv.rank >= len(peers):
            raise MRCError("init: the peer table is not in rank order")
        nics = [
            PlaneNic(i, n, a)
            for i, (n, a) in enumerate(zip(self.planes.nics, self.planes.addrs, strict=True))
        ]
        self.agent = Agent(
            self.rv.rank,
            peers,
            nics,
            self.planes.topo,
            int(msg["max_size"]),
            int(msg["seed"]),
            ports=self.opts.ports,
            shared_host=True,
        )
        return {}

    async def _run_own(self, which: str) -> dict[str, Any]:
        """Run this rank's own ``--fault-cmd`` or ``--heal-cmd`` (never a command sent over the
        control connection), with the rank and its NICs in the environment."""
        cmd = self.opts.fault_cmd if which == "fault" else self.opts.heal_cmd
        if not cmd:
            raise MRCError(f"rank {self.rv.rank} was given no --{which}-cmd")
        env = dict(os.environ, MRC_RANK=str(self.rv.rank), MRC_WORLD=str(self.rv.world))
        for p, (nic, addr) in enumerate(zip(self.planes.nics, self.planes.addrs, strict=True)):
            env[f"MRC_NIC{p}"] = nic
            env[f"MRC_ADDR{p}"] = addr
        proc = await asyncio.create_subprocess_shell(
            cmd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), FAULT_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise MRCError(f"--{which}-cmd did not finish in {FAULT_TIMEOUT:g} s") from None
        if proc.returncode != 0:
            why = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
            raise MRCError(f"--{which}-cmd exited with {proc.returncode}: {why}")
        return {"t": time.monotonic()}

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        if op == "init":
            return self._init(msg)
        if op in ("fault", "heal"):
            return await self._run_own(str(op))
        if self.agent is None:
            raise MRCError(f"{op}: this rank has not been given its peers (init) yet")
        return await self.agent.handle(msg)

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()


async def _reach(rv: Rendezvous, deadline: float) -> tuple[asyncio.StreamReader, Any]:
    """Connect to rank 0, trying each published address in turn until ``deadline``."""
    last = "no address to try"
    while True:
        for host, port in rv.coordinator:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MRCError(f"rank 0 not reachable at {_where(rv)}: {last}")
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=1 << 24), min(CONNECT_TRY, left)
                )
            except (OSError, TimeoutError) as exc:
                last = str(exc) or "timed out"
        await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _where(rv: Rendezvous) -> str:
    return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in rv.coordinator)


async def serve_rank(rv: Rendezvous, server: RankServer, timeout: float) -> None:
    """A rank other than 0: say hello to rank 0, then answer its requests until ``exit``."""
    if rv.launcher == "mpi":
        await asyncio.to_thread(rv.publish, [], "")
    reader, writer = await _reach(rv, time.monotonic() + timeout)
    try:
        writer.write(dumps(server.hello()))
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        answer = json.loads(line) if line else {"error": "rank 0 closed the connection"}
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise MRCError(f"rank 0 refused rank {rv.rank}: {answer.get('error')}")

        def reply(obj: dict[str, Any]) -> None:
            writer.write(dumps(obj))

        if not await serve_lines(reader, reply, server.handle, frozenset({"fault", "heal"})):
            raise MRCError("rank 0 went away before the run ended")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
    except (TimeoutError, ValueError):
        raise MRCError("rank 0 did not answer the hello") from None
    finally:
        await server.close()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


# ---- rank 0's side ---------------------------------------------------------------------------


class RankLink(AgentLink):
    """Rank 0's control connection to another rank. Replies are matched to requests by id,
    so a fault command can run on a rank while a step waits there."""

    def __init__(
        self, index: int, reader: asyncio.StreamReader, writer: Any, hello: dict[str, Any]
    ) -> None:
        super().__init__(index)
        self.reader = reader
        self.writer = writer
        self.hello = hello
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading: asyncio.Task[None] | None = None

    async def exit_reason(self) -> str:
        return f"rank {self.index} ({self.hello.get('name')}) closed its control connection"

    async def _read_replies(self) -> None:
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue
                rid = reply.get("id") if isinstance(reply, dict) else None
                fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (ConnectionError, ValueError):
            pass
        self.dead = True
        why = await self.exit_reason()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentError(f"h{self.index}: {why}"))
        self._pending.clear()

    async def request(self, msg: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        if self.dead:
            raise AgentError(f"h{self.index}: {await self.exit_reason()}")
        loop = asyncio.get_running_loop()
        if self._reading is None:
            self._reading = loop.create_task(self._read_replies())
        self._next_id += 1
        mid = self._next_id
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[mid] = fut
        try:
            async with self._lock:  # whole lines, one writer at a time
                self.writer.write(dumps({"id": mid, **msg}))
                await self.writer.drain()
            reply = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise AgentError(
                f"h{self.index}: {msg.get('op')} not answered in {timeout:g} s"
            ) from None
        except (ConnectionError, OSError):
            self.dead = True
            raise AgentError(f"h{self.index}: {await self.exit_reason()}") from None
        finally:
            self._pending.pop(mid, None)
        if not reply.get("ok"):
            raise AgentError(f"h{self.index}: {msg.get('op')} failed: {reply.get('error')}")
        return reply

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.request({"op": "exit"}, 5.0)
        self.writer.close()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(BaseException):
                await self._reading
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)


class LocalLink(AgentLink):
    """Rank 0's own host, served in this process (no connection to itself)."""

    def __init__(self, server: RankServer) -> None:
        super().__init__(0)
        self.server = server

    async def request(self, msg: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        try:
            result = await asyncio.wait_for(self.server.handle(msg), timeout)
        except TimeoutError:
            raise AgentError(f"h0: {msg.get('op')} did not finish in {timeout:g} s") from None
        except (MRCError, OSError, KeyError, ValueError, TypeError) as exc:
            raise AgentError(f"h0: {msg.get('op')} failed: {exc}") from None
        return {"ok": True, **result}

    async def stop(self) -> None:
        await self.server.close()


class Gathering:
    """Rank 0's control listener: collects one hello per rank, refuses the rest."""

    def __init__(self, rv: Rendezvous, token: str) -> None:
        self.rv = rv
        self.token = token
        self.links: dict[int, RankLink] = {}
        self.refused: list[str] = []
        self.all_here = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def open(self, port: int) -> int:
        self.server = await asyncio.start_server(
            self._hello, host="::", port=port, limit=1 << 24, reuse_address=True
        )
        return int(self.server.sockets[0].getsockname()[1])

    def _refuse(self, writer: Any, why: str) -> None:
        self.refused.append(why)
        with contextlib.suppress(Exception):
            writer.write(dumps({"ok": False, "error": why}))
        writer.close()

    async def _hello(self, reader: asyncio.StreamReader, writer: Any) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT)
            hello = json.loads(line)
        except (TimeoutError, ValueError, ConnectionError):
            self._refuse(writer, "no hello")
            return
        if not isinstance(hello, dict) or hello.get("hello") != 1:
            self._refuse(writer, "not an mrc-bench hello")
            return
        rank, world = hello.get("rank"), hello.get("world")
        if self.token and hello.get("token") != self.token:
            self._refuse(writer, f"rank {rank}: wrong job token")
        elif world != self.rv.world:
            self._refuse(writer, f"rank {rank} counts {world} ranks, rank 0 {self.rv.world}")
        elif not isinstance(rank, int) or not 1 <= rank < self.rv.world:
            self._refuse(writer, f"no rank {rank!r} in a world of {self.rv.world}")
        elif rank in self.links:
            self._refuse(writer, f"rank {rank} twice")
        elif not isinstance(hello.get("addrs"), list) or not hello["addrs"]:
            self._refuse(writer, f"rank {rank} gave no plane addresses")
        else:
            writer.write(dumps({"ok": True}))
            self.links[rank] = RankLink(rank, reader, writer, hello)
            if len(self.links) == self.rv.world - 1:
                self.all_here.set()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.all_here.wait(), timeout)
        except TimeoutError:
            missing = [str(r) for r in range(1, self.rv.world) if r not in self.links]
            extra = f"; refused: {'; '.join(self.refused[:3])}" if self.refused else ""
            raise MRCError(
                f"ranks {', '.join(missing)} did not reach rank 0 in {timeout:g} s{extra}"
            ) from None

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)


class LaunchedBench(Bench):
    """The built-in coordinator's steps between launched ranks: no fabric, the user's fault."""

    def __init__(
        self,
        cfg: BenchConfig,
        progress: Callable[[str], None],
        links: list[AgentLink],
        opts: LaunchOptions,
    ) -> None:
        super().__init__(cfg, progress)
        self.links = links
        self.opts = opts
        self.offsets: dict[int, float] = {}  # rank -> its clock minus rank 0's (seconds)

    def condition_unavailable(self, condition: str) -> str | None:
        if condition not in LAUNCHED_CONDITIONS:
            return "needs mrc-bench's own fabric (not a launched run)"
        if condition == "link_down" and not (self.opts.fault_cmd and self.opts.heal_cmd):
            return "needs --fault-cmd and --heal-cmd"
        return None

    def fault_label(self) -> str:
        return f"rank {self.opts.fault_rank}: {self.opts.fault_cmd}"

    async def break_link(self, topo: Any) -> None:
        await self.links[self.opts.fault_rank].request({"op": "fault"}, FAULT_TIMEOUT + 5)

    async def heal_link(self, topo: Any) -> None:
        await self.links[self.opts.fault_rank].request({"op": "heal"}, FAULT_TIMEOUT + 5)

    def link_rate_bps(self, topo: Any) -> int | None:
        return self.opts.rate_bps

    def local_time(self, host: int, t: float) -> float:
        return t - self.offsets.get(host, 0.0)

    async def measure_clocks(self, samples: int = 8) -> dict[int, dict[str, float]]:
        """Each rank's CLOCK_MONOTONIC offset from rank 0's, so completion times from other
        hosts compare with rank 0's step start: ``samples`` pings each, the offset taken from
        the one with the shortest round trip (its midpoint), whose half is the error bound."""
        out: dict[int, dict[str, float]] = {}
        for link in self.links[1:]:
            best: tuple[float, float] | None = None
            for _ in range(samples):
                t0 = time.monotonic()
                reply = await link.request({"op": "ping"}, 10.0)
                t1 = time.monotonic()
                offset = float(reply["now"]) - (t0 + t1) / 2
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, offset)
            assert best is not None
            self.offsets[link.index] = best[1]
            out[link.index] = {
                "offset_ms": round(best[1] * 1e3, 3),
                "rtt_ms": round(best[0] * 1e3, 3),
            }
        return out

    async def run(self) -> None:
        for condition in self.cfg.conditions:
            if self.skip(condition):
                continue
            try:
                await self.run_workloads(self.links, None, condition)
            finally:
                for transport in self.cfg.transports:
                    await self.close_transport(self.links, transport)


def _smallest_mtu(hellos: list[dict[str, Any]]) -> int:
    """The smallest MTU of every rank's plane NICs (1500 where none was readable)."""
    mtus = [m for h in hellos for m in h.get("mtus") or [] if isinstance(m, int)]
    return min(mtus) if mtus else 1500


async def coordinate(
    rv: Rendezvous,
    server: RankServer,
    cfg: BenchConfig,
    opts: LaunchOptions,
    progress: Callable[[str], None],
) -> tuple[LaunchedBench, dict[str, Any]]:
    """Rank 0: gather the ranks, tell each every rank's planes, run the conditions."""
    t0 = time.monotonic()
    token = rv.token or (new_token() if rv.launcher == "mpi" else "")
    gathering = Gathering(rv, token)
    port = await gathering.open(rv.listen_port)
    mine = list(server.planes.addrs)
    cands = [opts.control_addr] if opts.control_addr else mine[::-1]  # the last plane first
    if rv.launcher == "mpi":
        await asyncio.to_thread(rv.publish, [(a, port) for a in cands], token)
    progress(
        f"rank 0 of {rv.world} ({rv.launcher}): control port {port}, planes {', '.join(mine)};"
        f" waiting for {rv.world - 1} ranks"
    )
    bench: LaunchedBench | None = None
    links: list[AgentLink] = [LocalLink(server)]
    skipped_transports: list[dict[str, str]] = []
    try:
        await gathering.wait(opts.rendezvous_timeout)
        links += [gathering.links[r] for r in range(1, rv.world)]
        hellos = [server.hello()] + [gathering.links[r].hello for r in range(1, rv.world)]
        planes = {len(h["addrs"]) for h in hellos}
        if len(planes) != 1:
            counts = ", ".join(f"rank {h['rank']}: {len(h['addrs'])}" for h in hellos)
            raise UsageError(f"the ranks have different numbers of planes ({counts})")
        cfg.hosts, cfg.planes, cfg.spines, cfg.leaves = rv.world, planes.pop(), 0, 0
        cfg.mtu = _smallest_mtu(hellos)
        if not opts.payload_given:
            cfg.payload = cfg.payload_for_mtu()
        if "mptcp" in cfg.transports and not all(h.get("net_admin") for h in hellos):
            who = ", ".join(str(h["rank"]) for h in hellos if not h.get("net_admin"))
            why = f"ranks {who} lack CAP_NET_ADMIN, which MPTCP's path manager needs (root has it)"
            if opts.transports_given:
                raise UsageError(f"mptcp: {why}")
            cfg.transports = [t for t in cfg.transports if t != "mptcp"]
            skipped_transports.append({"transport": "mptcp", "reason": why})
            progress(f"mptcp left out: {why}")
        peers = [{"rank": h["rank"], "name": h["name"], "addrs": h["addrs"]} for h in hellos]
        init = {"op": "init", "peers": peers, "max_size": cfg.max_size(), "seed": cfg.seed}
        await asyncio.gather(*(link.request(init) for link in links))
        startup = time.monotonic() - t0
        progress(f"{rv.world} ranks ready in {startup:.2f} s")
        bench = LaunchedBench(cfg, progress, links, opts)
        clocks = await bench.measure_clocks()
        await bench.run()
        info = {
            "launcher": rv.launcher,
            "ranks": [
                {
                    "rank": h["rank"],
                    "name": h["name"],
                    "addrs": h["addrs"],
                    "net_admin": h["net_admin"],
                }
                for h in hellos
            ],
            "startup_s": round(startup, 3),
            "clocks": {str(r): c for r, c in clocks.items()},
            "control_port": port,
            "refused_hellos": len(gathering.refused),
            "left_out": skipped_transports,
            "fault": None
            if not opts.fault_cmd
            else {"rank": opts.fault_rank, "fault_cmd": opts.fault_cmd, "heal_cmd": opts.heal_cmd},
        }
        return bench, info
    finally:
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)
        await gathering.close()
        if bench is not None:
            await bench.cleanup()


async def run_rank(
    rv: Rendezvous,
    planes: Planes,
    cfg: BenchConfig,
    opts: LaunchOptions,
    progress: Callable[[str], None],
) -> tuple[LaunchedBench, dict[str, Any]] | None:
    """This process's part of the job: rank 0 coordinates and returns the bench and the
    launch facts; any other rank serves until rank 0 says exit and returns None."""
    server = RankServer(rv, planes, opts)
    if rv.rank == 0:
        return await coordinate(rv, server, cfg, opts, progress)
    await serve_rank(rv, server, opts.rendezvous_timeout)
    return None
