"""bench_share: how fairly window laws share one host's last hop, N timed QPs from N hosts into one.

One trimming fabric (planes x spines, a leaf per host, every link shaped to one rate, MTU 9000)
is built for the whole benchmark, with max(senders) + 1 hosts: every path is leaf - spine -
leaf, all of the same length, and the only link the senders share is the last host's last hop.
For every run, every sender count N and every law: ``mrc-recv --count N --discard`` in the last
host, and h0 .. h(N-1) each ``mrc-send --time`` (or ``--size``) into it at once; the laws
alternate run by run, so machine noise hits all. Reported per law and sender count, medians over
the runs: Jain's index of the senders' goodputs, utilization of the last hop, timeouts and
retransmits, EVs retired (and how many of those proved false), losses excused by queueing
delay, the fabric's trims and drops, and whether every byte arrived (the end-to-end checksum's
digests; the key saying so is still ``sha256_ok``).

Variants (issue 39): ``--no-trim`` builds the fabric without trimming or marks (every queue
tail-drops); ``--reshape RATE`` then cuts the receiver's plane links to RATE behind the tools'
back (the topology still says ``--rate``, from which the senders take their line rate);
``--fail-at S`` sets a spine link into the receiver's leaf down S seconds after the data begins
to flow in every run and up again after it, and reports what the senders did about it.

tools/bench_share.py parses the arguments (its --help says what each figure means) and calls
:func:`main`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError, UsageError
from mrc.lab.bench.fabric import MRC_OVERHEAD
from mrc.lab.fabric import Fabric, FabricSpec, Topology
from mrc.lab.fabric.kernel import NsHandle, handles
from mrc.lab.harness.children import Child, Children, exit_times
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import fabric, port_counters, port_deltas, reshape, unwind_on_sigterm
from mrc.lab.harness.hosts import (
    imported_mrc,
    in_host,
    library_env,
    tool_path,
    wait_listening,
)
from mrc.lab.harness.machine import loadavg, machine_info, machine_line, mrc_commit
from mrc.lab.harness.stats import jain, median, medians, rounded
from mrc.lab.harness.table import render
from mrc.units import human_bytes, parse_rate, parse_size
from mrc.wire import DEFAULT_PORT

PROG = "bench_share.py"
TOOL = "bench_share"
PORT = DEFAULT_PORT
MTU = 9000
#: seconds a run may take beyond --time (process start-up, the last round's verification)
SLACK = 60.0
#: mrc-send's fields kept for every sender of every run
SEND_KEYS = (
    "ok",
    "bytes",
    "seconds",
    "goodput_bps",
    "payload",
    "packets_sent",
    "data_packets",
    "retransmits",
    "retransmits_nack",
    "retransmits_sack",
    "retransmits_timeout",
    "silent_timeouts",
    "trims_seen",
    "ecn_echoes",
    "cc_decreases",
    "evs_assumed_bad",
    "evs_assumed_bad_false",
    "ev_losses_delayed",
    "evs_resurrected",
    "planes_lost",
    "srtt_ms",
    "cpu_seconds",
    "checksum",
    "digest",
    "digest_receiver",
    "error",
)
#: the receiver's fields (of its line for a sender) kept as ``receiver_<key>``: its ACK EVs
RECV_KEYS = ("evs_assumed_bad", "evs_assumed_bad_false", "ev_losses_delayed")
#: seconds between the last hop's counter samples, and mrc-send's --interval with --reshape or
#: --fail-at (the longest stall is measured in these)
SAMPLE = 0.1
INTERVAL = 0.05
#: bytes the receiver's NICs take in once the senders' data flows (set-up takes a few hundred
#: ms of process start-up): --fail-at counts from then
DATA_FLOWS = 256 * 1024
#: seconds of the last hop's rate reported just before and just after the link fails
FAIL_WINDOW = 1.0


# ---- one run ------------------------------------------------------------------------------------


def window_of(law: str, args: argparse.Namespace) -> int | None:
    """The --window every sender gets under ``law``: None leaves mrc-send's own."""
    if args.window is not None:
        return int(args.window)
    return max(8, 4 * args.planes) if law == "fixed" else None


@dataclass(frozen=True)
class Failure:
    """The link ``--fail-at`` sets down in every run: the first spine of plane 0 to the
    receiver's leaf, which carries that spine's share of plane 0 into the receiver for every
    sender (route ``spine``; the other spines keep the plane, so only EVs, not planes, die)."""

    spine: str
    leaf: str
    plane: int
    at: float

    @classmethod
    def of(cls, topo: Topology, receiver: str, at: float) -> Failure:
        return cls(topo.spines(0)[0].name, topo.host(receiver).nic(0).leaf, 0, at)

    @property
    def label(self) -> str:
        return f"{self.spine}-{self.leaf}"


