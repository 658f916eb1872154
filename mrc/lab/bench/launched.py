"""``mrc-bench`` as a launched job: one process per host, started by mpiexec, srun or torchrun.

Every rank runs this module's :func:`run_rank`. The launcher gives each its rank and rank 0's
control address (:mod:`mrc.lab.bench.rendezvous`); each rank finds its plane addresses
(:mod:`mrc.lab.bench.planes`). Rank 0 then is the coordinator of the built-in mode
(:class:`~mrc.lab.bench.coordinator.Bench`, the same steps, barriers, hashes and rows) over a
TCP control connection to every other rank instead of pipes to agents it started, and serves
its own host's part in-process. No fabric is built: the hosts are whatever the launcher ran on,
and a plane failure is a command the user gives (``--fault-cmd``/``--heal-cmd``) that one rank
runs on its own host.

The control port is reachable by anyone on the network, and before rank 0 binds it anyone
can answer there, so nothing on a control connection is trusted (docs/CLUSTER.md, "Rendezvous
and hostile input"):

* Both ends prove the job token before a rank says anything about itself, and the token never
  crosses the connection. The rank sends ``{"hello": 2, "rank", "world", "nonce"}``; rank 0
  answers ``{"ok": true, "hello": 2, "nonce", "proof"}``, proof = HMAC-SHA256(token,
  "mrc-bench rank0|nonce_rank|nonce0|rank"); the rank checks it (if wrong, it hangs up, says
  so in one line and tries again until the rendezvous timeout), then sends ``{"proof", "name",
  "addrs", "mtus", "net_admin", "pid"}`` with its own proof, HMAC(token, "mrc-bench
  rank|nonce0|nonce_rank|rank"); rank 0 answers ``{"ok": true}`` or ``{"ok": false,
  "error"}``. Without a token (env or slurm and no MRC_BENCH_TOKEN) the proofs are "", every
  rank says at start that the channel is unauthenticated, and --fault-cmd is refused.
* Every line is data, checked field by field (:mod:`mrc.lab.bench.schema`) both ways: rank
  0's requests (the agents' ``listen``, ``connect``, ``step``, ``verify``, ``stats``,
  ``close``, ``ping``, and ``init`` with every rank's planes, ``fault``, ``heal``, ``exit``),
  the hellos, and every reply rank 0 uses. A refused request is answered ``{"ok": false,
  "error"}`` and the rank serves on; a refused hello is answered and closed; a refused reply
  fails its request as an error from the rank would. Each is counted, and logged in one line.
  No request names code: a rank's fault and heal commands and any window law given as code
  (``cc=MODULE:CLASS``) come from its own command line only.
* Bounded: lines (8 KiB during the hello, :func:`~mrc.lab.bench.schema.line_max` after),
  connections in their hello (the ranks still missing plus :data:`EXTRA_PENDING`; more are
  closed at once and counted), the time to finish the hello (10 s). Rank 0 listens on the
  address MASTER_ADDR names (:func:`~mrc.lab.bench.rendezvous.listen_addrs`), and stops
  listening once every rank is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrc.errors import AgentError, MRCError, UsageError
from mrc.lab.bench.agent import Agent, Peer, PlaneNic, serve_lines
from mrc.lab.bench.common import dumps
from mrc.lab.bench.coordinator import AgentLink, Bench, BenchConfig
from mrc.lab.bench.planes import Planes
from mrc.lab.bench.rendezvous import (
    RANK,
    RANK0,
    WILDCARD,
    Rendezvous,
    listen_addrs,
    new_nonce,
    new_token,
    proof,
    proves,
)
from mrc.lab.bench.schema import (
    ANSWER,
    CHALLENGE,
    HELLO,
    HELLO_BODY,
    HELLO_LINE_MAX,
    PROTOCOL,
    READ_LIMIT,
    LineTooLong,
    Refused,
    check_reply,
    check_request,
    line_max,
    parse_line,
    read_line,
)

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0  # a connection that has not finished its hello in this long is dropped
CONNECT_TRY = 2.0  # one attempt to reach rank 0
RETRY = 0.5  # pause before a rank tries rank 0 again after a failed hello
FAULT_TIMEOUT = 60.0  # a --fault-cmd/--heal-cmd that runs longer fails
EXTRA_PENDING = 4  # connections in their hello beyond the ranks still missing
LOG_REFUSALS = 20  # refusals logged one line each; the rest only counted
REASONS_KEPT = 20
WRITE_BUFFER_MAX = 16 << 20  # replies a peer leaves unread before its connection is dropped
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
    #: window laws given as code on this rank's own command line (--cc, --qp cc=), loaded
    #: there: the only MODULE:CLASS a request from rank 0 may choose (registered names are
    #: always fine; nothing a request names is ever imported)
    laws: frozenset[str] = field(default_factory=frozenset)


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


class _Tally:
    """Refusals: counted, the first few kept and logged one line each."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self.reasons: list[str] = []

    def __call__(self, why: str) -> None:
        self.count += 1
        if len(self.reasons) < REASONS_KEPT:
            self.reasons.append(why)
        if self.count <= LOG_REFUSALS:
            log.warning("%s: %s", self.what, why)
        elif self.count == LOG_REFUSALS + 1:
            log.warning("%s: more refusals are counted, not shown", self.what)


