"""The failover demo's run: fail a fabric link in the middle of a transfer, heal it or not, and
compare MRC with kernel TCP (pinned to the failed path) and Linux MPTCP (one subflow per plane).

What it does, for each case (a link, how it fails, whether it heals) and each transport in
turn, on one freshly built, shaped mrc-fabric:

1. starts a receiver in host h3 and a sender in host h0 (the roles of
   :mod:`mrc.lab.bench.failover_roles`, run in the hosts' namespaces or containers); the MRC
   ends use the library API (``mrc.listen`` / ``mrc.connect`` with ``fabric=``), so the receiver
   can sample how many bytes are placed every millisecond, per plane (the sender tells it which
   EV source port is on which plane); TCP and MPTCP receivers timestamp every ``recv``. MRC's
   side channel and MPTCP's first subflow are set up over the *set-up plane*: by default the
   failed link's, so the failure hits the plane the control traffic started on (issue 37);
2. fails the link at ``fail_at`` seconds after the sender started: down at both ends, or
   blackholed (ip6tables drops everything in and out of the link's interface in the namespace
   of its first node, the host for a NIC: no link event), and heals it at ``heal_at``, or never
   (then it is restored only once the transport's run is over; a transport still running
   ``give_up`` seconds after the failure, TCP pinned to it, is reported as not finished, with
   what it moved);
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
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError
from mrc.lab.bench.common import setup_mptcp_outside
from mrc.lab.failover.analysis import analyse, capacities
from mrc.lab.failover.report import TRANSPORTS, case_title, plot, table
from mrc.lab.harness.children import Children
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import unwind_on_sigterm
from mrc.lab.harness.hosts import in_host
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.topology import Topology

TOOL = "failover_demo"
SENDER, RECEIVER = "h0", "h3"

PRESETS = {  # --fail NAME -> the link to fail (plane 1 by default, see --plane)
    "spine": ("p{p}l1", "p{p}s0"),  # receiver's leaf to spine 0: plain routing's path
    "uplink": ("p{p}l0", "p{p}s0"),  # sender's leaf uplink to spine 0
    "nic": ("h0", "p{p}l0"),  # the sender's NIC in that plane
    "recv-nic": ("h3", "p{p}l1"),  # the receiver's NIC in that plane
}
#: how a link fails: admin down at both ends (a link event the hosts see), or blackholed
HOWS = ("down", "blackhole")
#: --matrix: every way the set-up's plane is lost at a host (issue 37)
MATRIX = tuple(
    f"{fail}:{how}:{heal}"
    for fail in ("nic", "recv-nic")
    for how in HOWS
    for heal in ("heal", "never")
)
#: seconds after a heal a role still running gives up (the demo waits that long at most)
HEAL_GRACE = 60.0
#: seconds the demo waits for a role beyond its own deadline (its verdict, its result file)
ROLE_SLACK = 45.0


@dataclass(frozen=True)
class Case:
    """One failure: ``link`` (two nodes), ``how`` (down or blackhole), healed at ``heal_at``
    seconds after the sender started or never (None); ``fail`` names its preset."""

    link: tuple[str, str]
    how: str = "down"
    heal_at: float | None = None
    fail: str | None = None

    @property
    def healed(self) -> bool:
        return self.heal_at is not None

    @property
    def label(self) -> str:
        what = self.fail or "-".join(self.link)
        return f"{what}:{self.how}:{'heal' if self.healed else 'never'}"


def parse_case(text: str, plane: int, heal_at: float) -> Case:
    """``FAIL[:HOW[:HEAL]]`` (``recv-nic:blackhole:never``): a preset of :data:`PRESETS` in
    ``plane``, down (default) or blackhole, heal (at ``heal_at``, default) or never; ValueError
    naming what is wrong."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"case {text!r}: FAIL[:HOW[:HEAL]], e.g. recv-nic:blackhole:never")
    fail, how, heal = (parts + ["down", "heal"][len(parts) - 1 :])[:3]
    if fail not in PRESETS:
        raise ValueError(f"case {text!r}: FAIL is one of {', '.join(sorted(PRESETS))}")
    if how not in HOWS:
        raise ValueError(f"case {text!r}: HOW is one of {', '.join(HOWS)}")
    if heal not in ("heal", "never"):
        raise ValueError(f"case {text!r}: HEAL is heal or never")
    a, b = (x.format(p=plane) for x in PRESETS[fail])
    return Case((a, b), how, heal_at if heal == "heal" else None, fail)