class Watch:
    """What happens during a run besides the transfers: the receiver's NIC counters (its plane
    links' own, all of them together) every :data:`SAMPLE` seconds, and the link failure when
    it is due (``fail.at`` seconds after the data began to flow). Its :meth:`poll` runs while
    the harness waits for the senders."""

    def __init__(
        self, topo: Topology, nics: NsHandle, ifnames: Sequence[str], fail: Failure | None
    ) -> None:
        # the receiver's namespace's own netlink socket: its counters outlive mrc-recv
        self.topo, self.nics, self.ifnames, self.fail = topo, nics, list(ifnames), fail
        self.samples: list[tuple[float, int]] = []
        self.t_start = 0.0
        #: when the receiver's NICs had received :data:`DATA_FLOWS` bytes: the data flows
        self.t_data: float | None = None
        self.t_fail: float | None = None  # monotonic
        self.t_fail_wall: float | None = None
        self._next = 0.0

    def sample(self, now: float) -> None:
        rx = {i["ifname"]: int(i["rx_bytes"]) for i in self.nics.links()}
        self.samples.append((now, sum(rx.get(i, 0) for i in self.ifnames)))

    def start(self, now: float) -> None:
        self.t_start = now
        self.sample(now)
        self._next = now + SAMPLE

    def poll(self, now: float) -> None:
        if self.t_data is None:
            # every look until the data flows (reading /proc is cheap): when it began
            self.sample(now)
            if self.samples and self.samples[-1][1] - self.samples[0][1] >= DATA_FLOWS:
                self.t_data = now
                self._next = now + SAMPLE
            return
        if self.fail is not None and self.t_fail is None and now >= self.t_data + self.fail.at:
            self.t_fail, self.t_fail_wall = time.monotonic(), time.time()
            Fabric.link(self.topo, self.fail.spine, self.fail.leaf, False)
        if now >= self._next:
            self.sample(now)
            self._next = max(self._next + SAMPLE, now + SAMPLE / 2)

    def heal(self) -> None:
        """The failed link up again (both nodes' routes re-installed), if it went down."""
        if self.fail is not None and self.t_fail is not None:
            Fabric.link(self.topo, self.fail.spine, self.fail.leaf, True)

    def bytes_at(self, t: float) -> float:
        """Bytes the receiver's NICs had received at ``t``, linear between samples."""
        s = self.samples
        if not s:
            return 0.0
        if t <= s[0][0]:
            return float(s[0][1])
        for (t0, b0), (t1, b1) in zip(s, s[1:], strict=False):
            if t <= t1:
                return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else float(b1)
        return float(s[-1][1])

    def rate(self, a: float, b: float) -> float | None:
        """The receiver's NICs' receive rate (bit/s, frames as the wire carries them) in
        [a, b]; None for an interval under two samples long."""
        if b - a < 2 * SAMPLE * 0.9:
            return None
        return (self.bytes_at(b) - self.bytes_at(a)) * 8 / (b - a)

    def peak(self) -> float | None:
        """The highest rate over two consecutive sample intervals."""
        s = self.samples
        rates = [
            (s[i + 2][1] - s[i][1]) * 8 / (s[i + 2][0] - s[i][0])
            for i in range(len(s) - 2)
            if s[i + 2][0] - s[i][0] >= SAMPLE
        ]
        return max(rates) if rates else None


def longest_stall(
    intervals: Sequence[Mapping[str, Any]], after: float | None = None
) -> float | None:
    """The longest run of mrc-send's ``--interval`` records that acknowledged no byte
    (seconds, from the first one's start to the last one's end); with ``after`` (seconds on
    the sender's clock), only runs that end after it. None without records; 0.0 if none
    stalled."""
    if not intervals:
        return None
    best, start = 0.0, None
    for rec in intervals:
        if rec["bytes"] == 0:
            start = rec["start"] if start is None else start
            if after is None or rec["end"] > after:
                best = max(best, float(rec["end"]) - float(start))
        else:
            start = None
    return best


def retirements(path: Path, fail: Failure, t_fail_wall: float | None) -> dict[str, Any]:
    """From an ``--ev-log``: EVs retired (to ASSUMED_BAD) on the failed link's route after the
    failure (seconds after it, in order), and how many others (any time)."""
    dead: list[float] = []
    other = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("to") != "ASSUMED_BAD":
            continue
        t = float(e.get("t", 0.0))
        if (
            t_fail_wall is not None
            and e.get("plane") == fail.plane
            and e.get("route") == fail.spine
            and t >= t_fail_wall - 0.01
        ):
            dead.append(t - t_fail_wall)
        else:
            other += 1
    dead.sort()
    return {
        "dead_route": len(dead),
        "other": other,
        "first_s": round(dead[0], 4) if dead else None,
        "last_s": round(dead[-1], 4) if dead else None,
    }