# ---- a rank's side ---------------------------------------------------------------------------


class RankServer:
    """One rank's host: the agent (made at ``init``) and its own fault and heal commands."""

    def __init__(self, rv: Rendezvous, planes: Planes, opts: LaunchOptions) -> None:
        self.rv = rv
        self.planes = planes
        self.opts = opts
        self.agent: Agent | None = None
        self.refused = _Tally(f"rank {rv.rank}: refused a request from rank 0")

    def hello(self) -> dict[str, Any]:
        """This rank's facts, as rank 0 keeps them (the hello without its proof)."""
        return {
            "rank": self.rv.rank,
            "world": self.rv.world,
            "name": socket.gethostname() + f"/{self.rv.rank}",
            "addrs": list(self.planes.addrs),
            "mtus": [_mtu(n) if n else None for n in self.planes.nics],
            "net_admin": has_net_admin(),
            "pid": os.getpid(),
        }

    def hello_body(self, proof: str) -> dict[str, Any]:
        """The rest of the hello, sent once rank 0 has proved the job token."""
        h = self.hello()
        del h["rank"], h["world"]
        return {"proof": proof, **h}

    def _init(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.agent is not None:
            raise Refused("init: this rank has its peers already")
        peers = [Peer(p["rank"], p["name"], tuple(p["addrs"])) for p in msg["peers"]]
        if [p.index for p in peers] != list(range(self.rv.world)):
            raise Refused("init: the peer table is not in rank order")
        mine = self.planes.addrs
        if peers[self.rv.rank].addrs != mine:
            raise Refused(f"init: this rank's planes are {', '.join(mine)}, not those given")
        if any(len(p.addrs) != len(mine) for p in peers):
            raise Refused(f"init: every rank must have {len(mine)} planes, as this one")
        nics = [
            PlaneNic(i, n, a) for i, (n, a) in enumerate(zip(self.planes.nics, mine, strict=True))
        ]
        self.agent = Agent(
            self.rv.rank,
            peers,
            nics,
            self.planes.topo,
            msg["max_size"],
            msg["seed"],
            ports=self.opts.ports,
            shared_host=True,
            laws=self.opts.laws,
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
        env.pop("MRC_BENCH_TOKEN", None)  # the job's secret is not the command's business
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
        """One request from rank 0, checked against its schema first; a refusal is counted."""
        try:
            msg = check_request(msg, self.rv.world)
            op = msg["op"]
            if op == "init":
                return self._init(msg)
            if op in ("fault", "heal"):
                return await self._run_own(op)
            if self.agent is None:
                raise MRCError(f"{op}: this rank has not been given its peers (init) yet")
            return await self.agent.handle(msg)
        except Refused as exc:
            self.refused(str(exc))
            raise

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()


class _TryAgain(MRCError):
    """Whoever answered at rank 0's address did not (yet) let this rank in, and may not be
    rank 0 at all: try again until the rendezvous timeout. ``kind``: the message without
    what the other end said, so that a stranger cannot make the rank log a line per try."""

    def __init__(self, why: str, kind: str | None = None) -> None:
        super().__init__(why)
        self.kind = kind or why


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
                    asyncio.open_connection(host, port, limit=READ_LIMIT), min(CONNECT_TRY, left)
                )
            except (OSError, TimeoutError) as exc:
                last = str(exc) or "timed out"
        await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _where(rv: Rendezvous) -> str:
    return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in rv.coordinator)