def _file_label(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", label).strip("-")


def plot_path(path: str, case: Case, several: bool) -> str:
    """Where a case's plot goes: ``path`` itself, or with several cases, ``path`` with the
    case's label before its suffix (failover-recv-nic-blackhole-never.png)."""
    if not several:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{_file_label(case.label)}{p.suffix or '.png'}"))


class Outage:
    """A case's failure in the running fabric: :meth:`begin` and :meth:`end` it.

    ``down``: the link admin down at both ends (mrc-fabric's ``link``; up again re-installs
    both nodes' routes). ``blackhole``: in the namespace of the link's first node (the host of
    a NIC, the leaf of a spine link), ip6tables drops every packet that arrives on the link's
    interface (raw PREROUTING, before anything else looks at it) or leaves through it (mangle
    POSTROUTING, forwarded and local alike); the link stays up and nobody is told. The rules go
    in and out in one ``ip6tables-restore --noflush`` each, so the failure starts at one
    instant."""

    def __init__(self, topo: Topology, case: Case) -> None:
        self.topo = topo
        self.case = case
        self.active = False
        self.node = topo.canonical(case.link[0])
        self.ifname = topo.link_between(*case.link).end(self.node)[0]
        self.ns = topo.netns_of(self.node)
        #: packets the blackhole dropped (in, out) the last time it ended
        self.dropped: tuple[int, int] | None = None

    def describe(self) -> str:
        a, b = self.case.link
        if self.case.how == "down":
            return f"link {a}-{b}"
        return f"blackhole on {self.node}'s {self.ifname} ({a}-{b})"

    def _rules(self, op: str) -> str:
        i = self.ifname
        return (
            f"*raw\n{op} PREROUTING -i {i} -j DROP\nCOMMIT\n"
            f"*mangle\n{op} POSTROUTING -o {i} -j DROP\nCOMMIT\n"
        )

    def _ip6tables(self, *argv: str, stdin: str | None = None) -> str:
        cmd = ["ip", "netns", "exec", self.ns, *argv]
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise MRCError(f"{' '.join(argv)} in {self.node} failed: {why}")
        return done.stdout

    def _count(self) -> tuple[int, int]:
        """Packets the blackhole's rules dropped so far (in, out)."""
        got = [0, 0]
        wanted = (
            f"-A PREROUTING -i {self.ifname} -j DROP",
            f"-A POSTROUTING -o {self.ifname} -j DROP",
        )
        for line in self._ip6tables("ip6tables-save", "-c").splitlines():
            m = re.match(r"\[(\d+):\d+\] (.*)$", line)
            if m and m.group(2) in wanted:
                got[wanted.index(m.group(2))] += int(m.group(1))
        return got[0], got[1]

    def _set(self, failed: bool) -> None:
        from mrc.lab.fabric import Fabric

        if self.case.how == "down":
            Fabric.link(self.topo, *self.case.link, up=not failed)
        elif failed:
            self._ip6tables("ip6tables-restore", "--noflush", stdin=self._rules("-I"))
        else:
            with contextlib.suppress(MRCError):  # (the counters are a report, not the heal)
                self.dropped = self._count()
            self._ip6tables("ip6tables-restore", "--noflush", stdin=self._rules("-D"))

    def begin(self) -> tuple[float, float]:
        """Fail it; the monotonic times before and after."""
        t0 = time.monotonic()
        self.active = True  # (from here on, end() undoes whatever part of it took)
        self._set(failed=True)
        return t0, time.monotonic()

    def end(self) -> tuple[float, float]:
        """Heal it (or restore it, after a case that never heals); the times before and
        after."""
        t0 = time.monotonic()
        self._set(failed=False)
        self.active = False
        return t0, time.monotonic()


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
        self.raws: list[dict[str, Any]] = []  # --raw: every case's samples and events

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

    def _mptcp(self, first_plane: int) -> None:
        """MPTCP's path manager on both hosts (as root, from outside): the receiver announces
        its addresses on every plane but ``first_plane``, whose subflow the sender opens
        first, so every plane gets one subflow."""
        topo = self.fabric
        setup_mptcp_outside(topo, SENDER, announce=False)
        setup_mptcp_outside(topo, RECEIVER, announce=False)
        ns = topo.netns_of(RECEIVER)
        for nic in topo.host(RECEIVER).nics:
            if nic.plane == first_plane or not nic.nic:
                continue
            cmd = ["ip", "-n", ns, "mptcp", "endpoint", "add", nic.address, "dev", nic.nic]
            done = subprocess.run([*cmd, "signal"], capture_output=True, text=True)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                raise MRCError(f"mptcp set-up in {RECEIVER} ({' '.join(cmd[3:])}) failed: {why}")

    def _roles(
        self, name: str, size: int, port: int, files: tuple[Path, Path], setup: int, give_up: float
    ) -> tuple[list[str], list[str]]:
        """The receiver's and the sender's argv (before the host's exec) for ``name``: MRC's
        side channel and MPTCP's first subflow over plane ``setup``; each role gives up
        ``give_up`` seconds after the transfer started (the receiver a second later)."""
        a = self.args
        rres, sres = files
        # a container runs the image's Python (python3 on its PATH), whose mrc has the roles
        python = "python3" if self.fabric.host(SENDER).container else sys.executable
        me = [python, "-m", "mrc.lab.bench.failover_roles"]
        common = ["--fabric", self.name, "--port", str(port), "--size", str(size)]
        recv = ["--host", RECEIVER, "--result", str(rres), "--deadline", f"{give_up + 1:.3f}"]
        send = ["--host", SENDER, "--peer", RECEIVER, "--data", str(self.data)]
        send += ["--result", str(sres), "--deadline", f"{give_up:.3f}"]
        if name == "mrc":
            opts = ["--payload", str(a.payload), "--window", str(a.window), "--evs", str(a.evs)]
            opts += [x for q in a.qp for x in ("--qp", q)]
            send += ["--setup-plane", str(setup)]
            return me + ["mrc-recv", *common, *recv, *opts], me + [
                "mrc-send",
                *common,
                *send,
                *opts,
            ]
        extra = ["--mptcp"] if name == "mptcp" else []
        plane = a.plane if name == "tcp" else setup
        send += ["--plane", str(plane), "--want-subflows", str(a.planes), *extra]
        return me + ["tcp-recv", *common, *recv, *extra], me + ["tcp-send", *common, *send]

    def run_one(
        self, case: Case, name: str, size: int, port: int, setup: int, outage: Outage
    ) -> dict[str, Any]:
        """One transport's transfer under ``case``: start both roles, fail the link on
        schedule, heal it on schedule (or, never healing, restore it once the roles are
        done), and read what the roles recorded."""
        a = self.args
        assert self.workdir is not None
        rres = self.workdir / f"{name}-recv.json"
        sres = self.workdir / f"{name}-send.json"
        for f in (rres, sres):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        give_up = case.heal_at + HEAL_GRACE if case.heal_at is not None else a.fail_at + a.give_up
        rargv, sargv = self._roles(name, size, port, (rres, sres), setup, give_up)
        if name == "mptcp":
            self._mptcp(setup)
        recv = self.children.start(in_host(self.fabric, RECEIVER, rargv), f"{name} receiver")
        recv.expect("ready", 30)
        send = self.children.start(in_host(self.fabric, SENDER, sargv), f"{name} sender")
        t_start = float(send.expect("start", 30).split()[1])
        log(f"{name}: transfer of {size / 1e6:.0f} MB started")
        what = outage.describe()
        h0 = h1 = None
        try:
            # the schedule is relative to the sender's start: sleeping until then is the plan
            time.sleep(max(0.0, t_start + a.fail_at - time.monotonic()))
            f0, f1 = outage.begin()
            log(f"{name}: {what} {'DOWN' if case.how == 'down' else 'ON'} at +{f0 - t_start:.2f} s")
            if case.heal_at is not None:
                time.sleep(max(0.0, t_start + case.heal_at - time.monotonic()))
                h0, h1 = outage.end()
                log(f"{name}: {what} healed at +{h0 - t_start:.2f} s")
            rc_s = send.wait(max(1.0, t_start + give_up + ROLE_SLACK - time.monotonic()))
            rc_r = recv.wait(30)
        finally:
            if outage.active:  # never healed (or the run broke): restore it for the next
                try:
                    outage.end()
                    log(f"{name}: {what} restored after the run (not a heal)")
                except MRCError as exc:
                    log(f"{name}: {what} NOT restored: {exc}")
        if not rres.exists() or not sres.exists():
            raise MRCError(
                f"{name}: helper failed (send rc {rc_s}, recv rc {rc_r}): "
                f"{' | '.join(send.err[-6:] + recv.err[-6:])}"
            )
        rj = json.loads(rres.read_text())
        sj = json.loads(sres.read_text())
        if rj.get("finished", True):
            log(f"{name}: done in {rj['t_done'] - t_start:.2f} s")
        else:
            log(
                f"{name}: NOT finished: {rj.get('bytes', 0) / 1e6:.0f} MB"
                f" of {size / 1e6:.0f} MB moved"
            )
        return {
            "recv": rj,
            "send": sj,
            "t_start": t_start,
            "t_fail": f0,
            "t_heal": h1,
            "fail_call": [f0, f1],
            "heal_call": [h0, h1] if h0 is not None else None,
            "size": size,
            "dropped": outage.dropped,
        }

    # ---- everything --------------------------------------------------------------------

    def _sha(self, n: int, cache: dict[int, str]) -> str:
        if n not in cache:
            cache[n] = self.sha_prefix(n)
        return cache[n]

    def run_case(
        self, case: Case, sizes: dict[str, int], ports: list[int], shas: dict[int, str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every transport under ``case``: its entry of ``cases`` and the raw records."""
        a = self.args
        topo = self.fabric
        link = topo.link_between(*case.link)
        failed_plane = link.plane
        setup = a.setup_plane if a.setup_plane is not None else failed_plane
        capacity = capacities(topo, case.link, a.plane, SENDER, RECEIVER)
        ctx: dict[str, Any] = {"capacity": capacity, "failed_plane": failed_plane}
        if link.kind == "host-leaf":
            ctx["failed_plane_all"] = failed_plane
        else:
            a_, b_ = case.link
            spine = a_ if a_.startswith(f"p{failed_plane}s") else b_
            ctx["failed_routes"] = {(failed_plane, spine)}
        outage = Outage(topo, case)
        out: dict[str, Any] = {
            "label": case.label,
            "fail": case.fail,
            "link": list(case.link),
            "link_kind": link.kind,
            "how": case.how,
            "blackhole_in": [outage.node, outage.ifname] if case.how == "blackhole" else None,
            "failed_plane": failed_plane,
            "fail_at_s": a.fail_at,
            "heal_at_s": case.heal_at,
            "healed": case.healed,
            "give_up_s": None if case.healed else a.give_up,
            "setup_plane": setup,
            "setup_on_failed_plane": setup == failed_plane,
        }
        log(f"case {case_title(out)}")
        raw: dict[str, Any] = {}
        for name, port in zip(a.transports, ports, strict=True):
            required = case.healed or name == "mrc"
            sha = self._sha(sizes[name], shas)
            try:
                r = self.run_one(case, name, sizes[name], port, setup, outage)
            except MRCError as exc:
                log(f"{name}: FAILED: {exc}")
                out[name] = {
                    "ok": False,
                    "sha256_match": False,
                    "error": str(exc),
                    "expected_to_finish": required,
                }
                continue
            raw[name] = r
            row = analyse(
                name, r["recv"], r["send"], r["t_start"], r["t_fail"], r["t_heal"], sha, ctx
            )
            row["expected_to_finish"] = required
            if r["dropped"] is not None:
                row["blackhole_dropped_packets"] = sum(r["dropped"])
            if not row["finished"] and name != "mrc" and row.get("bytes"):
                # a stream delivers in order: what it moved is the data's first bytes
                moved = int(row["bytes"])
                row["moved_sha256_match"] = r["recv"].get("sha256") == self._sha(moved, {})
            out[name] = row
            time.sleep(0.3)
        return out, raw

    def run(self) -> dict[str, Any]:
        a = self.args
        self.up()
        topo = self.fabric
        cases: list[Case] = a.cases
        several = len(cases) > 1
        sizes: list[dict[str, int]] = []
        for case in cases:
            capacity = capacities(topo, case.link, a.plane, SENDER, RECEIVER)
            rate = float(topo.link_between(*case.link).rate_bps or 1e9)
            duration = (case.heal_at if case.heal_at is not None else a.fail_at) + a.after
            sizes.append(
                {
                    name: int((capacity[name][0] or rate) / 8 * duration * a.size_factor)
                    // 8192
                    * 8192
                    for name in a.transports
                }
            )
        self.make_data(max(n for s in sizes for n in s.values()))
        shas: dict[int, str] = {}
        ports = [5000 + i for i in range(len(a.transports))]
        results: list[dict[str, Any]] = []
        for case, case_sizes in zip(cases, sizes, strict=True):
            out, raw = self.run_case(case, case_sizes, ports, shas)
            results.append(out)
            if a.plot:
                path = plot_path(a.plot, case, several)
                try:
                    plot(path, raw, {**out, "fabric": self._fabric_info()}, out["failed_plane"])
                    out["plot"] = path
                    log(f"plot written to {path}")
                except Exception as exc:  # the numbers matter more than the picture
                    log(f"plot failed: {exc}")
            if a.raw:
                self.raws.append({"case": case.label, "raw": raw})
        first = results[0]
        summary: dict[str, Any] = {
            "fabric": self._fabric_info(),
            "link": first["link"],
            "link_kind": first["link_kind"],
            "fail_at_s": a.fail_at,
            "heal_at_s": first["heal_at_s"],
            "mrc_config": {"payload": a.payload, "window": a.window, "evs": a.evs, "qp": a.qp},
            **{n: first[n] for n in TRANSPORTS if n in first},
            "cases": results,
        }
        if "plot" in first:
            summary["plot"] = first["plot"]
        if a.raw:
            with open(a.raw, "w") as fh:
                json.dump({"summary": summary, "raw": self.raws}, fh)
        return summary

    def _fabric_info(self) -> dict[str, Any]:
        topo = self.fabric
        return {
            "name": self.name,
            "planes": topo.planes,
            "spines_per_plane": topo.spines_per_plane,
            "rate": topo.rate,
            "mtu": topo.mtu,
            "host_image": topo.host_image,
            "engine": topo.engine or None,
        }


def passed(case: dict[str, Any], names: list[str]) -> bool:
    """Whether a case went as it should: every transport expected to finish (all of them when
    the link heals; MRC alone when it never does) delivered its data intact, and none that
    ran failed to run or finished with other data than was sent."""
    for name in names:
        row = case.get(name, {})
        if row.get("expected_to_finish", True):
            if not row.get("ok"):
                return False
        elif "error" in row or (row.get("finished") and not row.get("sha256_match")):
            return False
    return True


def main(a: argparse.Namespace) -> int:
    """Run the demo as ``a`` (tools/failover_demo.py's arguments) says; print a table per
    case, or the JSON with ``a.json``; 0 if every case :func:`passed`."""
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
        print("\n\n".join(f"{case_title(c)}\n{table(c)}" for c in out["cases"]))
    ok = all(passed(c, a.transports) for c in out["cases"])
    return 0 if ok else 1


__all__ = ["HOWS", "MATRIX", "PRESETS", "TRANSPORTS", "Case", "Demo", "main", "parse_case"]
