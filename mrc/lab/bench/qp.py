"""bench_qp: one MRC queue pair against the machine's own limits on the same veth path.

Two network namespaces (mrc.lab.testbed.TwoHosts) are joined by veth links (one plane each).
For every payload size and every run it measures, side by side and interleaved (each kind leads
in turn, so drift hits all alike):

* **mrc**: ``mrc-recv --discard --json`` in B, ``mrc-send --size S --payload P --json`` from A
  (one QP sprayed over all planes): goodput, packets/s, retransmits; with a pre-shared key (and
  ``--encrypt``) too when asked, and what each costs against the run without one; with each
  end-to-end checksum asked for (``--checksum NAME`` to both), and what each costs, in goodput
  and in each side's CPU, against the first;
* the references of :mod:`mrc.lab.harness.peers`, P+28-byte datagrams, the size of an MRC data
  datagram: **raw** one ``send`` / ``recv_into`` per datagram; **gso** the same datagrams sent
  up to 64 per ``sendmsg`` with UDP_SEGMENT and received as GRO trains; **tcp** kernel TCP over
  the first link. Each runs ``duration`` s at the receiver and reports the payload rate it moved,
  and MRC goodput is shown as a fraction of each; tcp also each side's CPU seconds per GiB it
  moved, and MRC's (sender + receiver) as a multiple of TCP's (``mrc_cpu_vs_tcp``);
* **aioquic** (only when asked: an optional package), :mod:`mrc.lab.harness.quic_peer`: one
  QUIC stream of the MRC transfer's size over the first link, hashed by the receiver and
  checked against the sender's hash, with each side's CPU seconds per GiB as MRC's.

tools/bench_qp.py parses the arguments and calls :func:`main`; :mod:`mrc.lab.bench.qp_report`
prints the table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError
from mrc.lab.bench.qp_report import PEER_KEYS, table
from mrc.lab.harness.children import Child, Children, stop
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import unwind_on_sigterm
from mrc.lab.harness.hosts import tool_path, wait_listening
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.lab.harness.memory import first_touch_us_per_page, warm_memory
from mrc.lab.harness.output import last_line
from mrc.lab.harness.stats import median
from mrc.lab.testbed import TwoHosts
from mrc.wire import DATA_HDR_LEN, DEFAULT_PORT

TOOL = "bench_qp"
MRC_PORT = DEFAULT_PORT
BLAST_PORT = 5001
QUIC_PORT = 5002
IPV6_UDP = 48  # IPv6 + UDP headers
AIM_BPS = 1e9
BLAST_LEAD = 0.5  # the sender keeps going this long past the receiver's window
SECURITY_MODES = ("none", "integrity", "encrypt")
PEER_KINDS = tuple(PEER_KEYS)
#: --compare's default: aioquic needs a package mrc does not depend on, so only when asked
DEFAULT_PEERS = ("raw", "gso", "tcp")
PEERS = [sys.executable, "-m", "mrc.lab.harness.peers"]
QUIC_PEER = [sys.executable, "-m", "mrc.lab.harness.quic_peer"]

Log = Callable[[str], None]


class Bench:
    def __init__(self, args: argparse.Namespace, log: Log) -> None:
        self.args = args
        self.log = log
        self.mrc_send = tool_path("mrc-send")
        self.mrc_recv = tool_path("mrc-recv")
        self.key_file: str | None = None  # made on first use of a key, deleted by close()

    def _key_args(self, security: str) -> list[str]:
        if security == "none":
            return []
        if self.key_file is None:
            import tempfile

            from mrc.security.keys import write_key_file

            keydir = tempfile.mkdtemp(prefix="mrc-bench-qp-")
            self.key_file = os.path.join(keydir, "bench.key")
            write_key_file(self.key_file)
        return ["--key-file", self.key_file] + (["--encrypt"] if security == "encrypt" else [])

    def close(self) -> None:
        if self.key_file is not None:
            shutil.rmtree(os.path.dirname(self.key_file), ignore_errors=True)
            self.key_file = None

    # ---- MRC -------------------------------------------------------------------------

    def mrc_run(
        self,
        hosts: TwoHosts,
        payload: int,
        size: int,
        profile: bool = False,
        security: str = "none",
        checksum: str | None = None,
    ) -> dict[str, Any]:
        """One transfer; ``checksum``: both tools' ``--checksum`` (None: neither gets one,
        and they agree on mrc's default)."""
        a = self.args
        n = hosts.links
        keys = self._key_args(security) + (["--checksum", checksum] if checksum else [])
        recv_argv = [self.mrc_recv, "--discard", "--json", "--no-progress", "--timeout", "30"]
        recv_argv += keys
        for addr in hosts.b_addrs[:n]:
            recv_argv += ["--listen", f"[{addr}]:{MRC_PORT}"]
        send_argv = [
            self.mrc_send,
            "--size",
            str(size),
            "--payload",
            str(payload),
            "--json",
            "--no-progress",
            "--to",
            f"[{hosts.b_addrs[0]}]:{MRC_PORT}",
            *keys,
        ]
        for addr in hosts.a_addrs[:n]:
            send_argv += ["--from", addr]
        if a.evs:
            send_argv += ["--evs", str(a.evs)]
        if a.window:
            send_argv += ["--window", str(a.window)]
        if a.burst:
            send_argv += ["--burst", str(a.burst)]
        for setting in a.qp:
            send_argv += ["--qp", setting]
        timeout = 60 + size / 2e6  # a 256M transfer gets > 3 minutes even at 16 Mbit/s
        t0 = time.monotonic()
        with Children() as kids:
            recv = kids.start(hosts.exec_argv("b", recv_argv), "mrc-recv")
            wait_listening(recv, MRC_PORT, hosts.b, 15)
            send = kids.start(hosts.exec_argv("a", send_argv), "mrc-send")
            spies = []
            if profile and a.profile:
                spies = self._profile(kids, send, recv, f"l{hosts.links}-p{payload}")
            if not send.finished(timeout):
                raise MRCError(f"MRC run timed out after {timeout:.0f} s")
            # a receiver whose sender failed may wait a long time: don't
            if not recv.finished(30 if send.returncode == 0 else 3):
                stop([recv])
            for spy in spies:  # they exit with their target
                spy.finished(10)
        wall = time.monotonic() - t0
        sj, rj = send.result(), recv.result()
        if sj is None or send.returncode != 0:
            why = (sj or {}).get("error") or last_line(send.stderr) or f"exit {send.returncode}"
            recv_why = last_line(recv.stderr) or "no error"
            raise MRCError(f"mrc-send failed: {why} (mrc-recv: {recv_why})")
        if checksum is not None and sj.get("checksum") != checksum:
            raise MRCError(f"asked for checksum {checksum}, mrc-send used {sj.get('checksum')}")
        seconds = float(sj["seconds"])
        run: dict[str, Any] = {
            "ok": bool(sj.get("ok")) and bool(rj and rj.get("ok")),
            "security": sj.get("security", "none"),
            # the end-to-end checksum the transfer was verified with (mrc-recv picked it)
            "checksum": sj.get("checksum"),
            "bytes": sj["bytes"],
            "seconds": seconds,
            "goodput_bps": sj["goodput_bps"],
            "packets_sent": sj["packets_sent"],
            "data_packets": sj["data_packets"],
            "pps": sj["packets_sent"] / seconds if seconds > 0 else 0.0,
            "retransmits": sj["retransmits"],
            # CPU seconds per GiB moved, each side's process during the transfer
            "send_cpu_s_per_gib": sj["cpu_seconds"] / (sj["bytes"] / (1 << 30))
            if sj.get("cpu_seconds") is not None and sj["bytes"]
            else None,
            "recv_cpu_s_per_gib": rj["cpu_seconds"] / (sj["bytes"] / (1 << 30))
            if rj and rj.get("cpu_seconds") is not None and sj["bytes"]
            else None,
            "retransmits_nack": sj.get("retransmits_nack"),
            "retransmits_timeout": sj.get("retransmits_timeout"),
            "nacks": sj.get("nacks"),
            "srtt_ms": sj.get("srtt_ms"),
            "planes": sj.get("planes"),
            "dropped_by_reason": sj.get("dropped_by_reason"),
            "wall_seconds": round(wall, 3),
        }
        if rj is not None:
            run["recv_packets"] = rj.get("packets_received")
            run["recv_duplicates"] = rj.get("duplicates")
            run["recv_acks_sent"] = rj.get("acks_sent")
            run["recv_seconds"] = rj.get("seconds")
            if rj.get("seconds"):
                run["recv_pps"] = rj["packets_received"] / rj["seconds"]
        return run

    def _profile(self, kids: Children, send: Child, recv: Child, tag: str) -> list[Child]:
        """py-spy record both ends of the first MRC run (``--profile DIR``)."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            raise MRCError("--profile needs py-spy (pip install py-spy into the venv)")
        out = Path(self.args.profile)
        out.mkdir(parents=True, exist_ok=True)
        record = [spy, "record", "--nonblocking", "--idle", "-r", "250", "-f", "raw"]
        return [
            kids.start(
                [*record, "-o", str(out / f"{name}-{tag}.txt"), "--pid", str(proc.pid)],
                f"py-spy {name}",
            )
            for name, proc in (("send", send), ("recv", recv))
        ]

    # ---- the references --------------------------------------------------------------

    def peer_run(self, hosts: TwoHosts, payload: int, kind: str) -> dict[str, Any]:
        """One run of a reference (:mod:`mrc.lab.harness.peers`): ``raw`` a datagram per send
        and receive, ``gso`` GSO sends and GRO receives of the same datagrams, ``tcp`` kernel
        TCP on the first link; ``aioquic`` is :meth:`quic_run`."""
        if kind == "aioquic":
            return self.quic_run(hosts, payload)
        a = self.args
        n = hosts.links
        size = payload + DATA_HDR_LEN
        common = ["--port", str(BLAST_PORT)]
        if kind == "tcp":
            recv_argv = [*PEERS, "tcp-recv", *common, "--duration", str(a.duration)]
            send_argv = [*PEERS, "tcp-send", *common, "--duration", str(a.duration + BLAST_LEAD)]
            send_argv += ["--targets", f"{hosts.a_addrs[0]}/{hosts.b_addrs[0]}"]
        else:
            gso = min(64, 65000 // size) if kind == "gso" else 1
            recv_argv = [*PEERS, "udp-recv", *common, "--dgram", str(size)]
            recv_argv += ["--duration", str(a.duration)] + (["--gro"] if kind == "gso" else [])
            targets = ",".join(
                f"{la}/{rb}" for la, rb in zip(hosts.a_addrs[:n], hosts.b_addrs[:n], strict=True)
            )
            send_argv = [*PEERS, "udp-send", *common, "--dgram", str(size), "--targets", targets]
            send_argv += ["--duration", str(a.duration + BLAST_LEAD), "--window", str(a.duration)]
            send_argv += ["--gso", str(gso)]
        with Children() as kids:
            recv = kids.start(hosts.exec_argv("b", recv_argv), f"{kind} receiver")
            try:
                recv.expect("ready", 30)
            except MRCError:
                recv.finished(5)
                why = last_line(recv.stderr)
                raise MRCError(f"{kind} receiver did not start: {why}") from None
            send = kids.start(hosts.exec_argv("a", send_argv), f"{kind} sender")
            if not send.finished(a.duration + 30) or not recv.finished(15):
                raise MRCError(f"{kind} run timed out")
        sj, rj = send.result(), recv.result()
        if rj is None or "error" in rj:
            why = (rj or {}).get("error") or last_line(recv.stderr) or f"exit {recv.returncode}"
            sender = last_line(send.stderr) or "ok"
            raise MRCError(f"{kind} receiver failed: {why} (sender: {sender})")
        if sj is None:
            why = last_line(send.stderr) or f"exit {send.returncode}"
            raise MRCError(f"{kind} sender failed: {why}")
        if kind == "tcp":
            return {
                "bps": rj["bps"],
                "payload_bps": rj["bps"],
                "pps": None,
                "seconds": rj["seconds"],
                "bytes": rj["bytes"],
                "send_bytes": sj["bytes"],
                # each process's CPU over the bytes it moved: the receiver's window, the
                # sender's whole loop
                "send_cpu_s_per_gib": _per_gib(sj.get("cpu_seconds"), sj["bytes"]),
                "recv_cpu_s_per_gib": _per_gib(rj.get("cpu_seconds"), rj["bytes"]),
            }
        if kind == "raw" and rj.get("first_size") != size:
            raise MRCError(
                f"raw receiver got {rj.get('first_size')}-byte datagrams, expected {size}"
            )
        return {
            "pps": rj["pps"],
            "bps": rj["bps"],
            "payload_bps": rj["pps"] * payload * 8,
            "received": rj["received"],
            "seconds": rj["seconds"],
            "rcvbuf_errors": rj["rcvbuf_errors"],
            "stopped_early": rj["stopped_early"],
            "sender_pps": sj["pps"],
            "sender_bps": sj["bps"],
            "sent": sj["sent"],
            "send_errors": sj["send_errors"],
        }

    def quic_run(self, hosts: TwoHosts, payload: int) -> dict[str, Any]:
        """One aioquic stream of --size bytes from A to B on the first link, in datagrams of
        MRC's size (as far as the MTU allows); a run counts only if the receiver hashed what
        the sender sent."""
        a = self.args
        dgram = max(1200, min(payload + DATA_HDR_LEN, a.mtu - IPV6_UDP))
        wait = 60 + a.size / 2e6
        common = ["--port", str(QUIC_PORT), "--dgram", str(dgram)]
        recv_argv = [*QUIC_PEER, "recv", *common, "--wait", str(wait)]
        send_argv = [*QUIC_PEER, "send", *common, "--to", hosts.b_addrs[0], "--size", str(a.size)]
        with Children() as kids:
            recv = kids.start(hosts.exec_argv("b", recv_argv), "aioquic receiver")
            try:
                recv.expect("ready", 30)
            except MRCError:
                recv.finished(5)
                raise MRCError(
                    f"aioquic receiver did not start: {last_line(recv.stderr)}"
                ) from None
            send = kids.start(hosts.exec_argv("a", send_argv), "aioquic sender")
            if not send.finished(wait + 30) or not recv.finished(15):
                raise MRCError("aioquic run timed out")
        sj, rj = send.result(), recv.result()
        if rj is None or "error" in rj:
            why = (rj or {}).get("error") or last_line(recv.stderr) or f"exit {recv.returncode}"
            raise MRCError(f"aioquic receiver failed: {why} (sender: {last_line(send.stderr)})")
        if sj is None or send.returncode != 0:
            raise MRCError(f"aioquic sender failed: {last_line(send.stderr) or send.returncode}")
        if rj["bytes"] != a.size or rj["digest"] != sj["digest"]:
            raise MRCError(
                f"aioquic receiver got {rj['bytes']} of {a.size} bytes, hash "
                f"{rj['digest'][:16]} against the sender's {sj['digest'][:16]}"
            )
        gib = rj["bytes"] / (1 << 30)
        return {
            "bytes": rj["bytes"],
            "bps": rj["bps"],
            "payload_bps": rj["bps"],
            "pps": None,
            "seconds": rj["seconds"],
            "datagram_bytes": dgram,
            "digest": rj["digest"],
            "send_seconds": sj["seconds"],
            "send_cpu_s_per_gib": sj["cpu_seconds"] / gib if gib else None,
            "recv_cpu_s_per_gib": rj["cpu_seconds"] / gib if gib else None,
        }

    # ---- one topology ----------------------------------------------------------------

    def warm_up(self, hosts: TwoHosts) -> None:
        """Neighbour discovery on every plane, both ways, plus the tools' first start."""
        t0 = time.monotonic()
        self.mrc_run(hosts, self.args.payloads[0], 1 << 20)
        self.log(
            f"  warm-up (1 MiB MRC transfer over {hosts.links} plane(s)): "
            f"{time.monotonic() - t0:.1f} s"
        )

    def topology(self, links: int) -> list[dict[str, Any]]:
        from mrc.lab.testbed import leftover_namespaces

        a = self.args
        prefix = f"bq{os.getpid()}l{links}"
        configs = _configs(a)
        base = next(iter(configs))
        kinds = list(configs) + list(a.compare)
        results: dict[int, dict[str, list[Any]]] = {
            p: {x: [] for k in kinds for x in (k, f"{k}_errors")} for p in a.payloads
        }
        try:
            with TwoHosts(prefix, links=links, mtu=a.mtu) as hosts:
                self.log(f"links={links}: namespaces {hosts.a} / {hosts.b}, MTU {a.mtu}")
                self.warm_up(hosts)
                for run in range(a.runs):
                    for p in a.payloads:
                        # interleaved, and each kind leads in turn: drift hits all alike
                        shift = run % len(kinds)
                        for kind in kinds[shift:] + kinds[:shift]:
                            r = results[p]
                            try:
                                if kind in PEER_KINDS:
                                    r[kind].append(self.peer_run(hosts, p, kind))
                                else:
                                    mode, check = configs[kind]
                                    first = run == 0 and kind == base
                                    r[kind].append(
                                        self.mrc_run(
                                            hosts, p, a.size, first, security=mode, checksum=check
                                        )
                                    )
                            except MRCError as exc:
                                r[f"{kind}_errors"].append(str(exc))
                                self.log(f"  run {run + 1} {kind} P={p}: FAILED: {exc}")
                        self._log_run(run, links, p, results[p])
        finally:
            left = leftover_namespaces(prefix)
            if left:
                self.log(f"warning: namespaces left behind: {', '.join(left)}")
        return [self._summarise(links, p, results[p]) for p in a.payloads]

    def _log_run(self, run: int, links: int, p: int, r: dict[str, list[Any]]) -> None:
        check = _first_checksum(self.args)
        base = _mrc_kind(self.args.security[0], check)
        m = r[base][-1] if r[base] and len(r[base]) + len(r[f"{base}_errors"]) == run + 1 else None
        ms = (
            f"mrc {m['goodput_bps'] / 1e9:.2f} Gbit/s {m['pps'] / 1e3:.1f}k pps "
            f"{m['retransmits']} rtx"
            if m
            else "mrc failed"
        )
        ws = ""
        for kind in self.args.compare:
            got = r[kind]
            w = got[-1] if got and len(got) + len(r[f"{kind}_errors"]) == run + 1 else None
            ws += f" | {kind} " + (f"{w['payload_bps'] / 1e9:.2f} Gbit/s" if w else "failed")
        keyed = ""
        for mode in self.args.security:
            kind = _mrc_kind(mode, check)
            runs = r.get(kind, [])
            if mode != "none" and runs and len(runs) + len(r[f"{kind}_errors"]) == run + 1:
                keyed += f" | {mode} {runs[-1]['goodput_bps'] / 1e9:.2f} Gbit/s"
        for name in (self.args.checksum or [])[1:]:
            kind = _mrc_kind(self.args.security[0], name)
            runs = r.get(kind, [])
            if runs and len(runs) + len(r[f"{kind}_errors"]) == run + 1:
                keyed += f" | {name} {runs[-1]['goodput_bps'] / 1e9:.2f} Gbit/s"
        self.log(f"  run {run + 1}/{self.args.runs} links={links} P={p}: {ms}{keyed}{ws}")

    def _summarise(self, links: int, p: int, r: dict[str, list[Any]]) -> dict[str, Any]:
        a = self.args
        check = _first_checksum(a)
        base = _mrc_kind(a.security[0], check)
        mrc_runs = r[base]
        security: dict[str, Any] = {}
        plain = median([x["goodput_bps"] for x in r.get(_mrc_kind("none", check), [])])
        for mode in self.args.security:
            kind = _mrc_kind(mode, check)
            runs = r[kind]
            goodput = median([x["goodput_bps"] for x in runs])
            security[mode] = {
                "goodput_bps_median": goodput,
                "pps_median": median([x["pps"] for x in runs]),
                "goodput_bps": [x["goodput_bps"] for x in runs],
                "retransmits": [x["retransmits"] for x in runs],
                # goodput lost against the run without a key, medians of the same runs
                "cost_vs_none": round(1 - goodput / plain, 3) if goodput and plain else None,
                "all_ok": all(x["ok"] for x in runs) and not r[f"{kind}_errors"],
                "errors": r[f"{kind}_errors"],
                **({"runs": runs} if mode != self.args.security[0] else {}),
            }
        mrc: dict[str, Any] = {
            # what the runs were verified with: as asked, or what mrc's default came to
            "checksum": check or _reported_checksum(mrc_runs),
            "goodput_bps_median": median([x["goodput_bps"] for x in mrc_runs]),
            "pps_median": median([x["pps"] for x in mrc_runs]),
            "retransmits_median": median([x["retransmits"] for x in mrc_runs]),
            "send_cpu_s_per_gib_median": median(
                [x["send_cpu_s_per_gib"] for x in mrc_runs if x.get("send_cpu_s_per_gib")]
            ),
            "recv_cpu_s_per_gib_median": median(
                [x["recv_cpu_s_per_gib"] for x in mrc_runs if x.get("recv_cpu_s_per_gib")]
            ),
            "goodput_bps": [x["goodput_bps"] for x in mrc_runs],
            "pps": [round(x["pps"]) for x in mrc_runs],
            "retransmits": [x["retransmits"] for x in mrc_runs],
            "all_ok": all(x["ok"] for x in mrc_runs) and not r[f"{base}_errors"],
            "runs": mrc_runs,
            "errors": r[f"{base}_errors"],
        }
        refs = {kind: _peer_summary(p, r[kind], r[f"{kind}_errors"]) for kind in self.args.compare}
        for kind in ("tcp", "aioquic"):  # the references that say their CPU per GiB
            if kind in refs:
                for side in ("send", "recv"):
                    key = f"{side}_cpu_s_per_gib"
                    refs[kind][f"{key}_median"] = _median_of(r[kind], key)
        goodput = mrc["goodput_bps_median"]
        ratios: dict[str, float | None] = {}
        for kind, ref in refs.items():
            # MRC goodput against the reference's payload rate (what it moved of the same data)
            ratios[f"mrc_vs_{kind}"] = (
                round(goodput / ref["payload_bps_median"], 3)
                if goodput and ref["payload_bps_median"]
                else None
            )
        if "tcp" in refs:  # issue 38's aim: both ends' CPU per GiB <= 3x TCP's
            ratios["mrc_cpu_vs_tcp"] = cpu_vs(mrc, refs["tcp"])
        aim = None
        if mrc["goodput_bps_median"] is not None:
            aim = round(mrc["goodput_bps_median"] / AIM_BPS, 3)
        row = {
            "links": links,
            "payload": p,
            "mrc": mrc,
            **{PEER_KEYS[kind]: ref for kind, ref in refs.items()},
            **ratios,
            "mrc_goodput_vs_1gbit": aim,
            "security": security,
        }
        if a.checksum:
            kinds = {name: _mrc_kind(a.security[0], name) for name in a.checksum}
            row["checksum"] = checksum_summary(
                {name: r[kind] for name, kind in kinds.items()},
                {name: r[f"{kind}_errors"] for name, kind in kinds.items()},
            )
        return row