async def _handshake(
    rv: Rendezvous, server: RankServer, reader: asyncio.StreamReader, writer: Any
) -> None:
    """This rank's side of the hello (module docstring). Raises :class:`_TryAgain` while the
    other end has not proved the job token, MRCError when rank 0 (proved) refuses the rank."""

    async def say(obj: dict[str, Any], check: Any, closed: str, refused: str) -> Any:
        """Send one hello line, read rank 0's answer checked by ``check``; _TryAgain with
        ``closed`` or ``refused`` (and why) when there is none or it is malformed."""
        writer.write(dumps(obj))
        await writer.drain()
        try:
            line = await read_line(reader, HELLO_LINE_MAX)
            if not line:
                raise _TryAgain(closed)
            return check(parse_line(line), "")
        except Refused as exc:
            raise _TryAgain(f"{refused}: {exc}") from None

    mine = new_nonce()
    answer = await say(
        {"hello": PROTOCOL, "rank": rv.rank, "world": rv.world, "nonce": mine},
        CHALLENGE,
        "the connection closed before rank 0 answered the hello",
        "the answer to the hello was refused",
    )
    theirs = answer.get("nonce", "")
    if rv.token and not proves(rv.token, answer.get("proof"), RANK0, mine, theirs, rv.rank):
        why = f"the party at {_where(rv)} did not prove the job token"
        said = f" (it said: {answer['error'][:200]})" if answer.get("error") else ""
        raise _TryAgain(why + said, why)
    if not answer["ok"]:
        raise MRCError(f"rank 0 refused rank {rv.rank}: {answer.get('error')}")
    if not theirs:
        raise _TryAgain("rank 0 sent no challenge")
    final = await say(
        server.hello_body(proof(rv.token, RANK, theirs, mine, rv.rank)),
        ANSWER,
        "the connection closed during the hello",
        "rank 0's answer was refused",
    )
    if not final["ok"]:
        raise MRCError(f"rank 0 refused rank {rv.rank}: {final.get('error')}")


async def _join(
    rv: Rendezvous, server: RankServer, timeout: float
) -> tuple[asyncio.StreamReader, Any]:
    """A control connection to rank 0 that has passed the hello, within ``timeout``."""
    deadline = time.monotonic() + timeout
    said: set[str] = set()
    while True:
        reader, writer = await _reach(rv, deadline)
        try:
            left = max(0.1, min(HELLO_TIMEOUT, deadline - time.monotonic()))
            await asyncio.wait_for(_handshake(rv, server, reader, writer), left)
            return reader, writer
        except _TryAgain as exc:
            why, kind = str(exc), exc.kind
        except TimeoutError:
            why = kind = f"no answer to the hello in {left:g} s"
        except (ConnectionError, OSError) as exc:
            why = kind = f"the connection broke during the hello ({exc})"
        except BaseException:
            await _shut(writer)
            raise
        await _shut(writer)
        if time.monotonic() >= deadline:
            raise MRCError(f"no rank 0 let rank {rv.rank} in within {timeout:g} s: {why}")
        if kind not in said:
            said.add(kind)
            log.warning("rank %d: %s; trying again", rv.rank, why)
        await asyncio.sleep(min(RETRY, max(0.0, deadline - time.monotonic())))


async def _shut(writer: Any) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 2.0)


async def serve_rank(rv: Rendezvous, server: RankServer, timeout: float) -> None:
    """A rank other than 0: say hello to rank 0, then answer its requests until ``exit``."""
    if rv.launcher == "mpi":
        await asyncio.to_thread(rv.publish, [], "")
    reader, writer = await _join(rv, server, timeout)
    try:

        def reply(obj: dict[str, Any]) -> None:
            if writer.transport.get_write_buffer_size() > WRITE_BUFFER_MAX:
                writer.transport.abort()  # rank 0 does not read what it asked for
                return
            writer.write(dumps(obj))

        served = await serve_lines(
            reader,
            reply,
            server.handle,
            frozenset({"fault", "heal"}),
            max_line=line_max(rv.world),
            refused=server.refused,
        )
        if not served:
            raise MRCError("rank 0 went away before the run ended")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
    finally:
        if server.refused.count:
            log.warning("rank %d: refused %d requests in all", rv.rank, server.refused.count)
        await server.close()
        await _shut(writer)


# ---- rank 0's side ---------------------------------------------------------------------------


