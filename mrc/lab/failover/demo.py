"""The failover demo's run: down a fabric link in the middle of a transfer, heal it, and compare
MRC with kernel TCP (pinned to the failed path) and Linux MPTCP (one subflow per plane).

What it does, for each transport in turn, on one freshly built, shaped mrc-fabric:

1. starts a receiver in host h3 and a sender in host h0 (the roles of
   :mod:`mrc.lab.bench.failover_roles`, run in the hosts' namespaces or containers); the MRC
   ends use the library API (``mrc.listen`` / ``mrc.connect`` with ``fabric=``), so the receiver
   can sample how many bytes are placed every millisecond, per plane (the sender tells it which
   EV source port is on which plane); TCP and MPTCP receivers timestamp every ``recv``;
2. downs a link at ``fail_at`` seconds after the sender started, and heals it at ``heal_at``;
3. checks the SHA-256 of what arrived against what was sent and computes the figures of
   :mod:`mrc.lab.failover.analysis`.

With a host image the fabric's hosts are containers of an image with mrc in it: the roles run
there as the image's user, with its Python, the data file and the result files go through the
fabric's shared directory (``/run/mrc/share-NAME``, the same path inside and out), and MPTCP's
path manager is set up from here with ``ip -n``, as root, as everything else that needs root in
a host's namespace.

tools/failover_demo.py parses the arguments and calls :func:`main`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError
from mrc.lab.bench.common import setup_mptcp_outside
from mrc.lab.failover.analysis import analyse, capacities
from mrc.lab.failover.report import TRANSPORTS, plot, table
from mrc.lab.harness.children import Children
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import unwind_on_sigterm
from mrc.lab.harness.hosts import in_host
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.topology import Topology

TOOL = "failover_demo"
SENDER, RECEIVER = "h0", "h3"

PRESETS = {  # --fail NAME -> the link to down (plane 1 by default, see --plane)
    "spine": ("p{p}l1", "p{p}s0"),  # receiver's leaf to spine 0: plain routing's path
    "uplink": ("p{p}l0", "p{p}s0"),  # sender's leaf uplink to spine 0
    "nic": ("h0", "p{p}l0"),  # the sender's NIC in that plane
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Demo:
    """One demo run: its fabric, its files and its children, all removed by :meth:`cleanup`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.name or f"fo{os.getpid() % 100000}"
        self.topo: Topology | None = None
        self.children = Children()
        self.workdir: Path | None = None  # made by up(), where the hosts see it
        self.data = Path("data.bin")
        self.link_state_down = False

    @property
    def fabric(self) -> Topology:
        if self.topo is None:
            raise MRCError("the fabric is not up")
        return self.topo

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
        self.children.stop()
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
        """Down or up the demo's link; the monotonic times before and after the call."""
        from mrc.lab.fabric import Fabric

        a, b = self.args.link
        t0 = time.monotonic()
        Fabric.link(self.fabric, a, b, up=up)
        t1 = time.monotonic()
        self.link_state_down = not up
        return t0, t1

    def _roles(
        self, name: str, size: int, port: int, rres: Path, sres: Path
    ) -> tuple[list[str], list[str]]:
        """The receiver's and the sender's argv (before the host's exec) for ``name``."""
        a = self.args
        # a container runs the image's Python (python3 on its PATH), whose mrc has the roles
        python = "python3" if self.fabric.host(SENDER).container else sys.executable
        me = [python, "-m", "mrc.lab.bench.failover_roles"]
        common = ["--fabric", self.name, "--port", str(port), "--size", str(size)]
        recv = ["--host", RECEIVER, "--result", str(rres)]
        send = ["--host", SENDER, "--peer", RECEIVER, "--data", str(self.data)]
        send += ["--result", str(sres)]
        if name == "mrc":
            opts = ["--payload", str(a.payload), "--window", str(a.window), "--evs", str(a.evs)]
            opts += [x for q in a.qp for x in ("--qp", q)]
            return me + ["mrc-recv", *common, *recv, *opts], me + [
                "mrc-send",
                *common,
                *send,
                *opts,
            ]
        extra = ["--mptcp"] if name == "mptcp" else []
        plane = a.plane if name == "tcp" else 0
        send += ["--plane", str(plane), "--want-subflows", str(a.planes), *extra]
        return me + ["tcp-recv", *common, *recv, *extra], me + ["tcp-send", *common, *send]

    def run_one(self, name: str, size: int, port: int) -> dict[str, Any]:
        a = self.args
        assert self.workdir is not None
        rres = self.workdir / f"{name}-recv.json"
        sres = self.workdir / f"{name}-send.json"
        for f in (rres, sres):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        rargv, sargv = self._roles(name, size, port, rres, sres)
        if name == "mptcp":
            setup_mptcp_outside(self.fabric, SENDER, announce=False)
            setup_mptcp_outside(self.fabric, RECEIVER, announce=True)
        recv = self.children.start(in_host(self.fabric, RECEIVER, rargv), f"{name} receiver")
        recv.expect("ready", 30)
        send = self.children.start(in_host(self.fabric, SENDER, sargv), f"{name} sender")
        t_start = float(send.expect("start", 30).split()[1])
        log(f"{name}: transfer of {size / 1e6:.0f} MB started")
        t_fail_plan = t_start + a.fail_at
        t_heal_plan = t_start + a.heal_at
        time.sleep(max(0.0, t_fail_plan - time.monotonic()))
        f0, f1 = self.link(up=False)
        log(f"{name}: link {a.link[0]}-{a.link[1]} DOWN at +{f0 - t_start:.2f} s")
        time.sleep(max(0.0, t_heal_plan - time.monotonic()))
        h0, h1 = self.link(up=True)
        log(f"{name}: link {a.link[0]}-{a.link[1]} UP at +{h0 - t_start:.2f} s")
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
            "heal_call": [h0, h1],
            "size": size,
        }

    # ---- everything --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        a = self.args
        self.up()
        topo = self.fabric
        link = topo.link_between(*a.link)
        rate = float(link.rate_bps or 1e9)
        failed_plane = link.plane
        capacity = capacities(topo, (a.link[0], a.link[1]), a.plane, SENDER, RECEIVER)
        duration = a.heal_at + a.after
        sizes = {}
        for name in a.transports:
            cap = capacity[name][0] or rate
            sizes[name] = int(cap / 8 * duration * a.size_factor) // 8192 * 8192
        self.make_data(max(sizes.values()))
        ctx: dict[str, Any] = {"capacity": capacity}
        if link.kind == "host-leaf":
            ctx["failed_plane_all"] = failed_plane
        else:
            spine = a.link[0] if a.link[0].startswith(f"p{failed_plane}s") else a.link[1]
            ctx["failed_routes"] = {(failed_plane, spine)}
        results: dict[str, dict[str, Any]] = {}
        raw: dict[str, dict[str, Any]] = {}
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
        out: dict[str, Any] = {
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


def main(a: argparse.Namespace) -> int:
    """Run the demo as ``a`` (tools/failover_demo.py's arguments) says; print the table, or the
    JSON with ``a.json``; 0 if every transport delivered its data intact."""
    if os.geteuid() != 0:
        raise MRCError("needs root (network namespaces, tc)")
    demo = Demo(a)
    unwind_on_sigterm()
    load_start = loadavg()
    t0 = time.monotonic()
    try:
        out = demo.run()
    finally:
        demo.cleanup()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if a.json:
        emit_json(envelope(TOOL, machine_info(load_start), out))
    else:
        print(table(out))
    ok = all(out[n].get("ok") for n in a.transports)
    return 0 if ok else 1


__all__ = ["PRESETS", "TRANSPORTS", "Demo", "main"]