def retire_reasons(path: Path) -> dict[str, int]:
    """From an ``--ev-log``: EVs retired (to ASSUMED_BAD), counted by reason, its numbers
    written N ("route down: N of its EVs lost packets")."""
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("to") == "ASSUMED_BAD":
            why = re.sub(r"\d+", "N", str(e.get("reason", "?")))
            out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _total(values: Sequence[Any]) -> int | None:
    """The sum of the values that were reported; None if none was (an older mrc-send)."""
    got = [int(v) for v in values if v is not None]
    return sum(got) if got else None


class Share:
    """Runs on one fabric: ``senders`` hosts h0.. into ``receiver``."""

    def __init__(self, args: argparse.Namespace, topo: Topology, receiver: str) -> None:
        self.args = args
        self.topo = topo
        self.receiver = receiver
        self.capacity = args.planes * parse_rate(args.reshape or args.rate)
        self.env = library_env(args.library)
        self.fail = Failure.of(topo, receiver, args.fail_at) if args.fail_at else None
        #: mrc-send reports intervals, for the longest stall
        self.intervals = bool(args.reshape or args.fail_at)
        self.nics = [lk.a_ifname for lk in topo.links_of(receiver) if lk.kind == "host-leaf"]

    def _argv(self, tool: str, *rest: str) -> list[str]:
        return [tool_path(tool), "--fabric", self.topo.name, "--json", "--no-progress", *rest]

    def limit(self, n: int, what: Sequence[str]) -> float:
        """Seconds a run may take: --time plus slack, or for --size four times what the last
        hop needs for every sender's bytes, plus slack."""
        if what[0] == "--time":
            return float(what[1]) + SLACK
        return float(4 * n * parse_size(what[1]) * 8 / self.capacity + SLACK)

    def run(self, law: str, n: int, what: Sequence[str], measured: bool = True) -> dict[str, Any]:
        """One run: ``n`` senders under ``law`` sending ``what`` (mrc-send's --time T or
        --size S); the run's figures, per-sender values and the verdict of the end-to-end
        checksums. MRCError if a sender or the receiver fails other than by a mismatch.
        ``measured``: the link fails (``--fail-at``) and intervals are kept only in runs that
        are (not in the warm-up)."""
        topo, receiver = self.topo, self.receiver
        senders = [f"h{i}" for i in range(n)]
        window = window_of(law, self.args)
        fail = self.fail if measured else None
        send_opts = ["--to", f"{receiver}:{PORT}", *what, "--cc", law]
        send_opts += ["--window", str(window)] if window is not None else []
        send_opts += ["--interval", f"{INTERVAL:g}"] if measured and self.intervals else []
        limit = self.limit(n, what)
        recv_opts = ["--listen", f"[::]:{PORT}", "--count", str(n), "--discard"]
        recv_opts += ["--timeout", "30"]
        with (
            tempfile.TemporaryDirectory(prefix="bench_share-") as tmp,
            handles([topo.netns_of(receiver)]) as hs,
            Children() as kids,
        ):
            nics = hs[topo.netns_of(receiver)]
            logs = {h: Path(tmp) / f"ev-{h}.jsonl" for h in [*senders, receiver]}

            def ev_log(h: str) -> list[str]:
                return ["--ev-log", str(logs[h])] if measured and self.intervals else []

            recv = kids.start(
                in_host(topo, receiver, self._argv("mrc-recv", *recv_opts, *ev_log(receiver))),
                f"mrc-recv@{receiver}",
                self.env,
            )
            wait_listening(recv, PORT, topo.netns_of(receiver), 10)
            if not recv.running:
                recv.finished(1)
                raise MRCError(
                    f"mrc-recv in {receiver} exited ({recv.returncode}) before "
                    f"listening: {recv.err_tail(5)}"
                )
            before = port_counters(topo)
            watch = Watch(topo, nics, self.nics, fail)
            watch.start(time.monotonic())
            procs = {
                h: kids.start(
                    in_host(topo, h, self._argv("mrc-send", *send_opts, *ev_log(h))),
                    f"mrc-send@{h}",
                    self.env,
                )
                for h in senders
            }
            try:
                exits = exit_times(procs, limit, on_poll=watch.poll)
                watch.sample(time.monotonic())
            finally:
                watch.heal()
            late = next((h for h in procs if h not in exits), None)
            if late is not None:
                raise MRCError(
                    f"{law} x{n}: mrc-send in {late} did not finish in {limit:g} s; "
                    f"stderr: {procs[late].err_tail(5)}"
                )
            recv.finished(30)
            after = port_counters(topo)
            out = self._result(law, n, window, procs, exits, recv, port_deltas(before, after))
            self._watched(out, watch, procs, exits)
            if measured and self.intervals:
                self._reasons(out, logs)
            if fail is not None:
                self._failure(out, fail, watch, exits, logs)
        for one in out["per_sender"].values():
            one.pop("intervals")  # (every 50 ms: what they say is in the stall figures)
        return out

    def _result(
        self,
        law: str,
        n: int,
        window: int | None,
        procs: Mapping[str, Child],
        exits: Mapping[str, float],
        recv: Child,
        fab: dict[str, Any],
    ) -> dict[str, Any]:
        addr_of = {a: h.name for h in self.topo.hosts for a in (nic.address for nic in h.nics)}
        recvs = {addr_of.get(r.get("from", ""), "?"): r for r in recv.results()}
        per: dict[str, dict[str, Any]] = {}
        mismatches: list[str] = []
        for h, c in procs.items():
            sj = c.result()
            if sj is None:
                raise MRCError(
                    f"{law} x{n}: mrc-send in {h} printed no result ({c.returncode}): "
                    f"{c.err_tail(5)}"
                )
            s = {k: sj.get(k) for k in SEND_KEYS}
            rj = recvs.get(h)
            s["receiver_bytes"] = rj.get("bytes") if rj else None
            s["receiver_digest"] = rj.get("digest") if rj else None
            for k in RECV_KEYS:
                s[f"receiver_{k}"] = rj.get(k) if rj else None
            s["intervals"] = sj.get("intervals")
            # as tests/fabric/test_fairness.py: the sender's digest (under the checksum the
            # two agreed on) equals the one the receiver sent back; and the receiver's own line
            # for this sender agrees, digest and bytes
            hashes = {s["digest"], s["digest_receiver"], s["receiver_digest"]}
            s["sha256_ok"] = len(hashes) == 1 and None not in hashes
            if s["digest"] is not None and len(hashes - {None}) > 1:
                s["sha256_ok"] = False
                mismatches.append(
                    f"{h}: sender {s['checksum']} {s['digest']}, receiver (to the sender) "
                    f"{s['digest_receiver']}, receiver (its own line) {s['receiver_digest']}"
                )
            elif not s["sha256_ok"] or c.returncode != 0 or not sj.get("ok"):
                raise MRCError(
                    f"{law} x{n}: mrc-send in {h} failed ({c.returncode}): "
                    f"{sj.get('error') or c.err_tail(5)}"
                    + ("" if rj else f"; mrc-recv reported no transfer from {h}")
                )
            elif s["receiver_bytes"] != s["bytes"]:
                raise MRCError(
                    f"{law} x{n}: {h} sent {s['bytes']} bytes, the receiver got "
                    f"{s['receiver_bytes']}"
                )
            per[h] = s
        if not mismatches and recv.returncode != 0:
            raise MRCError(
                f"{law} x{n}: mrc-recv in {self.receiver} failed ({recv.returncode}): "
                f"{recv.err_tail(5)}"
            )
        goodputs = [float(per[h]["goodput_bps"] or 0) for h in procs]
        payload = next((s["payload"] for s in per.values() if s["payload"]), None)
        total = sum(goodputs)
        # when each sender sent, on one clock: it exited (seen within exit_times' poll) its
        # ``seconds`` after its first WRITE, give or take its own exit, which is alike for all
        seconds = {h: float(per[h]["seconds"] or 0) for h in procs}
        first = min(exits[h] - seconds[h] for h in procs)
        span = max(exits.values()) - first
        overlap = min(exits.values()) - max(exits[h] - seconds[h] for h in procs)
        sent = sum(int(per[h]["bytes"] or 0) for h in procs)
        values = list(per.values())
        return {
            "cc": law,
            "senders": n,
            "window": window,
            "jain": rounded(jain(goodputs), 4),
            "utilization": round(total / self.capacity, 4),
            "span_seconds": round(span, 3),
            "overlap": round(max(0.0, overlap) / span, 4) if span > 0 else None,
            "utilization_span": round(sent * 8 / span / self.capacity, 4) if span > 0 else None,
            "payload_ceiling": (
                round(payload / (payload + MRC_OVERHEAD), 4) if payload is not None else None
            ),
            "goodput_bps": round(total),
            "goodputs_bps": [round(g) for g in goodputs],
            "timeouts": sum(int(s["retransmits_timeout"] or 0) for s in values),
            "retransmits": sum(int(s["retransmits"] or 0) for s in values),
            "planes_lost": _total([s["planes_lost"] for s in values]),
            # the senders' data EVs, and the receiver's ACK EVs (``_ack``); None where the
            # code that ran does not count it (ev_losses_delayed is newer than the others)
            "evs_assumed_bad": _total([s["evs_assumed_bad"] for s in values]),
            "evs_assumed_bad_false": _total([s["evs_assumed_bad_false"] for s in values]),
            "ev_losses_delayed": _total([s["ev_losses_delayed"] for s in values]),
            "evs_assumed_bad_ack": _total([s["receiver_evs_assumed_bad"] for s in values]),
            "evs_assumed_bad_false_ack": _total(
                [s["receiver_evs_assumed_bad_false"] for s in values]
            ),
            "ev_losses_delayed_ack": _total([s["receiver_ev_losses_delayed"] for s in values]),
            **fab,
            "sha256_ok": not mismatches,
            "mismatches": mismatches,
            "per_sender": per,
        }

    def _watched(
        self,
        out: dict[str, Any],
        watch: Watch,
        procs: Mapping[str, Child],
        exits: Mapping[str, float],
    ) -> None:
        """The last hop's own counters into ``out`` (every run), and the longest stall of any
        sender (runs with intervals)."""
        span = out["span_seconds"]
        got = watch.samples[-1][1] - watch.samples[0][1] if len(watch.samples) > 1 else None
        out["lasthop_bytes"] = got
        out["lasthop_bps"] = round(got * 8 / span) if got is not None and span > 0 else None
        out["lasthop_utilization"] = (
            round(out["lasthop_bps"] / self.capacity, 4) if out["lasthop_bps"] else None
        )
        peak = watch.peak()
        out["lasthop_peak_bps"] = round(peak) if peak is not None else None
        for s in out["per_sender"].values():
            s["max_stall_s"] = longest_stall(s["intervals"] or [])
        stalls = [s["max_stall_s"] for s in out["per_sender"].values()]
        out["max_stall_s"] = max((x for x in stalls if x is not None), default=None)

    def _reasons(self, out: dict[str, Any], logs: Mapping[str, Path]) -> None:
        """Why EVs were retired, from every process's ``--ev-log``: the senders' data EVs
        (``retired_reasons``) and the receiver's ACK EVs (``retired_reasons_ack``)."""
        total: dict[str, int] = {}
        for h in out["per_sender"]:
            for why, k in retire_reasons(logs[h]).items():
                total[why] = total.get(why, 0) + k
        out["retired_reasons"] = dict(sorted(total.items(), key=lambda kv: -kv[1]))
        out["retired_reasons_ack"] = retire_reasons(logs[self.receiver])

    def _failure(
        self,
        out: dict[str, Any],
        fail: Failure,
        watch: Watch,
        exits: Mapping[str, float],
        logs: Mapping[str, Path],
    ) -> None:
        """What the failure did, into ``out`` as ``fail_*`` keys (and ``fail`` per sender):
        when it came, the EVs of the dead route retired and how soon, other EVs retired, the
        longest stall that ended after it, and the last hop's rate in the second (at most) just
        before and just after it."""
        t_fail, wall = watch.t_fail, watch.t_fail_wall
        per = out["per_sender"]
        firsts, lasts, stalls = [], [], []
        dead = other = 0
        for h, s in per.items():
            r = retirements(logs[h], fail, wall)
            began = exits[h] - float(s["seconds"] or 0)  # its first WRITE, on our clock
            at = t_fail - began if t_fail is not None else None
            r["stall_s"] = longest_stall(s.get("intervals") or [], at) if at is not None else None
            r["fail_after_first_write_s"] = round(at, 3) if at is not None else None
            s["fail"] = r
            dead, other = dead + r["dead_route"], other + r["other"]
            firsts += [r["first_s"]] if r["first_s"] is not None else []
            lasts += [r["last_s"]] if r["last_s"] is not None else []
            stalls += [r["stall_s"]] if r["stall_s"] is not None else []
        ack = retirements(logs[self.receiver], fail, wall)
        before = during = None
        if t_fail is not None:
            # as long a stretch on either side (1 s, or half the lead-in), and none of it after
            # the first sender finished: the others then have the link to themselves
            lead = min(FAIL_WINDOW, fail.at / 2)
            before = watch.rate(t_fail - lead, t_fail)
            end = min(min(exits.values()), t_fail + lead)
            during = watch.rate(t_fail, end) if end > t_fail else None
        out.update(
            {
                "fail_link": fail.label,
                # after the data began to flow, as asked, give or take a poll and the call
                "fail_at_s": (
                    round(t_fail - watch.t_data, 3)
                    if t_fail is not None and watch.t_data is not None
                    else None
                ),
                "fail_evs_retired": dead,
                "fail_evs_retired_other": other,
                "fail_retire_first_s": rounded(median(firsts), 4),
                "fail_retire_last_s": max(lasts) if lasts else None,
                "fail_ack_evs_retired": ack["dead_route"],
                "fail_ack_retire_first_s": ack["first_s"],
                "fail_max_stall_s": max(stalls) if stalls else None,
                "fail_lasthop_before_bps": round(before) if before is not None else None,
                "fail_lasthop_during_bps": round(during) if during is not None else None,
                "fail_utilization_before": (
                    round(before / self.capacity, 4) if before is not None else None
                ),
                "fail_utilization_during": (
                    round(during / self.capacity, 4) if during is not None else None
                ),
            }
        )