def _peer_summary(payload: int, runs: list[dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    return {
        "datagram_bytes": payload + DATA_HDR_LEN,
        "pps_median": median([x["pps"] for x in runs if x["pps"] is not None]),
        "bps_median": median([x["bps"] for x in runs]),
        "payload_bps_median": median([x["payload_bps"] for x in runs]),
        "payload_bps": [round(x["payload_bps"]) for x in runs],
        "runs": runs,
        "errors": errors,
    }


def checksum_summary(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], errors: Mapping[str, list[str]]
) -> dict[str, Any]:
    """Per checksum (``runs`` and ``errors`` by name, in --checksum's order), its MRC runs'
    medians, the CPU each side spent per GiB, and what it costs against the first listed:
    ``cost_vs_first`` the fraction of goodput lost, ``*_cpu_s_per_gib_vs_first`` the CPU
    seconds per GiB more (less, if negative) on that side. Every run is under ``runs``, but the
    first checksum's, which are mrc's own (``mrc.runs``)."""
    out: dict[str, Any] = {}
    firsts: dict[str, float | None] = {}
    for i, (name, got) in enumerate(runs.items()):
        goodput = _median_of(got, "goodput_bps")
        cpu = {side: _median_of(got, f"{side}_cpu_s_per_gib") for side in ("send", "recv")}
        if i == 0:
            firsts = {"goodput": goodput, **cpu}
        out[name] = {
            "goodput_bps_median": goodput,
            "pps_median": _median_of(got, "pps"),
            **{f"{side}_cpu_s_per_gib_median": v for side, v in cpu.items()},
            "goodput_bps": [x["goodput_bps"] for x in got],
            "retransmits": [x["retransmits"] for x in got],
            # goodput lost against the first checksum, medians of the same runs
            "cost_vs_first": round(1 - goodput / firsts["goodput"], 3)
            if goodput and firsts["goodput"]
            else None,
            **{f"{side}_cpu_s_per_gib_vs_first": _less(v, firsts[side]) for side, v in cpu.items()},
            "all_ok": all(x["ok"] for x in got) and not errors[name],
            "errors": errors[name],
            **({"runs": list(got)} if i else {}),
        }
    return out


def cpu_vs(mine: Mapping[str, Any], ref: Mapping[str, Any]) -> float | None:
    """``mine``'s CPU seconds per GiB, sender's and receiver's medians added, over ``ref``'s,
    rounded to 3; None if any of the four is missing (or ``ref``'s add up to nothing)."""
    keys = ("send_cpu_s_per_gib_median", "recv_cpu_s_per_gib_median")
    got: list[float] = [v for side in (mine, ref) for k in keys if (v := side.get(k)) is not None]
    if len(got) < 4:
        return None
    mine_total, ref_total = got[0] + got[1], got[2] + got[3]
    return round(mine_total / ref_total, 3) if ref_total > 0 else None


def _per_gib(cpu: float | None, nbytes: int) -> float | None:
    """CPU seconds per GiB of ``nbytes`` (None: no CPU figure, or no bytes)."""
    return cpu / (nbytes / (1 << 30)) if cpu is not None and nbytes else None


def _median_of(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the runs that have it (None: a run that could not tell)."""
    return median([x[key] for x in runs if x.get(key) is not None])


def _less(x: float | None, than: float | None) -> float | None:
    return round(x - than, 3) if x is not None and than is not None else None


def _first_checksum(a: argparse.Namespace) -> str | None:
    """The checksum of the runs reported under mrc (None: none asked for, mrc's default)."""
    return a.checksum[0] if a.checksum else None


def _reported_checksum(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """The one checksum ``runs`` say they were verified with; None with no run (or several)."""
    names = {x.get("checksum") for x in runs}
    return names.pop() if len(names) == 1 else None


def _configs(a: argparse.Namespace) -> dict[str, tuple[str, str | None]]:
    """Every MRC configuration to run, by its results key: (security mode, checksum), each
    --security mode with each --checksum (at most one of them lists several), the first the
    one reported under mrc."""
    checks: list[str | None] = list(a.checksum) if a.checksum else [None]
    return {_mrc_kind(m, c): (m, c) for m in a.security for c in checks}


def _mrc_kind(mode: str, checksum: str | None = None) -> str:
    """The results key of MRC runs with ``mode`` ("mrc" for no key) and ``checksum`` (None:
    none asked for)."""
    kind = "mrc" if mode == "none" else f"mrc_{mode}"
    return kind if checksum is None else f"{kind}@{checksum}"


def main(a: argparse.Namespace) -> int:
    """Run the benchmark as ``a`` (tools/bench_qp.py's arguments) says and print its JSON and
    table; 1 if any run failed."""
    from mrc.lab.testbed import netns_available

    why = netns_available()
    if why is not None:
        raise MRCError(why)

    quiet = a.json

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    unwind_on_sigterm()  # the namespace clean-up in TwoHosts.__exit__ runs on SIGTERM too
    started = time.monotonic()
    load_start = loadavg()
    first_touch_start = first_touch_us_per_page()
    bench = Bench(a, log)
    config = {
        "size": a.size,
        "payloads": a.payloads,
        "links": a.links,
        "runs": a.runs,
        "duration": a.duration,
        "mtu": a.mtu,
        "evs": a.evs or "mrc-send default (128)",
        "window": a.window or "mrc-send default (512)",
        "qp": a.qp,
        "raw_datagram": f"payload + {DATA_HDR_LEN} bytes",
        "quick": a.quick,
        "aim_bps": AIM_BPS,
        "security": a.security,
        # --checksum, the first the one reported under mrc; null: none asked for (mrc's default)
        "checksum": a.checksum,
        "compare": a.compare,
    }
    memory: dict[str, Any] = {"first_touch_us_per_page_start": first_touch_start}
    if not a.no_mem_warmup:
        memory["memory_warmup"] = warmed = warm_memory(a.size)
        log(f"memory warm-up: touched {warmed['bytes'] >> 20} MiB in {warmed['seconds']:.2f} s")
    results: list[dict[str, Any]] = []
    try:
        for links in a.links:
            results += bench.topology(links)
    finally:
        bench.close()
    memory["first_touch_us_per_page_end"] = first_touch_us_per_page()
    out = envelope(
        TOOL,
        {**machine_info(load_start), **memory},
        {
            "config": config,
            "results": results,
            "elapsed_seconds": round(time.monotonic() - started, 1),
        },
    )
    if a.table:
        print(table(out))
    else:
        emit_json(out, indent=2)
        if not a.json:
            print(table(out), file=sys.stderr)
    failed = any(
        r["mrc"]["errors"]
        or any(r[PEER_KEYS[k]]["errors"] for k in a.compare)
        or any(v["errors"] for v in r["security"].values())
        or any(v["errors"] for v in r.get("checksum", {}).values())
        for r in results
    )
    return 1 if failed else 0
