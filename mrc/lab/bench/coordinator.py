"""The ``mrc-bench`` coordinator: fabrics, agents, conditions, synchronized steps.

Runs in the root namespace. Per condition it builds a fresh fabric (``Fabric.up``), starts
one agent per host inside the host's namespace (``mrc-fabric exec``, pipes on stdin/stdout),
sets every transport up once (persistent connections between all hosts), applies the
condition, then runs each workload as synchronized steps for each transport in turn:

    t0 = CLOCK_MONOTONIC; "step k" to every agent involved; each starts its sends at once and
    replies with the CLOCK_MONOTONIC time of every completion; step time = last completion - t0;
    then "verify k": SHA-256 of every sent slice against what landed at its receiver.

The next step starts only after every agent has replied (the barrier). Fabrics and agents
are always removed, also on errors and Ctrl-C (see :meth:`Bench.cleanup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from mrc.core.cc import law_class
from mrc.errors import AgentError, MRCError
from mrc.lab.bench.common import dumps, now, setup_mptcp_outside
from mrc.lab.bench.report import setup_note
from mrc.lab.bench.workloads import Transfer, ideal_seconds, transfers
from mrc.lab.harness.children import signal_group
from mrc.lab.harness.stats import rounded

if TYPE_CHECKING:
    from mrc.lab.fabric import FabricSpec

DEFAULT_WORKLOADS = {
    "clean": ("alltoall", "ring", "incast", "pair"),
    "link_down": ("alltoall",),
    "lossy": ("alltoall",),
    "trim": ("incast",),
    "no_trim": ("incast",),
}


@dataclass
class BenchConfig:
    hosts: int = 4
    planes: int = 2
    spines: int = 2
    leaves: int = 2
    rate: str | None = "100mbit"
    mtu: int = 9000
    size: int = 1 << 20
    pair_size: int = 8 << 20
    steps: int = 12
    warmup: int = 1
    transports: list[str] = field(default_factory=lambda: ["mrc", "tcp", "mptcp"])
    workloads: list[str] | None = None  # None: per-condition defaults
    conditions: list[str] = field(
        default_factory=lambda: ["clean", "link_down", "lossy", "trim", "no_trim"]
    )
    evs: int = 128
    listener_evs: int = 16
    payload: int = 8192
    cc: str = "nscc"  # window law of every MRC QP (QPConfig.cc): "nscc", "fixed", ...
    # packets in flight per QP: with a law that finds the window (nscc) a cap; with the fixed
    # window the window, 4 being what fits this fabric's queues without CC
    window: int | None = None  # default: 64 with nscc, 4 fixed
    incast_window: int | None = None  # trim/no_trim conditions; default: 64 with nscc, 16 fixed
    qp: list[str] = field(default_factory=list)  # --qp KEY=VALUE of every MRC QP, last
    fail_link: tuple[str, str] = ("p0l0", "p0s0")
    fail_step: int | None = None  # default: steps // 3
    fail_delay: float = 0.01
    outage: float = 2.0
    post_heal_steps: int = 3
    loss: float = 0.03
    loss_link: tuple[str, str] = ("p0s0", "p0l0")  # router whose FORWARD drops, its peer
    step_timeout: float | None = None  # default: outage + 20 s
    seed: int = 1
    quick: bool = False
    verbose: bool = False
    host_image: str | None = None  # hosts are containers of this image

    def timeout(self) -> float:
        return self.step_timeout if self.step_timeout is not None else self.outage + 20.0

    def workloads_for(self, condition: str) -> list[str]:
        if self.workloads is not None:
            return list(self.workloads)
        return list(DEFAULT_WORKLOADS[condition])

    def window_for(self, condition: str) -> int:
        """Packets in flight per QP under ``condition`` (see ``window``/``incast_window``)."""
        adaptive = law_class(self.cc).adaptive  # the law finds the window: this is a cap
        if condition in ("trim", "no_trim"):
            return self.incast_window or (64 if adaptive else 16)
        return self.window or (64 if adaptive else 4)

    def qp_settings(self, condition: str) -> list[str]:
        """Every MRC QP's settings under ``condition`` as ``--qp`` texts, which the agents
        build their QPConfig from (mrc/cli/qpopts.py): payload, window (the PSN window
        follows it) and congestion control, then ``qp``."""
        window = self.window_for(condition)
        base = [f"payload_size={self.payload}", f"max_outstanding={window}", f"cc={self.cc}"]
        return base + self.qp

    def code_laws(self) -> frozenset[str]:
        """The window laws given as code (``MODULE:CLASS``) by ``cc`` and the ``qp``
        settings, as loaded at the command line (mrc.core.cc.load): every agent loads these
        on its own command line at its start, and they are the only code a request may name
        (:meth:`mrc.lab.bench.agent.Agent.check_laws`)."""
        from mrc.cli.qpopts import parse_setting

        given = [self.cc] + [str(v) for k, v in map(parse_setting, self.qp) if k == "cc"]
        return frozenset(law for law in given if ":" in law)

    def payload_for_mtu(self) -> int:
        """The payload that fits ``mtu``: IPv6 40 + the route's 40 (an SRH with two segments,
        or a uSID fabric's outer IPv6 header) + UDP 8 + MRC header 32 = 120 bytes of headers,
        rounded down to 8 bytes with room to spare; 8 KiB at most."""
        return max(64, min(8192, (self.mtu - 128) // 8 * 8))

    def max_size(self) -> int:
        return max(self.size, self.pair_size)

    def fabric_spec(self, name: str, trim: bool = False) -> FabricSpec:
        """The fabric a condition runs on (each gets a fresh one)."""
        from mrc.lab.fabric import FabricSpec

        return FabricSpec(
            name=name,
            planes=self.planes,
            spines=self.spines,
            leaves=self.leaves,
            hosts=self.hosts,
            rate=self.rate,
            mtu=self.mtu,
            trim=trim,
            host_image=self.host_image,
        )


def _setup_mptcp_outside(topo: Any) -> None:
    """MPTCP's path manager of every host, set up from this process (see
    :func:`~mrc.lab.bench.common.setup_mptcp_outside`)."""
    for h in topo.hosts:
        setup_mptcp_outside(topo, h.name)


@dataclass
class StepResult:
    ok: bool
    seconds: float
    t0: float
    t_end: float
    errors: list[str]
    verified: int = 0
    mismatches: int = 0


class AgentLink:
    """One agent and the line-per-message channel to it: requests out, replies back in turn.

    Subclasses say how lines travel (an agent process's pipes, a launched rank's TCP control
    connection) and why an agent is gone."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._next_id = 0
        self._lock = asyncio.Lock()
        self.dead = False

    def log_tail(self, lines: int = 5) -> str:
        return ""

    async def _write(self, data: bytes) -> None:
        raise NotImplementedError

    async def _readline(self) -> bytes:
        raise NotImplementedError

    def _gone(self) -> bool:
        return self.dead

    async def exit_reason(self) -> str:
        return "agent gone"

    async def read_reply(self, timeout: float) -> dict[str, Any]:
        import json

        try:
            line = await asyncio.wait_for(self._readline(), timeout)
        except TimeoutError:
            raise AgentError(f"h{self.index}: agent did not answer in {timeout:g} s") from None
        except (ConnectionError, OSError, ValueError):  # a reset, or a line past the limit
            line = b""
        if not line:
            self.dead = True
            raise AgentError(f"h{self.index}: {await self.exit_reason()}")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise AgentError(f"h{self.index}: agent said {line[:120]!r}")
        return reply

    async def request(self, msg: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        if self._gone():
            self.dead = True
            raise AgentError(f"h{self.index}: {await self.exit_reason()}")
        async with self._lock:
            self._next_id += 1
            msg = {"id": self._next_id, **msg}
            try:
                await self._write(dumps(msg))
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.dead = True
                raise AgentError(f"h{self.index}: {await self.exit_reason()}") from None
            reply = await self.read_reply(timeout)
        if not reply.get("ok"):
            raise AgentError(f"h{self.index}: {msg['op']} failed: {reply.get('error')}")
        return reply

    async def stop(self) -> None:
        return None


class Agent(AgentLink):
    """One agent process and its pipes."""

    def __init__(self, index: int, proc: asyncio.subprocess.Process, log_path: str) -> None:
        super().__init__(index)
        self.proc = proc
        self.log_path = log_path

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.read().strip().splitlines()[-lines:]
        except OSError:
            return ""
        return " | ".join(t.strip() for t in tail)

    async def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def _readline(self) -> bytes:
        assert self.proc.stdout is not None
        return await self.proc.stdout.readline()

    def _gone(self) -> bool:
        return self.dead or self.proc.returncode is not None

    async def exit_reason(self) -> str:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 1.0)
        rc = self.proc.returncode
        why = (
            "agent exited"
            if rc is None
            else f"agent killed by signal {-rc}"
            if rc < 0
            else f"agent exited with status {rc}"
        )
        tail = self.log_tail()
        return why + (f" ({tail})" if tail else "")

    async def stop(self) -> None:
        proc = self.proc
        if proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()  # EOF: the agent closes its connections and exits
        try:
            await asyncio.wait_for(proc.wait(), 3.0)
        except TimeoutError:
            signal_group(proc.pid, signal.SIGKILL)  # the agent and whatever it left running
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 2.0)