class RankLink(AgentLink):
    """Rank 0's control connection to another rank. Replies are matched to requests by id,
    so a fault command can run on a rank while a step waits there; each is checked against
    its request's schema before the coordinator sees it."""

    def __init__(
        self,
        index: int,
        reader: asyncio.StreamReader,
        writer: Any,
        hello: dict[str, Any],
        world: int,
    ) -> None:
        super().__init__(index)
        self.reader = reader
        self.writer = writer
        self.hello = hello
        self.world = world
        self.refused = _Tally(f"rank {index}: refused its reply")
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading: asyncio.Task[None] | None = None

    async def exit_reason(self) -> str:
        return f"rank {self.index} ({self.hello.get('name')}) closed its control connection"

    def _fail_pending(self, why: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentError(f"h{self.index}: {why}"))
        self._pending.clear()

    async def _read_replies(self) -> None:
        cap = line_max(self.world)
        try:
            while True:
                try:
                    line = await read_line(self.reader, cap, skip_long=True)
                    if not line:
                        break
                    reply = parse_line(line)
                except LineTooLong as exc:  # whose reply it was is unknown: all of them
                    self.refused(str(exc))
                    self._fail_pending(f"its reply was refused: {exc}")
                    continue
                except Refused as exc:
                    self.refused(str(exc))
                    continue
                rid = reply.get("id")
                fut = self._pending.pop(rid, None) if type(rid) is int else None
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass
        self.dead = True
        self._fail_pending(await self.exit_reason())

    async def request(self, msg: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        op = str(msg.get("op"))
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
            raise AgentError(f"h{self.index}: {op} not answered in {timeout:g} s") from None
        except (ConnectionError, OSError):
            self.dead = True
            raise AgentError(f"h{self.index}: {await self.exit_reason()}") from None
        finally:
            self._pending.pop(mid, None)
        try:
            reply = check_reply(op, reply, self.world)
        except Refused as exc:
            self.refused(f"{op}: {exc}")
            raise AgentError(f"h{self.index}: {op}: its reply was refused: {exc}") from None
        if not reply["ok"]:
            raise AgentError(f"h{self.index}: {op} failed: {reply.get('error')}")
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


class _HelloRefused(Refused):
    """A hello refused after its challenge was read: the answer carries rank 0's proof, so a
    rank can tell a refusal from rank 0 from a stranger's."""

    def __init__(self, why: str, answer: dict[str, Any]) -> None:
        super().__init__(why)
        self.answer = answer


def _bind(family: int, addr: str, port: int) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # the IPv4 wildcard, if wanted, is a socket of its own
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        flags = socket.AI_NUMERICHOST | socket.AI_PASSIVE
        sockaddr = socket.getaddrinfo(addr, port, family, socket.SOCK_STREAM, 0, flags)[0][4]
        s.bind(sockaddr)
        s.listen(128)
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


class Gathering:
    """Rank 0's control listener: collects one hello per rank, refuses the rest."""

    def __init__(self, rv: Rendezvous, token: str) -> None:
        self.rv = rv
        self.token = token
        self.links: dict[int, RankLink] = {}
        self.refusals = _Tally("rank 0: refused a control connection")
        self.pending = 0  # connections in their hello
        self.all_here = asyncio.Event()
        self.servers: list[asyncio.Server] = []
        self._hellos: set[asyncio.Task[Any]] = set()

    @property
    def refused(self) -> int:
        """Connections refused so far (``launch.refused_hellos``)."""
        return self.refusals.count

    async def open(self, port: int, hosts: list[str] | None = None) -> int:
        """Listen where ``hosts`` (MASTER_ADDR, or the addresses MPI announces) reach this
        host (:func:`~mrc.lab.bench.rendezvous.listen_addrs`), on one ``port`` (0: a free
        one); the port."""
        for family, addr, exact in listen_addrs(hosts or ["::"]):
            try:
                try:
                    sock = _bind(family, addr, port)
                except OSError as exc:
                    if not exact or exc.errno != errno.EADDRNOTAVAIL:
                        raise
                    log.info("%s is not an address of this host: listening on all", addr)
                    addr = WILDCARD[family]
                    sock = _bind(family, addr, port)
            except OSError as exc:
                await self.close()
                where = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
                raise MRCError(f"rank 0 cannot listen on {where}: {exc.strerror}") from None
            port = port or int(sock.getsockname()[1])
            self.servers.append(
                await asyncio.start_server(self._hello, sock=sock, limit=READ_LIMIT)
            )
        return port

    def _room(self) -> int:
        return self.rv.world - 1 - len(self.links) + EXTRA_PENDING

    def _refuse(
        self, writer: Any, why: str, peer: str, answer: dict[str, Any] | None = None
    ) -> None:
        self.refusals(f"{peer}: {why}")
        with contextlib.suppress(Exception):
            writer.write(dumps({"ok": False, "error": why, **(answer or {})}))
        writer.close()

    async def _hello(self, reader: asyncio.StreamReader, writer: Any) -> None:
        peer = _peer(writer)
        if self.pending >= self._room():
            self.refusals(f"{peer}: more than {self._room()} connections waiting for a hello")
            writer.transport.abort()
            return
        self.pending += 1
        task = asyncio.current_task()
        if task is not None:
            self._hellos.add(task)
        try:
            await asyncio.wait_for(self._handshake(reader, writer), HELLO_TIMEOUT)
        except asyncio.CancelledError:  # rank 0 is done: end quietly (asyncio's stream
            writer.close()  # callback reports a cancelled handler as an error)
        except TimeoutError:
            self._refuse(writer, f"no hello in {HELLO_TIMEOUT:g} s", peer)
        except _HelloRefused as exc:
            self._refuse(writer, str(exc), peer, exc.answer)
        except Refused as exc:
            self._refuse(writer, str(exc), peer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            self._refuse(writer, "the connection broke during the hello", peer)
        finally:
            self.pending -= 1
            if task is not None:
                self._hellos.discard(task)

    async def _handshake(self, reader: asyncio.StreamReader, writer: Any) -> None:
        """Rank 0's side of the hello (module docstring): refused with Refused."""
        line = await read_line(reader, HELLO_LINE_MAX)
        if not line:
            raise Refused("no hello (the connection closed)")
        msg = parse_line(line)
        if msg.get("hello") != PROTOCOL:
            v = msg.get("hello")
            speaks = f" (it speaks {v})" if type(v) is int else ""
            raise Refused(f"not an mrc-bench hello of protocol {PROTOCOL}{speaks}")
        first = HELLO(msg, "")
        rank, world, theirs = first["rank"], first["world"], first["nonce"]
        mine = new_nonce()
        answer = {"nonce": mine, "proof": proof(self.token, RANK0, theirs, mine, rank)}
        if world != self.rv.world:
            raise _HelloRefused(f"rank {rank} counts {world} ranks, rank 0 {self.rv.world}", answer)
        if not 1 <= rank < world:
            raise _HelloRefused(f"no rank {rank} in a world of {world} (0 is this one)", answer)
        if rank in self.links:
            raise _HelloRefused(f"rank {rank} twice", answer)
        writer.write(dumps({"ok": True, "hello": PROTOCOL, **answer}))
        await writer.drain()
        line = await read_line(reader, HELLO_LINE_MAX)
        if not line:
            raise Refused(f"rank {rank}: the connection closed after the challenge")
        body = HELLO_BODY(parse_line(line), "")
        if self.token and not proves(self.token, body["proof"], RANK, mine, theirs, rank):
            raise Refused(f"rank {rank}: wrong job token")
        if rank in self.links:
            raise Refused(f"rank {rank} twice")
        if len(body["mtus"]) != len(body["addrs"]):
            raise Refused(f"rank {rank}: {len(body['addrs'])} planes, {len(body['mtus'])} MTUs")
        writer.write(dumps({"ok": True}))
        del body["proof"]
        hello = {"rank": rank, "world": world, **body}
        self.links[rank] = RankLink(rank, reader, writer, hello, world)
        if len(self.links) == self.rv.world - 1:
            self.all_here.set()
            for server in self.servers:  # nobody else is expected: stop listening
                server.close()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.all_here.wait(), timeout)
        except TimeoutError:
            missing = [str(r) for r in range(1, self.rv.world) if r not in self.links]
            reasons = self.refusals.reasons[:3]
            extra = f"; refused: {'; '.join(reasons)}" if reasons else ""
            raise MRCError(
                f"ranks {', '.join(missing)} did not reach rank 0 in {timeout:g} s{extra}"
            ) from None

    async def close(self) -> None:
        for task in list(self._hellos):
            task.cancel()
        await asyncio.gather(*self._hellos, return_exceptions=True)
        for server in self.servers:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)


def _peer(writer: Any) -> str:
    addr = writer.get_extra_info("peername")
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"[{addr[0]}]:{addr[1]}" if ":" in str(addr[0]) else f"{addr[0]}:{addr[1]}"
    return "a peer"


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
    mine = list(server.planes.addrs)
    cands = [opts.control_addr] if opts.control_addr else mine[::-1]  # the last plane first
    # listen where the ranks are told to connect: MASTER_ADDR, or what MPI announces
    port = await gathering.open(
        rv.listen_port, cands if rv.launcher == "mpi" else [h for h, _ in rv.coordinator]
    )
    if rv.launcher == "mpi":
        try:
            await asyncio.to_thread(rv.publish, [(a, port) for a in cands], token)
        except BaseException:
            await gathering.close()
            raise
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
        progress(
            f"{rv.world} ranks ready in {startup:.2f} s;"
            f" {gathering.refused} control connections refused"
        )
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
            "refused_hellos": gathering.refused,
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