# ---- the benchmark ------------------------------------------------------------------------------

#: what the table and the summary give per law and sender count: the median over the runs
MEDIAN_KEYS = (
    "jain",
    "utilization",
    "utilization_span",
    "overlap",
    "goodput_bps",
    "timeouts",
    "retransmits",
    "fabric_trims",
    "fabric_trims_lasthop",
    "fabric_drops",
    "evs_assumed_bad",
    "evs_assumed_bad_false",
    "ev_losses_delayed",
    "evs_assumed_bad_ack",
    "evs_assumed_bad_false_ack",
    "ev_losses_delayed_ack",
    "lasthop_utilization",
    "lasthop_peak_bps",
    "max_stall_s",
)
#: ... and with --fail-at
FAIL_MEDIAN_KEYS = (
    "fail_evs_retired",
    "fail_evs_retired_other",
    "fail_retire_first_s",
    "fail_retire_last_s",
    "fail_ack_evs_retired",
    "fail_ack_retire_first_s",
    "fail_max_stall_s",
    "fail_utilization_before",
    "fail_utilization_during",
)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one law and sender count: the medians of MEDIAN_KEYS (and with a failure,
    FAIL_MEDIAN_KEYS), every run kept."""
    first = runs[0]
    keys = MEDIAN_KEYS + (FAIL_MEDIAN_KEYS if "fail_link" in first else ())
    out = {
        "cc": first["cc"],
        "senders": first["senders"],
        "window": first["window"],
        **medians(runs, keys, 4),
        "payload_ceiling": first["payload_ceiling"],
        "sha256_ok": all(r["sha256_ok"] for r in runs),
    }
    for key in ("retired_reasons", "retired_reasons_ack"):
        if key in first:  # summed over the runs, not a median
            total: dict[str, int] = {}
            for r in runs:
                for why, k in r[key].items():
                    total[why] = total.get(why, 0) + k
            out[key] = dict(sorted(total.items(), key=lambda kv: -kv[1]))
    return {**out, "runs": runs}


#: the table's columns: law, senders, jain, ..., drops, EVs, and the digests' verdict as it is
COLUMN_WIDTHS = (10, 8, 8, 13, 7, 14, 10, 9, 9, 8, 12, 12, 12, 0)


def _pair(r: Mapping[str, Any], key: str) -> str:
    """The senders' (data EVs) and the receiver's (ACK EVs) figure: ``data/ack``."""
    a, b = r.get(key), r.get(f"{key}_ack")
    return "/".join("-" if x is None else f"{x:g}" for x in (a, b))


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def fabric_line(c: Mapping[str, Any]) -> str:
    """The table's first line: the fabric, what was sent, how many runs."""
    what = f"{c['time']:g} s each" if c.get("size") is None else f"{human_bytes(c['size'])} each"
    links = f"links {c['rate']}"
    if c.get("reshape"):
        links += (
            f" (the receiver's {c['planes']} reshaped to {c['reshape']} behind the tools' back, "
            f"tail drop, {c['reshape_queue_ms']:g} ms of queue)"
        )
    trim = "--trim" if c["trim"] else "no trim"
    return (
        f"{c['planes']} planes x {c['spines']} spines, {links}, {trim}, MTU {c['mtu']}: "
        f"N senders -> {c['receiver']}, {what}, median of {c['runs']} run(s)"
    )