def _diff(after: Any, before: Any) -> Any:
    """after - before for counters (nested dicts of numbers); other values: ``after``."""
    if isinstance(after, dict):
        b = before if isinstance(before, dict) else {}
        return {k: _diff(v, b.get(k)) for k, v in after.items()}
    if isinstance(after, int | float) and not isinstance(after, bool):
        return after - (before if isinstance(before, int | float) else 0)
    return after


def _sum(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Add up counters (nested dicts of numbers) reported by several agents."""
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = _sum([out.get(k) or {}, v])
            elif isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
            else:
                out[k] = v
    return out


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(values, q))


class Bench:
    def __init__(self, cfg: BenchConfig, progress: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.progress = progress
        self.fabrics: list[str] = []
        self.agents: list[Agent] = []
        self.tmpdir = tempfile.mkdtemp(prefix=f"bench-{os.getpid()}-", dir=self._run_dir())
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []
        self.notes: list[str] = []
        self.k: dict[str, int] = {}  # next step number per transport (unique across the run)
        self._loss_drops_base = 0

    @staticmethod
    def _run_dir() -> str:
        d = "/run/mrc"
        try:
            os.makedirs(d, exist_ok=True)
            return d
        except OSError:
            return tempfile.gettempdir()

    # ---- fabric and agents ------------------------------------------------------------

    def _fabric_name(self, i: int) -> str:
        return f"mb{os.getpid()}_{i}"[:24]

    async def fabric_up(self, condition: str, i: int) -> Any:
        from mrc.lab.fabric import Fabric

        cfg = self.cfg
        name = self._fabric_name(i)
        spec = cfg.fabric_spec(name, trim=condition == "trim")
        spec.validate()
        self.fabrics.append(name)
        t = time.monotonic()
        topo = await asyncio.to_thread(Fabric.up, spec)
        self.progress(
            f"fabric {name} up in {time.monotonic() - t:.2f}s ({condition}):"
            f" {cfg.planes} planes x {cfg.spines} spines x {cfg.leaves} leaves,"
            f" {cfg.hosts} hosts, {cfg.rate or 'unshaped'}, mtu {cfg.mtu}"
            + (", trimming" if condition == "trim" else "")
        )
        return topo

    async def fabric_down(self, name: str) -> None:
        from mrc.lab.fabric import Fabric

        with contextlib.suppress(Exception):
            await asyncio.to_thread(Fabric.down, name)
        if name in self.fabrics:
            self.fabrics.remove(name)

    async def start_agents(self, topo: Any) -> list[Agent]:
        cfg = self.cfg
        agents = []
        extra = []
        if topo.engine and "mptcp" in cfg.transports:
            # a container host's user may not configure MPTCP: do it from outside, as root
            await asyncio.to_thread(_setup_mptcp_outside, topo)
            extra = ["--mptcp-ready"]
        for h in topo.hosts:
            log_path = os.path.join(self.tmpdir, f"{topo.name}-{h.name}.log")
            log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
            cmd = [
                sys.executable,
                "-m",
                "mrc.lab.cli.fabric",
                "exec",
                "--name",
                topo.name,
                h.name,
                "--",
                sys.executable,
                "-m",
                "mrc.lab.bench.agent",
                "--fabric",
                topo.name,
                "--index",
                str(h.index),
                "--max-size",
                str(cfg.max_size()),
                "--seed",
                str(cfg.seed),
                *extra,
                # the laws given as code: the agent loads them at its start, so that nothing
                # it is sent over its pipe is ever imported
                *(arg for law in sorted(cfg.code_laws()) for arg in ("--cc", law)),
            ]
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                limit=1 << 24,
            )
            log.close()
            agent = Agent(h.index, proc, log_path)
            agents.append(agent)
            self.agents.append(agent)
        for a in agents:
            hello = await a.read_reply(60.0)
            if not hello.get("ready"):
                raise AgentError(f"h{a.index}: agent failed to start: {hello.get('error')}")
        self.progress(
            f"{len(agents)} agents ready (pids {', '.join(str(a.proc.pid) for a in agents)})"
        )
        return agents

    async def stop_agents(self, agents: Sequence[AgentLink]) -> None:
        await asyncio.gather(*(a.stop() for a in agents), return_exceptions=True)
        for a in agents:
            if a in self.agents:
                self.agents.remove(a)

    async def cleanup(self) -> None:
        """Stop every agent and remove every fabric this run created (idempotent)."""
        await self.stop_agents(list(self.agents))
        for name in list(self.fabrics):
            await self.fabric_down(name)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def cleanup_sync(self) -> None:
        """Last resort after the event loop is gone: kill agents, remove fabrics."""
        from mrc.lab.fabric import Fabric

        for a in self.agents:
            if a.proc.returncode is None:  # not seen to exit: its group id is still its own
                signal_group(a.proc.pid, signal.SIGKILL)
        self.agents.clear()
        for name in list(self.fabrics):
            with contextlib.suppress(Exception):
                Fabric.down(name)
            self.fabrics.remove(name)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    # ---- transports -------------------------------------------------------------------

    def _transport_opts(self, condition: str) -> dict[str, Any]:
        cfg = self.cfg
        opts: dict[str, Any] = {
            "evs": cfg.evs,
            "listener_evs": cfg.listener_evs,
            "qp": cfg.qp_settings(condition),
            "timeout": 10.0,
        }
        if condition == "link_down":
            # MRC's side channel is set up over the plane the failure breaks: no plane is
            # special (issue 37), so none is kept out of the failure's way
            opts["side_plane"] = self.fail_plane()
        return opts

    def fail_plane(self) -> int:
        """The plane of the link the link_down condition breaks (``fail_link``: a router
        ``pNlI`` or ``pNsI`` names it); 0 when no name says."""
        for node in self.cfg.fail_link:
            m = re.fullmatch(r"p(\d+)[ls]\d+", node)
            if m:
                return int(m.group(1))
        return 0

    async def setup_transport(
        self,
        agents: Sequence[AgentLink],
        transport: str,
        pairs: set[tuple[int, int]],
        condition: str,
    ) -> dict[str, Any]:
        opts = self._transport_opts(condition)
        await asyncio.gather(
            *(a.request({"op": "listen", "transport": transport, "opts": opts}) for a in agents)
        )
        replies = await asyncio.gather(
            *(
                a.request(
                    {
                        "op": "connect",
                        "transport": transport,
                        "opts": opts,
                        "peers": sorted(d for s, d in pairs if s == a.index),
                        "expect": sorted(s for s, d in pairs if d == a.index),
                    },
                    timeout=30.0,
                )
                for a in agents
            )
        )
        info: dict[str, Any] = {}
        if transport == "mptcp":
            info["subflows"] = {
                f"h{a.index}": r.get("subflows") for a, r in zip(agents, replies, strict=True)
            }
        if transport == "mrc":
            info["evs_per_qp"] = sorted({n for r in replies for n in (r.get("evs") or {}).values()})
            info["routes"] = sorted({x for r in replies for x in r.get("routes", [])})
            info["window"] = self.cfg.window_for(condition)
        return info

    async def close_transport(self, agents: Sequence[AgentLink], transport: str) -> None:
        await asyncio.gather(
            *(a.request({"op": "close", "transport": transport}) for a in agents),
            return_exceptions=True,
        )

    async def stats(self, agents: Sequence[AgentLink], transport: str) -> dict[str, Any]:
        replies = await asyncio.gather(
            *(a.request({"op": "stats", "transport": transport}) for a in agents),
            return_exceptions=True,
        )
        out = []
        subflows = {}
        for a, r in zip(agents, replies, strict=True):
            if isinstance(r, dict):
                r = {k: v for k, v in r.items() if k not in ("id", "ok")}
                if "subflows" in r:
                    subflows[f"h{a.index}"] = r.pop("subflows")
                out.append(r)
        total = _sum(out)
        if subflows:
            total["subflows"] = subflows
        return total

    # ---- steps ------------------------------------------------------------------------

    async def run_step(
        self,
        agents: Sequence[AgentLink],
        transport: str,
        tlist: list[Transfer],
        verify: bool = True,
    ) -> StepResult:
        k = self.k.get(transport, 1)
        self.k[transport] = k + 1
        timeout = self.cfg.timeout()
        involved = sorted({t.src for t in tlist} | {t.dst for t in tlist})
        msgs = {}
        for h in involved:
            msgs[h] = {
                "op": "step",
                "transport": transport,
                "k": k,
                "timeout": timeout,
                "sends": [[t.dst, t.size] for t in tlist if t.src == h],
                "recvs": [[t.src, t.size] for t in tlist if t.dst == h],
            }
        t0 = now()
        tasks = [
            asyncio.ensure_future(agents[h].request(msgs[h], timeout=timeout + 15.0))
            for h in involved
        ]
        pending: set[asyncio.Future[dict[str, Any]]] = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            dead = next((agents[h] for h in involved if agents[h].dead), None)
            if dead is not None:
                # a host is gone: neither this step nor the run can complete
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                raise MRCError(f"agent on h{dead.index} is gone: {await dead.exit_reason()}")
        replies = [t.exception() or t.result() for t in tasks]
        errors: list[str] = []
        times: list[float] = []
        for h, r in zip(involved, replies, strict=True):
            if isinstance(r, BaseException):
                if isinstance(r, AgentError):
                    errors.append(str(r))
                    continue
                raise r
            errors.extend(f"h{h} {e}" for e in r.get("errors", []))
            times.extend(self.local_time(h, float(t)) for t in r.get("done", {}).values())
        ok = not errors and len(times) == 2 * len(tlist)
        t_end = max(times) if ok else now()
        res = StepResult(ok, t_end - t0, t0, t_end, errors)
        if ok and verify:
            vr = await asyncio.gather(
                *(agents[h].request({"op": "verify", "k": k}) for h in involved)
            )
            by = dict(zip(involved, vr, strict=True))
            for tr in tlist:
                sent = by[tr.src]["sent"].get(str(tr.dst))
                got = by[tr.dst]["recv"].get(str(tr.src))
                if sent is not None and sent == got:
                    res.verified += tr.size
                else:
                    res.mismatches += 1
                    res.errors.append(f"h{tr.src}->h{tr.dst}: SHA-256 mismatch")
            if res.mismatches:
                res.ok = False
        return res

    def fault_label(self) -> str:
        """What the link_down condition takes away, for messages and the row's ``fault``."""
        return "-".join(self.cfg.fail_link)

    async def break_link(self, topo: Any) -> None:
        from mrc.lab.fabric import Fabric

        a, b = self.cfg.fail_link
        await asyncio.to_thread(Fabric.link, topo, a, b, False)

    async def heal_link(self, topo: Any) -> None:
        from mrc.lab.fabric import Fabric

        a, b = self.cfg.fail_link
        await asyncio.to_thread(Fabric.link, topo, a, b, True)

    def local_time(self, host: int, t: float) -> float:
        """Host ``host``'s clock reading ``t`` on this process's clock. Every agent here shares
        the machine's CLOCK_MONOTONIC (namespaces do not virtualise it)."""
        return t

    def link_rate_bps(self, topo: Any) -> int | None:
        """The bottleneck rate the ideal step time is computed from (None: unshaped)."""
        return int(topo.links[0].rate_bps) if topo.links and topo.links[0].rate_bps else None

    async def _fault(self, topo: Any, delay: float, marks: dict[str, float]) -> None:
        """Take the configured link away ``delay`` s from now, heal it ``outage`` s later."""
        what = self.fault_label()
        try:
            await asyncio.sleep(delay)
            marks["down"] = now()
            await self.break_link(topo)
            self.progress(f"  {what} DOWN")
            await asyncio.sleep(self.cfg.outage)
        finally:
            if "down" in marks:
                # always heal, even if the series was cut short
                await asyncio.shield(self.heal_link(topo))
                marks["up"] = now()
                self.progress(f"  {what} UP (healed)")

    def _loss_drops(self, topo: Any) -> int | None:
        router = self.cfg.loss_link[0]
        try:
            ns = topo.netns_of(router)
            out = subprocess.run(
                ["ip", "netns", "exec", ns, "ip6tables", "-L", "FORWARD", "-n", "-v", "-x"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError, MRCError):  # no ip6tables, no router
            return None
        total = 0
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "DROP" and parts[0].isdigit():
                total += int(parts[0])
        return total

    async def run_series(
        self,
        agents: Sequence[AgentLink],
        topo: Any,
        condition: str,
        workload: str,
        transport: str,
        setup_info: dict[str, Any],
        pairs: set[tuple[int, int]],
    ) -> dict[str, Any]:
        cfg = self.cfg
        tlist = transfers(workload, cfg.hosts, cfg.size, cfg.pair_size)
        label = f"{condition} {workload} {transport}"
        for _ in range(cfg.warmup):
            w = await self.run_step(agents, transport, tlist, verify=False)
            if not w.ok:
                self.progress(f"{label}: warm-up step failed: {'; '.join(w.errors[:2])}")
                await self._recover(agents, transport, pairs, condition)
        before = await self.stats(agents, transport)
        drops_before = self._loss_drops(topo) if condition == "lossy" else None
        steps: list[StepResult] = []
        marks: dict[str, float] = {}
        fault: asyncio.Task[None] | None = None
        fail_step = cfg.fail_step if cfg.fail_step is not None else max(1, cfg.steps // 3)
        started = now()
        i = 0
        try:
            while True:
                if condition == "link_down":
                    if i >= cfg.steps and "up" in marks:
                        after_heal = sum(1 for s in steps if s.t0 >= marks["up"])
                        if after_heal >= cfg.post_heal_steps:
                            break
                    if i > cfg.steps + 1000 or now() - started > cfg.timeout() * 4 + 60:
                        break
                elif i >= cfg.steps:
                    break
                if condition == "link_down" and i == fail_step and fault is None:
                    fault = asyncio.get_running_loop().create_task(
                        self._fault(topo, cfg.fail_delay, marks)
                    )
                res = await self.run_step(agents, transport, tlist)
                steps.append(res)
                i += 1
                state = "ok" if res.ok else "FAILED: " + "; ".join(res.errors[:2])
                self.progress(f"{label}: step {i} {res.seconds * 1e3:.1f} ms {state}")
                if not res.ok:
                    if fault is not None and "up" not in marks:
                        await asyncio.wait({fault})  # reconnecting needs the path back
                    await self._recover(agents, transport, pairs, condition)
        finally:
            if fault is not None:
                if not fault.done():
                    fault.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await fault
        after = await self.stats(agents, transport)
        row = self._row(condition, workload, transport, tlist, steps, marks, started, topo)
        row["transport_info"] = setup_info
        subflows = after.pop("subflows", None)
        row["transport_stats"] = _diff(after, before)
        if subflows is not None:
            row["transport_stats"]["subflows_per_connection"] = subflows
        if drops_before is not None:
            drops_after = self._loss_drops(topo)
            if drops_after is not None:
                row["injected_drops"] = drops_after - drops_before
        return row

    async def _recover(
        self,
        agents: Sequence[AgentLink],
        transport: str,
        pairs: set[tuple[int, int]],
        condition: str,
    ) -> None:
        """After a failed step the connections may hold half a transfer: set them up anew."""
        await self.close_transport(agents, transport)
        last: Exception | None = None
        for attempt in range(3):
            if any(a.dead for a in agents):
                break
            try:
                await self.setup_transport(agents, transport, pairs, condition)
                return
            except AgentError as exc:
                last = exc
                self.progress(f"  re-connecting {transport} failed ({exc}); retrying")
                await self.close_transport(agents, transport)
                await asyncio.sleep(1.0 + attempt)
        dead = next((a for a in agents if a.dead), None)
        if dead is not None:
            raise MRCError(f"agent on h{dead.index} is gone: {await dead.exit_reason()}")
        raise MRCError(f"cannot re-establish {transport} connections after a failed step ({last})")

    def _row(
        self,
        condition: str,
        workload: str,
        transport: str,
        tlist: list[Transfer],
        steps: list[StepResult],
        marks: dict[str, float],
        started: float,
        topo: Any,
    ) -> dict[str, Any]:
        cfg = self.cfg
        step_ms = [round(s.seconds * 1e3, 3) for s in steps]
        per_step = sum(t.size for t in tlist)
        ok_steps = [s for s in steps if s.ok]
        busy = sum(s.seconds for s in ok_steps)
        verified = sum(s.verified for s in steps)
        ideal = ideal_seconds(tlist, cfg.planes, self.link_rate_bps(topo))
        row: dict[str, Any] = {
            "workload": workload,
            "condition": condition,
            "transport": transport,
            "p50_ms": rounded(_percentile(step_ms, 50), 3),
            "p99_ms": rounded(_percentile(step_ms, 99), 3),
            "p100_ms": rounded(max(step_ms) if step_ms else None, 3),
            "goodput_bps": round(verified * 8 / busy) if busy > 0 else 0,
            "steps": len(steps),
            "failed_steps": sum(1 for s in steps if not s.ok),
            "bytes_verified": verified,
            "bytes_expected": per_step * len(steps),
            "sha256_ok": bool(steps)
            and all(s.mismatches == 0 for s in steps)
            and all(s.ok for s in steps),
            "step_ms": step_ms,
            "ideal_ms": rounded(ideal * 1e3, 3) if ideal is not None else None,
            "transfers_per_step": len(tlist),
            "bytes_per_step": per_step,
            "step_start_s": [round(s.t0 - started, 4) for s in steps],
            "failed_step_indices": [i for i, s in enumerate(steps) if not s.ok],
            "errors": [e for s in steps for e in s.errors][:10],
        }
        if "down" in marks:
            down, up = marks["down"], marks.get("up")
            row["fault"] = {
                "link": self.fault_label(),
                "down_s": round(down - started, 4),
                "up_s": round(up - started, 4) if up is not None else None,
                "outage_ms": round((up - down) * 1e3, 1) if up is not None else None,
                "down_step": _step_at(steps, down),
                "up_step": _step_at(steps, up) if up is not None else None,
                # one step spanned the whole outage: it waited for the heal
                "stalled_until_heal": up is not None
                and any(s.t0 <= down and s.t_end >= up for s in steps),
            }
        return row

    # ---- conditions -------------------------------------------------------------------

    def condition_unavailable(self, condition: str) -> str | None:
        if condition == "lossy" and shutil.which("ip6tables") is None:
            return "ip6tables not installed (apt-get install iptables)"
        if condition == "lossy" and shutil.which("ip") is None:
            return "iproute2's ip not installed"
        if condition == "trim":
            if not self.cfg.rate:
                return "trimming needs a shaped fabric (--rate)"
            try:
                from mrc.lab.fabric.trim import unavailable_reason
            except ImportError:
                return "mrc.lab.fabric.trim is missing"
            why = unavailable_reason()
            if why:
                return why
        if condition == "link_down" and self.cfg.spines < 2 and self.cfg.planes < 2:
            return "a link failure needs a second spine or plane to route around"
        return None

    async def apply_loss(self, topo: Any) -> None:
        router, peer = self.cfg.loss_link
        link = topo.link_between(router, peer)
        ifname, _ = link.end(topo.canonical(router))
        ns = topo.netns_of(router)
        p = f"{self.cfg.loss:.6f}"
        for direction in ("-i", "-o"):
            cmd = [
                "ip",
                "netns",
                "exec",
                ns,
                "ip6tables",
                "-A",
                "FORWARD",
                direction,
                ifname,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                p,
                "-j",
                "DROP",
            ]
            r = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise MRCError(f"ip6tables in {ns} failed: {r.stderr.strip()}")
        self.progress(
            f"lossy: dropping {self.cfg.loss:.1%} of packets each way on "
            f"{link.a}-{link.b} (ip6tables FORWARD in {router})"
        )

    async def run_workloads(self, agents: Sequence[AgentLink], topo: Any, condition: str) -> None:
        """Set every transport up between ``agents``, apply ``condition``, and run each of its
        workloads as a series of steps over each transport (rows into ``self.rows``)."""
        cfg = self.cfg
        workloads = cfg.workloads_for(condition)
        pairs = {
            (t.src, t.dst)
            for w in workloads
            for t in transfers(w, cfg.hosts, cfg.size, cfg.pair_size)
        }
        infos = {}
        for transport in cfg.transports:
            infos[transport] = await self.setup_transport(agents, transport, pairs, condition)
            self.progress(
                f"{transport}: {len(pairs)} connections up"
                + (f" ({setup_note(infos[transport])})" if infos[transport] else "")
            )
        if condition == "lossy":
            await self.apply_loss(topo)
        for workload in workloads:
            for transport in cfg.transports:
                row = await self.run_series(
                    agents, topo, condition, workload, transport, infos[transport], pairs
                )
                self.rows.append(row)
                self.progress(
                    f"== {condition} {workload} {transport}: P50 {row['p50_ms']} ms,"
                    f" P100 {row['p100_ms']} ms, failed {row['failed_steps']}/"
                    f"{row['steps']}, verified {row['bytes_verified']}/"
                    f"{row['bytes_expected']} B"
                )

    def skip(self, condition: str) -> bool:
        """Whether ``condition`` cannot run here (recorded in ``skipped``, with the reason)."""
        why = self.condition_unavailable(condition)
        if why:
            self.skipped.append({"condition": condition, "reason": why})
            self.progress(f"skipping condition {condition}: {why}")
        return why is not None

    async def run_condition(self, condition: str, i: int) -> None:
        if self.skip(condition):
            return
        topo = await self.fabric_up(condition, i)
        agents: list[Agent] = []
        try:
            agents = await self.start_agents(topo)
            await self.run_workloads(agents, topo, condition)
        finally:
            await self.stop_agents(agents)
            await self.fabric_down(topo.name)

    async def run(self) -> None:
        for i, condition in enumerate(self.cfg.conditions):
            await self.run_condition(condition, i)


def _step_at(steps: list[StepResult], t: float) -> int | None:
    """Index of the step running at time ``t`` (or the next one to start)."""
    for i, s in enumerate(steps):
        if s.t0 <= t <= s.t_end or t < s.t0:
            return i
    return None


def config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["fail_link"] = "-".join(cfg.fail_link)
    d["loss_link"] = "-".join(cfg.loss_link)
    d["step_timeout"] = cfg.timeout()
    d["fail_step"] = cfg.fail_step if cfg.fail_step is not None else max(1, cfg.steps // 3)
    d["workloads"] = {c: cfg.workloads_for(c) for c in cfg.conditions}
    return d
