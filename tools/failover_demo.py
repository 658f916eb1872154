#!/usr/bin/env python3
"""Failover demo: down a fabric link in the middle of a transfer, heal it, and compare MRC with
kernel TCP (pinned to the failed path) and Linux MPTCP (one subflow per plane).

What it does, for each transport in turn, on one freshly built, shaped mrc-fabric:

1. starts a receiver in host h3 and a sender in host h0 (the roles of
   :mod:`mrc.lab.bench.failover_roles`, run in the hosts with ``mrc-fabric exec``); the MRC ends
   use the library API (``mrc.listen`` / ``mrc.connect`` with ``fabric=``), so the receiver
   can sample how many bytes are placed every millisecond, per plane (the sender tells it which
   EV source port is on which plane); TCP and MPTCP receivers timestamp every ``recv``;
2. downs a link (default: the spine link p1l1-p1s0, which plain routing in plane 1 uses) at
   ``--fail-at`` seconds after the sender started, and heals it at ``--heal-at``;
3. checks the SHA-256 of what arrived against what was sent, and computes the largest delivery
   stall, goodput before / during / after the failure and, for MRC, the time from the heal to
   the healed link's EVs being GOOD again (from the sender's EV event log).

With ``--host-image IMAGE`` the fabric's hosts are containers of an image with mrc in it
(``mrc-fabric up --host-image``, docker/build.sh): the roles run there as the image's user, with
its Python, the data file and the result files go through the fabric's shared directory
(``/run/mrc/share-NAME``, the same path inside and out), and MPTCP's path manager is set up from
here with ``ip -n``, as root, as everything else that needs root in a host's namespace.

Output: a table on stdout (or one JSON object with ``--json``), a PNG plot of goodput over time
(``--plot``), progress on stderr.  The fabric has a unique name and is always torn down, also on
Ctrl-C.  Needs root.

    .venv/bin/python tools/failover_demo.py                 # ~1 min, 200 Mbit/s x 4 planes
    .venv/bin/python tools/failover_demo.py --quick --json  # < 1 min
    .venv/bin/python tools/failover_demo.py --fail nic      # host NIC h0-p1l0 instead
    .venv/bin/python tools/failover_demo.py --link p1l0 p1s0 --fail-at 2 --heal-at 4
    .venv/bin/python tools/failover_demo.py --quick --host-image "$(bash docker/build.sh)"
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from mrc.cli.common import (  # noqa: E402
    Parser,
    emit_json,
    float_between,
    non_negative_int,
    positive_int,
    rate_arg,
    run_main,
)
from mrc.errors import MRCError  # noqa: E402
from mrc.lab.bench.common import mptcp_setup_commands  # noqa: E402 - after the sys.path fix above

PROG = "failover_demo.py"
TRANSPORTS = ("mrc", "tcp", "mptcp")

PRESETS = {  # --fail NAME -> the link to down (plane 1 by default, see --plane)
    "spine": ("p{p}l1", "p{p}s0"),  # receiver's leaf to spine 0: plain routing's path
    "uplink": ("p{p}l0", "p{p}s0"),  # sender's leaf uplink to spine 0
    "nic": ("h0", "p{p}l0"),  # the sender's NIC in that plane
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# =============================================================================================
# analysis
# =============================================================================================


def gaps(t: list[float], v: list[int], t0: float, t1: float) -> list[tuple[float, float]]:
    """(start, end) of every interval between consecutive increases of ``v`` in [t0, t1].

    Samples are taken every ~1 ms (MRC) or at every recv (TCP): a stall runs from the last
    sample that saw new bytes to the next one that did."""
    out = []
    last = None
    prev = None
    for ti, vi in zip(t, v, strict=True):
        if ti < t0 or ti > t1:
            prev = vi
            continue
        if prev is None or vi > prev:
            if last is not None:
                out.append((last, ti))
            last = ti
        prev = vi
    return out


def max_stall(
    t: list[float],
    v: list[int],
    t0: float,
    t1: float,
    overlapping: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """Largest gap (s, start time); with ``overlapping``, only gaps that overlap it."""
    best, at = 0.0, t0
    for a, b in gaps(t, v, t0, t1):
        if overlapping is not None and (b < overlapping[0] or a > overlapping[1]):
            continue
        if b - a > best:
            best, at = b - a, a
    return best, at


def bytes_at(t: list[float], v: list[int], when: float) -> int:
    """Bytes delivered by time ``when`` (last sample at or before it)."""
    import bisect

    i = bisect.bisect_right(t, when) - 1
    return v[i] if i >= 0 else (v[0] if v else 0)


def rate_between(t: list[float], v: list[int], a: float, b: float) -> float | None:
    if b - a <= 0.05:
        return None
    return (bytes_at(t, v, b) - bytes_at(t, v, a)) * 8 / (b - a)


def longest_low(
    t: list[float], v: list[int], a: float, b: float, level_bps: float, bin_s: float = 0.02
) -> float:
    """Longest run (s) of ``bin_s`` bins in [a, b] whose goodput stays below ``level_bps``."""
    best = run = 0.0
    x = a
    while x + bin_s <= b:
        r = (
            rate_between(t, v, x, x + bin_s)
            if bin_s > 0.05
            else ((bytes_at(t, v, x + bin_s) - bytes_at(t, v, x)) * 8 / bin_s)
        )
        run = run + bin_s if r < level_bps else 0.0
        best = max(best, run)
        x += bin_s
    return best


def plane_capacity(topo, failed: tuple[str, str] | None, src: str, dst: str) -> list[float]:
    """Per plane: the max flow from ``src`` to ``dst`` (bit/s), two-tier Clos, one link down."""
    caps = []
    for p in range(topo.planes):

        def rate(x: str, y: str) -> float:
            if failed and {x, y} == set(failed):
                return 0.0
            link = topo.link_between(x, y)
            return float(link.rate_bps or 10e9)

        ls = topo.host(src).nic(p).leaf
        ld = topo.host(dst).nic(p).leaf
        spines = [r.name for r in topo.routers if r.plane == p and r.tier == "spine"]
        middle = sum(min(rate(ls, s), rate(ld, s)) for s in spines) if ls != ld else 1e12
        caps.append(min(rate(src, ls), middle, rate(dst, ld)))
    return caps


def resurrection(
    events: list[list],
    failed_routes: set[tuple[int, str]] | None,
    failed_plane_all: int | None,
    t_fail: float,
    t_heal: float,
) -> dict:
    """EVs of the failed link that went ASSUMED_BAD during the outage, and when they came back.

    ``failed_routes``: {(plane, route)} of EVs crossing the link (a spine link); or
    ``failed_plane_all``: every EV of that plane (a host NIC link)."""

    def affected(e) -> bool:
        if failed_plane_all is not None:
            return e[3] == failed_plane_all
        return (e[3], e[4]) in (failed_routes or set())

    bad_at: dict[int, float] = {}
    state: dict[int, str] = {}
    first_bad = None
    for e in events:
        t, ev, _sport, _plane, _route, _old, new, _reason = e
        state[ev] = new
        if not affected(e):
            continue
        if new == "ASSUMED_BAD" and t >= t_fail - 0.01 and ev not in bad_at:
            bad_at[ev] = t
            first_bad = t if first_bad is None else min(first_bad, t)
    back: dict[int, float] = {}
    for e in events:
        t, ev, *_rest = e
        if ev in bad_at and t >= t_heal and e[6].startswith("GOOD") and ev not in back:
            back[ev] = t
    still_bad = sorted(ev for ev in bad_at if ev not in back)
    out = {
        "evs_failed": len(bad_at),
        "evs_back": len(back),
        "still_bad": still_bad,
        "detect_s": round(first_bad - t_fail, 4) if first_bad is not None else None,
        "resurrection_s": (
            round(max(back.values()) - t_heal, 4) if back and not still_bad else None
        ),
        "resurrection_first_s": round(min(back.values()) - t_heal, 4) if back else None,
    }
    return out


def analyse(
    name: str,
    recv: dict,
    send: dict,
    t_start: float,
    t_fail: float,
    t_heal: float,
    expect_sha: str,
    ctx: dict,
) -> dict:
    s = recv["samples"]
    t, placed, inorder = s["t"], s["placed"], s["inorder"]
    # first and last delivery
    t_first = next((ti for ti, v in zip(t, placed, strict=True) if v > 0), t_start)
    t_last = recv.get("t_done", t[-1] if t else t_start)
    stall, stall_at = max_stall(t, placed, t_first, t_last)
    stall_io, stall_io_at = max_stall(t, inorder, t_first, t_last)
    fail_stall, _ = max_stall(t, placed, t_first, t_last, overlapping=(t_fail, t_heal))
    before = rate_between(t, placed, t_first, t_fail)
    during = rate_between(t, placed, t_fail, min(t_heal, t_last))
    after = rate_between(t, placed, t_heal, t_last)
    out = {
        "ok": bool(recv.get("ok") and send.get("ok") and recv.get("sha256") == expect_sha),
        "sha256_match": recv.get("sha256") == expect_sha,
        "bytes": recv.get("bytes"),
        "seconds": round(t_last - t_start, 3),
        "max_stall_ms": round(stall * 1000, 1),
        "max_stall_at_s": round(stall_at - t_start, 3),
        "max_stall_in_failure_ms": round(fail_stall * 1000, 1),
        "max_stall_inorder_ms": round(stall_io * 1000, 1),
        "goodput_before_bps": round(before) if before is not None else None,
        "goodput_during_bps": round(during) if during is not None else None,
        "goodput_after_bps": round(after) if after is not None else None,
        "finished_before_heal": t_last < t_heal,
    }
    if before:
        out["below_half_rate_ms"] = round(
            1000 * longest_low(t, placed, t_fail, t_last, before / 2), 1
        )
    if name == "mrc" and len(t) > 1:
        # the receiver samples every ~1 ms; a gap here is the process not being scheduled,
        # which no transport can beat: stalls shorter than this are not measurable
        gaps = [t[i + 1] - t[i] for i in range(len(t) - 1) if t_first <= t[i] <= t_last]
        out["sampler_max_gap_ms"] = round(1000 * max(gaps), 1) if gaps else None
    cap = ctx["capacity"][name]
    out["capacity_bps"] = round(cap[0])
    out["capacity_during_bps"] = round(cap[1])
    if during is not None and cap[1] > 0:
        out["during_vs_capacity"] = round(during / cap[1], 3)
    if name == "mrc":
        ev = send.get("evs", {})
        out["evs_assumed_bad"] = ev.get("evs_assumed_bad")
        out["evs_resurrected"] = ev.get("evs_resurrected")
        out["planes_lost"] = ev.get("planes_lost")
        res = resurrection(
            send.get("ev_events", []),
            ctx.get("failed_routes"),
            ctx.get("failed_plane_all"),
            t_fail,
            t_heal,
        )
        out["resurrection_s"] = res["resurrection_s"]
        out["failed_link_evs"] = res
        st = send.get("stats", {})
        out["retransmits"] = st.get("retransmits")
        out["retransmits_sack"] = st.get("retransmits_sack")
        out["retransmits_timeout"] = st.get("retransmits_timeout")
        out["srtt_ms"] = round(st["srtt"] * 1000, 2) if st.get("srtt") else None
        out["receiver_duplicates"] = recv.get("stats", {}).get("duplicates")
        out["receiver_evs"] = recv.get("evs")
    if name == "mptcp":
        out["subflows"] = send.get("subflows")
        out["connect_attempts"] = send.get("attempts")
    return out


# =============================================================================================
# orchestration
# =============================================================================================


class Child:
    """A helper process; its stdout lines are collected by a thread."""

    def __init__(self, argv: list[str], label: str) -> None:
        self.label = label
        # a bare namespace runs this checkout's mrc, as the tool itself does (a container, the
        # image's: the engine does not pass this environment on)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(
            target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True
        ).start()
        threading.Thread(
            target=self._pump, args=(self.proc.stderr, self.err.append), daemon=True
        ).start()

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MRCError(
                    f"{self.label}: no '{prefix}' in {timeout:g} s; "
                    f"stderr: {' | '.join(self.err[-5:])}"
                )
            try:
                line = self.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    time.sleep(0.05)
                    raise MRCError(
                        f"{self.label} exited ({self.proc.returncode}) "
                        f"before '{prefix}': {' | '.join(self.err[-8:])}"
                    ) from None
                continue
            if line.startswith(prefix):
                return line

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise MRCError(f"{self.label} did not finish in {timeout:g} s") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(5)


def _exec_argv(topo, node: str, cmd: list[str]) -> list[str]:
    """``cmd`` run in ``node``: in its container (``ENGINE exec``) or its bare namespace."""
    tool = Path(sys.executable).parent / "mrc-fabric"
    if tool.exists():
        return [str(tool), "exec", "--name", topo.name, node, "--", *cmd]
    container = topo.host(node).container
    if container:
        from mrc.lab.fabric.containers import exec_argv

        return exec_argv(topo.engine, container, cmd, interactive=False)
    return ["ip", "netns", "exec", topo.netns_of(node), *cmd]


def setup_mptcp(topo, client: str, server: str) -> None:
    """Server announces its other plane addresses (ADD_ADDR); the client accepts them and
    opens one subflow per plane, each routed over that plane (source = its plane address).

    Done from here, as root, with ``ip -n NETNS``: a host container's user may not."""
    for node, announce in ((client, False), (server, True)):
        ns = topo.netns_of(node)
        for cmd in mptcp_setup_commands(topo.host(node), announce):
            done = subprocess.run(["ip", "-n", ns, *cmd[1:]], capture_output=True, text=True)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                raise MRCError(f"mptcp set-up in {node} ({' '.join(cmd)}) failed: {why}")


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.name or f"fo{os.getpid() % 100000}"
        self.topo = None
        self.children: list[Child] = []
        self.workdir: Path | None = None  # made by up(), where the hosts see it
        self.data = Path("data.bin")
        self.link_state_down = False

    # ---- lifecycle ---------------------------------------------------------------------

    def up(self) -> None:
        from mrc.lab.fabric import Fabric, FabricSpec

        a = self.args
        hosts = f"4 hosts (containers of {a.host_image})" if a.host_image else "4 hosts"
        log(
            f"building fabric {self.name}: {a.planes} planes x 2 spines x 2 leaves, {hosts}, "
            f"{a.rate} per link, MTU {a.mtu}"
        )
        spec = FabricSpec(
            name=self.name, planes=a.planes, rate=a.rate, mtu=a.mtu, host_image=a.host_image
        )
        self.topo = topo = Fabric.up(spec)
        # data and results: in memory, or where host containers see them under the same name
        self.workdir = Path(
            tempfile.mkdtemp(prefix="mrc-failover-", dir=topo.share_dir or "/dev/shm")
        )
        if topo.share_dir:
            os.chmod(self.workdir, 0o1777)  # the image's user writes its results here
        self.data = self.workdir / "data.bin"

    def cleanup(self) -> None:
        for c in self.children:
            c.kill()
        if self.workdir is not None and self.args.keep_files:
            if self.topo is not None and self.topo.share_dir:  # down removes the shared dir
                self.workdir = Path(shutil.move(self.workdir, "/dev/shm"))
            log(f"files kept in {self.workdir}")
        if self.topo is not None:
            from mrc.lab.fabric import Fabric

            with contextlib.suppress(Exception):
                Fabric.down(self.name)
            log(f"fabric {self.name} removed")
            self.topo = None
        if self.workdir is not None and not self.args.keep_files:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- data --------------------------------------------------------------------------

    def make_data(self, size: int) -> None:
        import numpy as np

        log(f"generating {size / 1e6:.0f} MB of random data in {self.data}")
        rng = np.random.default_rng(12345)
        with open(self.data, "wb") as fh:
            left = size
            while left:
                n = min(left, 64 << 20)
                fh.write(rng.bytes(n))
                left -= n

    def sha_prefix(self, n: int) -> str:
        h = hashlib.sha256()
        with open(self.data, "rb") as fh:
            left = n
            while left:
                chunk = fh.read(min(left, 16 << 20))
                h.update(chunk)
                left -= len(chunk)
        return h.hexdigest()

    # ---- one transport -----------------------------------------------------------------

    def link(self, up: bool) -> tuple[float, float]:
        from mrc.lab.fabric import Fabric

        a, b = self.args.link
        t0 = time.monotonic()
        Fabric.link(self.topo, a, b, up=up)
        t1 = time.monotonic()
        self.link_state_down = not up
        return t0, t1

    def run_one(self, name: str, size: int, port: int) -> dict:
        a = self.args
        # a container runs the image's Python (python3 on its PATH), whose mrc has the roles
        python = "python3" if self.topo.host("h0").container else sys.executable
        me = [python, "-m", "mrc.lab.bench.failover_roles"]
        common = ["--fabric", self.name, "--port", str(port), "--size", str(size)]
        rres = self.workdir / f"{name}-recv.json"
        sres = self.workdir / f"{name}-send.json"
        for f in (rres, sres):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        if name == "mrc":
            mrc_opts = [
                "--payload",
                str(a.payload),
                "--window",
                str(a.window),
                "--evs",
                str(a.evs),
            ] + [x for q in a.qp for x in ("--qp", q)]
            rargv = me + ["mrc-recv", *common, "--host", "h3", "--result", str(rres), *mrc_opts]
            sargv = me + [
                "mrc-send",
                *common,
                "--host",
                "h0",
                "--peer",
                "h3",
                "--data",
                str(self.data),
                "--result",
                str(sres),
                *mrc_opts,
            ]
        else:
            extra = ["--mptcp"] if name == "mptcp" else []
            plane = a.plane if name == "tcp" else 0
            rargv = me + ["tcp-recv", *common, "--host", "h3", "--result", str(rres), *extra]
            sargv = me + [
                "tcp-send",
                *common,
                "--host",
                "h0",
                "--peer",
                "h3",
                "--data",
                str(self.data),
                "--result",
                str(sres),
                "--plane",
                str(plane),
                "--want-subflows",
                str(a.planes),
                *extra,
            ]
            if name == "mptcp":
                setup_mptcp(self.topo, "h0", "h3")
        recv = Child(_exec_argv(self.topo, "h3", rargv), f"{name} receiver")
        self.children.append(recv)
        recv.expect("ready", 30)
        send = Child(_exec_argv(self.topo, "h0", sargv), f"{name} sender")
        self.children.append(send)
        t_start = float(send.expect("start", 30).split()[1])
        log(f"{name}: transfer of {size / 1e6:.0f} MB started")
        t_fail_plan = t_start + a.fail_at
        t_heal_plan = t_start + a.heal_at
        time.sleep(max(0.0, t_fail_plan - time.monotonic()))
        f0, f1 = self.link(up=False)
        log(f"{name}: link {a.link[0]}-{a.link[1]} DOWN at +{f0 - t_start:.2f} s")
        time.sleep(max(0.0, t_heal_plan - time.monotonic()))
        h0_, h1 = self.link(up=True)
        log(f"{name}: link {a.link[0]}-{a.link[1]} UP at +{h0_ - t_start:.2f} s")
        timeout = max(60.0, a.heal_at + 60)
        rc_s = send.wait(timeout)
        rc_r = recv.wait(30)
        if not rres.exists() or not sres.exists():
            raise MRCError(
                f"{name}: helper failed (send rc {rc_s}, recv rc {rc_r}): "
                f"{' | '.join(send.err[-6:] + recv.err[-6:])}"
            )
        rj = json.loads(rres.read_text())
        sj = json.loads(sres.read_text())
        log(f"{name}: done in {rj['t_done'] - t_start:.2f} s")
        return {
            "recv": rj,
            "send": sj,
            "t_start": t_start,
            "t_fail": f0,
            "t_heal": h1,
            "fail_call": [f0, f1],
            "heal_call": [h0_, h1],
            "size": size,
        }

    # ---- everything --------------------------------------------------------------------

    def run(self) -> dict:
        a = self.args
        self.up()
        topo = self.topo
        link = topo.link_between(*a.link)
        rate = float(link.rate_bps or 1e9)
        failed_plane = link.plane
        cap_all = plane_capacity(topo, None, "h0", "h3")
        cap_fail = plane_capacity(topo, tuple(a.link), "h0", "h3")
        tcp_plane = a.plane
        capacity = {
            "mrc": (sum(cap_all), sum(cap_fail)),
            "mptcp": (
                sum(_spine0_cap(topo, p, None) for p in range(topo.planes)),
                sum(_spine0_cap(topo, p, tuple(a.link)) for p in range(topo.planes)),
            ),
            "tcp": (
                _spine0_cap(topo, tcp_plane, None),
                _spine0_cap(topo, tcp_plane, tuple(a.link)),
            ),
        }
        duration = a.heal_at + a.after
        sizes = {}
        for name in a.transports:
            cap = capacity[name][0] or rate
            sizes[name] = int(cap / 8 * duration * a.size_factor) // 8192 * 8192
        self.make_data(max(sizes.values()))
        ctx = {"capacity": capacity}
        if link.kind == "host-leaf":
            ctx["failed_plane_all"] = failed_plane
        else:
            spine = a.link[0] if a.link[0].startswith(f"p{failed_plane}s") else a.link[1]
            ctx["failed_routes"] = {(failed_plane, spine)}
        results: dict[str, dict] = {}
        raw: dict[str, dict] = {}
        for i, name in enumerate(a.transports):
            sha = self.sha_prefix(sizes[name])
            try:
                r = self.run_one(name, sizes[name], 5000 + i)
            except MRCError as exc:
                log(f"{name}: FAILED: {exc}")
                if self.link_state_down:
                    self.link(up=True)
                results[name] = {"ok": False, "sha256_match": False, "error": str(exc)}
                continue
            raw[name] = r
            results[name] = analyse(
                name, r["recv"], r["send"], r["t_start"], r["t_fail"], r["t_heal"], sha, ctx
            )
            time.sleep(0.3)
        out = {
            "fabric": {
                "name": self.name,
                "planes": topo.planes,
                "spines_per_plane": topo.spines_per_plane,
                "rate": topo.rate,
                "mtu": topo.mtu,
                "host_image": topo.host_image,
                "engine": topo.engine or None,
            },
            "link": list(a.link),
            "link_kind": link.kind,
            "fail_at_s": a.fail_at,
            "heal_at_s": a.heal_at,
            "mrc_config": {"payload": a.payload, "window": a.window, "evs": a.evs, "qp": a.qp},
            **results,
        }
        if a.plot:
            try:
                plot(a.plot, raw, out, failed_plane)
                out["plot"] = a.plot
                log(f"plot written to {a.plot}")
            except Exception as exc:  # the numbers matter more than the picture
                log(f"plot failed: {exc}")
        if a.raw:
            with open(a.raw, "w") as fh:
                json.dump({"summary": out, "raw": raw}, fh)
        return out