def table(out: Mapping[str, Any]) -> str:
    """The human table: a row per law and sender count, what the columns mean, the machine."""
    c = out["config"]
    head = ["law", "senders", "jain", "utilization", "span", "goodput", "timeouts", "retrans"]
    head += ["trims", "drops", "EVs bad", "false", "delayed", "digests"]
    rows = [
        (
            str(r["cc"]),
            str(r["senders"]),
            "-" if r["jain"] is None else f"{r['jain']:.3f}",
            f"{r['utilization']:.1%}",
            "-" if r["utilization_span"] is None else f"{r['utilization_span']:.0%}",
            f"{r['goodput_bps'] / 1e6:.1f} Mbit/s",
            f"{r['timeouts']:g}",
            f"{r['retransmits']:g}",
            f"{r['fabric_trims']:g}",
            f"{r['fabric_drops']:g}",
            _pair(r, "evs_assumed_bad"),
            _pair(r, "evs_assumed_bad_false"),
            _pair(r, "ev_losses_delayed"),
            "ok" if r["sha256_ok"] else "MISMATCH",
        )
        for r in out["results"]
    ]
    lines = [
        fabric_line(c),
        render(rows, "<>>>>>>>>>>>><", sep=[""] * 12 + ["  "], widths=COLUMN_WIDTHS, head=head),
    ]
    lines.append(
        f"utilization = sum of goodputs / {c['capacity_bps'] / 1e6:.0f} Mbit/s (planes x "
        f"{'reshaped ' if c.get('reshape') else ''}rate); "
        f"headers cap it near {out['results'][0]['payload_ceiling'] or 0:.1%}, staggered starts "
        "let it pass that;\nspan = every byte over first WRITE .. last ACK of any sender; "
        "EVs bad = EVs retired (ASSUMED_BAD), false = those later proved false,\ndelayed = "
        "losses excused by queueing delay: each as the senders' data EVs / the receiver's ACK "
        "EVs ('-': not counted by this code)"
    )
    for r in out["results"]:
        bits = [f"last hop {_pct(r['lasthop_utilization'])} on its own counters"]
        bits += [f"peak {(r['lasthop_peak_bps'] or 0) / 1e6:.1f} Mbit/s"]
        if r.get("max_stall_s") is not None:
            bits.append(f"longest stall {_ms(r['max_stall_s'])}")
        lines.append(f"{r['cc']} x{r['senders']}: " + ", ".join(bits))
        for key, whose in (("retired_reasons", "data"), ("retired_reasons_ack", "ACK")):
            if r.get(key):
                why = ", ".join(f"{k} {n}" for k, n in r[key].items())
                lines.append(f"  {whose} EVs retired, all runs, by reason: {why}")
        if "fail_evs_retired" in r:
            lines.append(
                f"  {c['fail_link']} down at {c['fail_at']:g} s: its route's EVs retired "
                f"{r['fail_evs_retired']:g} (data) / {r['fail_ack_evs_retired']:g} (ACK), first "
                f"{_ms(r['fail_retire_first_s'])} after, last {_ms(r['fail_retire_last_s'])}; "
                f"other EVs retired {r['fail_evs_retired_other']:g}; longest stall after it "
                f"{_ms(r['fail_max_stall_s'])}; last hop {_pct(r['fail_utilization_before'])} "
                f"before, {_pct(r['fail_utilization_during'])} during"
            )
    lines.append(machine_line(out["machine"], out["seconds"]))
    return "\n".join(lines)


def _progress(r: Mapping[str, Any], i: int, law: str, n: int) -> str:
    line = (
        f"  run {i + 1}: {law:>8} x{n}: jain {r['jain']}, "
        f"utilization {r['utilization']:.1%} "
        f"(span {r['utilization_span'] or 0:.1%}) "
        f"({', '.join(f'{g / 1e6:.1f}' for g in r['goodputs_bps'])} Mbit/s), "
        f"{r['timeouts']} timeouts, {r['retransmits']} retransmits, "
        f"{r['fabric_trims']} trims, {r['fabric_drops']} drops, EVs bad "
        f"{_pair(r, 'evs_assumed_bad')} (false {_pair(r, 'evs_assumed_bad_false')}), delayed "
        f"{_pair(r, 'ev_losses_delayed')}, digests " + ("ok" if r["sha256_ok"] else "MISMATCH")
    )
    if "fail_evs_retired" in r:
        line += (
            f"; {r['fail_link']} down at {r['fail_at_s']} s: {r['fail_evs_retired']} EVs "
            f"retired, first {_ms(r['fail_retire_first_s'])} after, stall "
            f"{_ms(r['fail_max_stall_s'])}"
        )
    return line


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every run on one fabric (always removed); the JSON object."""
    n_max = max(args.senders)
    hosts = n_max + 1
    receiver = f"h{n_max}"
    trim = not args.no_trim
    spec = FabricSpec(
        name=args.name,
        planes=args.planes,
        spines=args.spines,
        leaves=hosts,  # a leaf per host: equal paths, one shared link (the receiver's)
        hosts=hosts,
        rate=args.rate,
        mtu=MTU,
        trim=trim,
    )
    try:
        spec.validate()
    except UsageError as exc:
        raise UsageError(f"cannot build this fabric: {exc}") from None

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    env = library_env(args.library)
    children_mrc = imported_mrc(env)
    load0 = loadavg()
    t0 = time.monotonic()
    what = ["--time", f"{args.time:g}"] if args.size is None else ["--size", str(args.size)]
    amount = f"{args.time:g} s" if args.size is None else human_bytes(args.size)
    log(
        f"fabric {args.name}: {args.planes} planes x {args.spines} spines x {hosts} leaves, "
        f"{hosts} hosts, links {args.rate}, {'--trim' if trim else 'no trim'}"
        + (f", {receiver}'s reshaped to {args.reshape}" if args.reshape else "")
        + f"; senders {args.senders} -> {receiver}, laws {', '.join(args.cc)}, {amount} x "
        f"{args.runs} run(s); mrc-send/-recv from {children_mrc} ({mrc_commit(children_mrc)}); "
        f"load {load0[0]:.2f}"
    )
    results: dict[tuple[str, int], list[dict[str, Any]]] = {
        (law, n): [] for n in args.senders for law in args.cc
    }
    reshaped: list[dict[str, Any]] = []
    failed: str | None = None
    with fabric(spec) as topo:
        if args.reshape:
            for lk in topo.links_of(receiver):
                if lk.kind == "host-leaf":
                    reshaped.append(
                        reshape(topo, lk, parse_rate(args.reshape), args.reshape_queue / 1000)
                    )
            log(
                "reshaped behind the tools' back: "
                + ", ".join(
                    f"{q['port']} {q['rate_bps'] / 1e6:g} Mbit/s, {q['limit_bytes']} B"
                    for q in reshaped
                )
            )
        share = Share(args, topo, receiver)
        failed = share.fail.label if share.fail else None
        warm = share.run(args.cc[0], n_max, ["--size", "1M"], measured=False)  # not reported
        if not warm["sha256_ok"]:
            raise MRCError(f"digest MISMATCH in the warm-up: {'; '.join(warm['mismatches'])}")
        for i in range(args.runs):
            for n in args.senders:
                for law in args.cc:  # interleaved: A, B, A, B ... so noise hits every law
                    r = share.run(law, n, what)
                    r["run"] = i + 1
                    results[law, n].append(r)
                    log(_progress(r, i, law, n))
    rate = parse_rate(args.reshape or args.rate)
    body: dict[str, Any] = {
        "config": {
            "name": args.name,
            "planes": args.planes,
            "spines": args.spines,
            "leaves": hosts,
            "hosts": hosts,
            "rate": args.rate,
            "rate_bps": parse_rate(args.rate),
            "capacity_bps": args.planes * rate,
            "mtu": MTU,
            "trim": trim,
            "receiver": receiver,
            "senders": args.senders,
            "cc": args.cc,
            "time": args.time if args.size is None else None,
            "size": args.size,
            "runs": args.runs,
            "reshape": args.reshape,
            "reshape_bps": parse_rate(args.reshape) if args.reshape else None,
            "reshape_queue_ms": args.reshape_queue if args.reshape else None,
            "reshaped": reshaped,
            "fail_at": args.fail_at,
            "fail_link": failed,
            "library": args.library,
            "children_mrc": children_mrc,
            "children_mrc_commit": mrc_commit(children_mrc),
        },
        "results": [summarize(rs) for rs in results.values()],
        "sha256_ok": all(r["sha256_ok"] for rs in results.values() for r in rs),
        "seconds": round(time.monotonic() - t0, 1),
    }
    return envelope(TOOL, machine_info(load0), body)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark as ``args`` (tools/bench_share.py's arguments) says: the table on
    stdout, or with ``--json`` on stderr and the JSON on stdout; 1 on a digest mismatch."""
    if os.geteuid() != 0:
        raise MRCError("needs root (network namespaces, tc, BPF)")
    if not args.no_trim:
        from mrc.lab.fabric.trim import unavailable_reason

        why = unavailable_reason()
        if why is not None:
            raise MRCError(
                f"packet trimming (mrc-fabric up --trim) unavailable here: {why} (--no-trim "
                "builds the fabric without it)"
            )
    if args.name in Fabric.list():
        # the fabric context manager removes its fabric however it ends: never one of yours
        raise UsageError(f"a fabric named {args.name!r} exists already; pick another --name")
    unwind_on_sigterm()  # children stopped and the fabric removed on SIGTERM too
    out = run(args)
    print(table(out), file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.json:
        emit_json(out, indent=2)
    if not out["sha256_ok"]:
        for r in out["results"]:
            for one in r["runs"]:
                for m in one["mismatches"]:
                    print(
                        f"{PROG}: error: digest MISMATCH ({r['cc']} x{r['senders']}, "
                        f"run {one['run']}): {m}",
                        file=sys.stderr,
                    )
        return 1
    return 0