def _spine0_cap(topo, plane: int, failed: tuple[str, str] | None) -> float:
    """Capacity of plain destination routing h0 -> h3 in ``plane``: always via spine 0."""

    def rate(x: str, y: str) -> float:
        if failed and {x, y} == set(failed):
            return 0.0
        return float(topo.link_between(x, y).rate_bps or 10e9)

    ls = topo.host("h0").nic(plane).leaf
    ld = topo.host("h3").nic(plane).leaf
    s0 = f"p{plane}s0"
    return min(rate("h0", ls), rate(ls, s0), rate(ld, s0), rate("h3", ld))


# =============================================================================================
# output
# =============================================================================================


def _series(t: list[float], v: list[int], t0: float, bin_s: float) -> tuple[list, list]:
    """Goodput (bit/s) in bins of ``bin_s``, times relative to ``t0``."""
    if not t:
        return [], []
    xs, ys = [], []
    end = t[-1]
    b = t0
    while b < end:
        r = rate_between(t, v, b, b + bin_s)
        xs.append(b + bin_s / 2 - t0)
        ys.append((r or 0.0) / 1e6)
        b += bin_s
    return xs, ys


def plot(path: str, raw: dict, out: dict, failed_plane: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in TRANSPORTS if n in raw]
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(11, 2.6 * (len(names) + 1)), sharex=True)
    bin_s = 0.05
    colors = {"mrc": "tab:blue", "tcp": "tab:red", "mptcp": "tab:green"}
    ax0 = axes[0]
    for name in names:
        r = raw[name]
        s = r["recv"]["samples"]
        xs, ys = _series(s["t"], s["placed"], r["t_start"], bin_s)
        ax0.plot(xs, ys, label=name.upper(), color=colors[name], lw=1.2)
    ax0.set_ylabel("goodput Mbit/s")
    ax0.set_title(
        f"{out['link'][0]}-{out['link'][1]} down at {out['fail_at_s']} s, up at "
        f"{out['heal_at_s']} s; {out['fabric']['planes']} planes x "
        f"{out['fabric']['rate']} ({bin_s * 1000:.0f} ms bins)"
    )
    ax0.legend(loc="lower right", fontsize=8)
    for i, name in enumerate(names, start=1):
        ax = axes[i]
        r = raw[name]
        pl = r["recv"]["planes"]
        key = "placed" if name == "mrc" and pl.get("placed") else "nic_rx"
        what = "placed bytes" if key == "placed" else "NIC rx bytes (incl. headers)"
        for p, vals in enumerate(pl.get(key, [])):
            xs, ys = _series(pl["t"], vals, r["t_start"], 0.1)
            ax.plot(xs, ys, lw=1.0, label=f"plane {p}" + (" (failed)" if p == failed_plane else ""))
        res = out.get(name, {})
        ax.set_title(
            f"{name.upper()} per plane ({what}, 100 ms bins): stall "
            f"{res.get('max_stall_ms')} ms, during {_mbit(res.get('goodput_during_bps'))}",
            fontsize=9,
        )
        ax.set_ylabel("Mbit/s")
        ax.legend(loc="lower right", fontsize=7, ncol=4)
    for ax in axes:
        ax.axvspan(out["fail_at_s"], out["heal_at_s"], color="0.85", zorder=0)
        ax.axvline(out["fail_at_s"], color="k", ls="--", lw=0.8)
        ax.axvline(out["heal_at_s"], color="k", ls=":", lw=0.8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("seconds since the sender started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mbit(x) -> str:
    return "-" if x is None else f"{x / 1e6:.0f} Mbit/s"


def table(out: dict) -> str:
    rows = [("", *[n.upper() for n in TRANSPORTS if n in out])]
    names = [n for n in TRANSPORTS if n in out]

    def g(n, k, fmt=str):
        v = out[n].get(k)
        return "-" if v is None else fmt(v)

    rows.append(
        ("data intact (SHA-256)", *[("yes" if out[n].get("sha256_match") else "NO") for n in names])
    )
    rows.append(
        ("max delivery stall", *[g(n, "max_stall_ms", lambda v: f"{v:.1f} ms") for n in names])
    )
    rows.append(
        (
            "longest < half rate",
            *[g(n, "below_half_rate_ms", lambda v: f"{v:.0f} ms") for n in names],
        )
    )
    rows.append(
        (
            "max in-order stall",
            *[g(n, "max_stall_inorder_ms", lambda v: f"{v:.1f} ms") for n in names],
        )
    )
    for k, label in (
        ("goodput_before_bps", "goodput before"),
        ("goodput_during_bps", "goodput during failure"),
        ("goodput_after_bps", "goodput after heal"),
        ("capacity_during_bps", "capacity during failure"),
    ):
        rows.append((label, *[_mbit(out[n].get(k)) for n in names]))
    rows.append(
        (
            "during / capacity",
            *[g(n, "during_vs_capacity", lambda v: f"{v * 100:.0f}%") for n in names],
        )
    )
    rows.append(
        (
            "EVs assumed bad / resurrected",
            *[
                (
                    f"{out[n].get('evs_assumed_bad')} / {out[n].get('evs_resurrected')}"
                    if n == "mrc"
                    else "-"
                )
                for n in names
            ],
        )
    )
    rows.append(
        (
            "time to resurrection",
            *[
                g(n, "resurrection_s", lambda v: f"{v * 1000:.0f} ms") if n == "mrc" else "-"
                for n in names
            ],
        )
    )
    w0 = max(len(r[0]) for r in rows)
    ws = [max(len(r[i]) for r in rows) for i in range(1, len(rows[0]))]
    lines = []
    for r in rows:
        lines.append(
            r[0].ljust(w0) + "  " + "  ".join(c.rjust(w) for c, w in zip(r[1:], ws, strict=True))
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(
        prog=PROG,
        description="Down a fabric link mid-transfer and compare MRC, TCP and MPTCP.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short schedule (fail at 1.5 s, heal at 3 s): all three in < 1 min",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--name", help="fabric name (default: fo<pid>)")
    p.add_argument("--planes", type=positive_int, default=4)
    p.add_argument(
        "--rate", type=rate_arg, default="200mbit", help="tbf rate on every link (200mbit)"
    )
    p.add_argument("--mtu", type=positive_int, default=9000)
    p.add_argument(
        "--host-image",
        metavar="IMAGE",
        help="run the fabric's hosts as containers of IMAGE (docker/build.sh builds one;"
        " podman, or docker: MRC_ENGINE picks); data and results go through the fabric's"
        " shared directory",
    )
    p.add_argument(
        "--fail",
        choices=sorted(PRESETS),
        default="spine",
        help="which link: spine = p1l1-p1s0 (receiver leaf - spine 0), uplink = "
        "p1l0-p1s0 (sender leaf's uplink), nic = h0-p1l0 (sender NIC)",
    )
    p.add_argument(
        "--plane", type=non_negative_int, default=1, help="plane of the --fail link and of TCP"
    )
    p.add_argument("--link", nargs=2, metavar=("A", "B"), help="any fabric link instead")
    seconds = float_between(0, 3600, " s")
    p.add_argument("--fail-at", type=seconds, help="seconds after the sender starts (3.0)")
    p.add_argument("--heal-at", type=seconds, help="seconds after the sender starts (7.0)")
    p.add_argument("--after", type=seconds, help="seconds of transfer after the heal (3.0)")
    p.add_argument(
        "--transports", default=",".join(TRANSPORTS), help="comma-separated subset of mrc,tcp,mptcp"
    )
    p.add_argument("--payload", type=positive_int, default=8192, help="MRC payload bytes (8192)")
    p.add_argument("--window", type=positive_int, default=64, help="MRC packets in flight (64)")
    p.add_argument("--evs", type=positive_int, default=128, help="MRC entropy values (128)")
    p.add_argument(
        "--qp",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a QPConfig field for MRC, e.g. --qp probe_interval=0.01",
    )
    p.add_argument(
        "--size-factor",
        type=float_between(0, 100),
        default=1.0,
        help="transfer size = capacity x (heal-at + after) x this",
    )
    p.add_argument("--plot", default="failover.png", help="PNG to write ('' for none)")
    p.add_argument("--raw", help="also write every sample and event to this JSON file")
    p.add_argument("--keep-files", action="store_true")
    a = p.parse_args(argv)
    a.fail_at = a.fail_at if a.fail_at is not None else (1.5 if a.quick else 3.0)
    a.heal_at = a.heal_at if a.heal_at is not None else (3.0 if a.quick else 7.0)
    a.after = a.after if a.after is not None else (1.5 if a.quick else 3.0)
    if not 0 < a.fail_at < a.heal_at:
        p.error("need 0 < --fail-at < --heal-at")
    if a.link is None:
        a.link = [x.format(p=a.plane) for x in PRESETS[a.fail]]
    a.transports = [t.strip() for t in a.transports.split(",") if t.strip()]
    for t in a.transports:
        if t not in TRANSPORTS:
            p.error(f"unknown transport {t!r}")
    return run_main(PROG, lambda: _main(a), "interrupted (fabric removed)")


def _main(a: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise MRCError("needs root (network namespaces, tc)")
    demo = Demo(a)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    try:
        out = demo.run()
    finally:
        demo.cleanup()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if a.json:
        emit_json(out)
    else:
        print(table(out))
    ok = all(out[n].get("ok") for n in a.transports)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
