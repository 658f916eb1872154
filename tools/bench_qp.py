#!/usr/bin/env python3
"""Benchmark one MRC queue pair against the machine's own limits on the same veth path.

Two network namespaces (mrc.lab.testbed.TwoHosts) are joined by ``--links`` veth links (one plane
each, MTU 9000 by default). For every payload size and every run it measures, side by side and
interleaved (each kind leads in turn, so drift hits all alike):

* **mrc**: ``mrc-recv --discard --json`` in B, ``mrc-send --size S --payload P --json`` from A
  (one QP sprayed over all planes): goodput, packets/s, retransmits. ``--burst K`` passes
  mrc-send's GSO bursts on; ``--security none,integrity,encrypt`` adds runs with a pre-shared
  key (and ``--encrypt``) and reports what each costs against the run without one.
* the references of tools/bench_peers.py (``--compare``, default all), P+28-byte datagrams,
  the size of an MRC data datagram: **raw** a Python loop of one ``send`` / ``recv_into`` per
  datagram; **gso** the same datagrams sent 7 (or up to 64) per ``sendmsg`` with UDP_SEGMENT
  and received as GRO trains, the kernel's batched limit; **tcp** kernel TCP over the first
  link, 1 MiB per ``send``. Each runs ``--duration`` s at the receiver and reports the payload
  rate it moved, and MRC goodput is shown as a fraction of each.

Output: JSON on stdout, a human table on stderr (``--json``: JSON only; ``--table``: the table
on stdout instead of JSON). Needs root. Examples::

    sudo .venv/bin/python tools/bench_qp.py                     # 256M, P=8192, 1 link, 3 runs
    sudo .venv/bin/python tools/bench_qp.py --burst 8           # MRC with GSO bursts of 8
    sudo .venv/bin/python tools/bench_qp.py --links 1,2 --payloads 1400,8192 --mtu 1500
    sudo .venv/bin/python tools/bench_qp.py --quick             # < 20 s smoke run
    sudo .venv/bin/python tools/bench_qp.py --security none,integrity,encrypt --compare raw
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROG = "bench_qp.py"
try:
    from mrc.cli.common import (
        Parser,
        emit_json,
        float_between,
        positive_int,
        run_main,
        size_arg,
    )
    from mrc.errors import MRCError
    from mrc.units import SIZE_HELP
    from mrc.wire import DATA_HDR_LEN, DATA_IMM_HDR_LEN, DEFAULT_PORT
except ImportError as exc:  # a python without mrc installed: say so in one line
    sys.exit(f"{PROG}: error: cannot import mrc ({exc}); run with the venv's python")

MRC_PORT = DEFAULT_PORT
BLAST_PORT = 5001
IPV6_UDP = 48  # IPv6 + UDP headers
AIM_BPS = 1e9
BLAST_LEAD = 0.5  # the sender keeps going this long past the receiver's window
SECURITY_MODES = ("none", "integrity", "encrypt")


# ---- raw UDP helper processes (run inside a namespace) ----------------------------------


# ---- orchestration -----------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _stop(proc: subprocess.Popen[str] | None) -> None:
    """Kill one child we started (by its own pid), and reap it."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise MRCError(
            f"{name} not found next to {sys.executable} or on PATH (pip install -e . in the venv)"
        )
    return found


class Bench:
    def __init__(self, args: argparse.Namespace, log: Any) -> None:
        self.args = args
        self.log = log
        self.mrc_send = _tool("mrc-send")
        self.mrc_recv = _tool("mrc-recv")
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

    def _wait_listening(self, hosts: Any, proc: subprocess.Popen[str], port: int) -> None:
        deadline = time.monotonic() + 15
        argv = hosts.exec_argv("b", ["ss", "-Hltn", f"sport = :{port}"])
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return  # it died; the caller reports its stderr
            res = subprocess.run(argv, capture_output=True, text=True)
            if res.stdout.strip():
                return
            time.sleep(0.02)
        raise MRCError(f"mrc-recv did not listen on port {port} within 15 s")

    def mrc_run(
        self, hosts: Any, payload: int, size: int, profile: bool = False, security: str = "none"
    ) -> dict[str, Any]:
        a = self.args
        n = hosts.links
        keys = self._key_args(security)
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
        timeout = 60 + size / 2e6  # a 256M transfer gets > 3 minutes even at 16 Mbit/s
        recv = send = None
        spies: list[subprocess.Popen[bytes]] = []
        t0 = time.monotonic()
        try:
            recv = subprocess.Popen(
                hosts.exec_argv("b", recv_argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self._wait_listening(hosts, recv, MRC_PORT)
            send = subprocess.Popen(
                hosts.exec_argv("a", send_argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            if profile and a.profile:
                spies = self._profile(send, recv, f"l{hosts.links}-p{payload}")
            try:
                s_out, s_err = send.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise MRCError(f"MRC run timed out after {timeout:.0f} s") from None
            try:  # a receiver whose sender failed may wait a long time: don't
                r_out, r_err = recv.communicate(timeout=30 if send.returncode == 0 else 3)
            except subprocess.TimeoutExpired:
                _stop(recv)
                r_out, r_err = recv.communicate()
        finally:
            _stop(send)
            _stop(recv)
            for spy in spies:  # they exit with their target; reap them
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(10)
                _stop(spy)
        wall = time.monotonic() - t0
        sj, rj = _last_json(s_out), _last_json(r_out)
        if sj is None or send.returncode != 0:
            why = (sj or {}).get("error") or _tail(s_err) or f"exit {send.returncode}"
            raise MRCError(f"mrc-send failed: {why} (mrc-recv: {_tail(r_err) or 'no error'})")
        seconds = float(sj["seconds"])
        run: dict[str, Any] = {
            "ok": bool(sj.get("ok")) and bool(rj and rj.get("ok")),
            "security": sj.get("security", "none"),
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

    def _profile(
        self, send: subprocess.Popen[str], recv: subprocess.Popen[str], tag: str
    ) -> list[subprocess.Popen[bytes]]:
        """py-spy record both ends of the first MRC run (``--profile DIR``)."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            raise MRCError("--profile needs py-spy (pip install py-spy into the venv)")
        out = Path(self.args.profile)
        out.mkdir(parents=True, exist_ok=True)
        return [
            subprocess.Popen(
                [
                    spy,
                    "record",
                    "--nonblocking",
                    "--idle",
                    "-r",
                    "250",
                    "-f",
                    "raw",
                    "-o",
                    str(out / f"{name}-{tag}.txt"),
                    "--pid",
                    str(proc.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name, proc in (("send", send), ("recv", recv))
        ]

    # ---- raw UDP ---------------------------------------------------------------------

    def peer_run(self, hosts: Any, payload: int, kind: str) -> dict[str, Any]:
        """One run of a reference (tools/bench_peers.py): ``raw`` a datagram per send and
        receive, ``gso`` GSO sends and GRO receives of the same datagrams, ``tcp`` kernel TCP
        on the first link."""
        a = self.args
        n = hosts.links
        size = payload + DATA_HDR_LEN
        peers = [sys.executable, str(Path(__file__).resolve().parent / "bench_peers.py")]
        common = ["--port", str(BLAST_PORT)]
        if kind == "tcp":
            recv_argv = [*peers, "tcp-recv", *common, "--duration", str(a.duration)]
            send_argv = [*peers, "tcp-send", *common, "--duration", str(a.duration + BLAST_LEAD)]
            send_argv += ["--targets", f"{hosts.a_addrs[0]}/{hosts.b_addrs[0]}"]
        else:
            gso = min(64, 65000 // size) if kind == "gso" else 1
            recv_argv = [*peers, "udp-recv", *common, "--dgram", str(size)]
            recv_argv += ["--duration", str(a.duration)] + (["--gro"] if kind == "gso" else [])
            targets = ",".join(
                f"{la}/{rb}" for la, rb in zip(hosts.a_addrs[:n], hosts.b_addrs[:n], strict=True)
            )
            send_argv = [*peers, "udp-send", *common, "--dgram", str(size), "--targets", targets]
            send_argv += ["--duration", str(a.duration + BLAST_LEAD), "--window", str(a.duration)]
            send_argv += ["--gso", str(gso)]
        recv = send = None
        try:
            recv = subprocess.Popen(
                hosts.exec_argv("b", recv_argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert recv.stdout is not None
            if recv.stdout.readline().strip() != "ready":
                recv.wait(5)
                assert recv.stderr is not None
                raise MRCError(f"{kind} receiver did not start: {_tail(recv.stderr.read())}")
            send = subprocess.Popen(
                hosts.exec_argv("a", send_argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                s_out, s_err = send.communicate(timeout=a.duration + 30)
                r_out, r_err = recv.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                raise MRCError(f"{kind} run timed out") from None
        finally:
            _stop(send)
            _stop(recv)
        sj, rj = _last_json(s_out), _last_json(r_out)
        if rj is None or "error" in rj:
            why = (rj or {}).get("error") or _tail(r_err) or f"exit {recv.returncode}"
            raise MRCError(f"{kind} receiver failed: {why} (sender: {_tail(s_err) or 'ok'})")
        if sj is None:
            raise MRCError(f"{kind} sender failed: {_tail(s_err) or f'exit {send.returncode}'}")
        if kind == "tcp":
            return {
                "bps": rj["bps"],
                "payload_bps": rj["bps"],
                "pps": None,
                "seconds": rj["seconds"],
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

    # ---- one topology ----------------------------------------------------------------

    def warm_up(self, hosts: Any) -> None:
        """Neighbour discovery on every plane, both ways, plus the tools' first start."""
        t0 = time.monotonic()
        self.mrc_run(hosts, self.args.payloads[0], 1 << 20)
        self.log(
            f"  warm-up (1 MiB MRC transfer over {hosts.links} plane(s)): "
            f"{time.monotonic() - t0:.1f} s"
        )

    def topology(self, links: int) -> list[dict[str, Any]]:
        from mrc.lab.testbed import TwoHosts, leftover_namespaces

        a = self.args
        prefix = f"bq{os.getpid()}l{links}"
        kinds = [_mrc_kind(m) for m in a.security] + list(a.compare)
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
                                    mode = _mode_of(kind)
                                    first = run == 0 and mode == a.security[0]
                                    r[kind].append(
                                        self.mrc_run(hosts, p, a.size, first, security=mode)
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
        base = _mrc_kind(self.args.security[0])
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
            runs = r.get(_mrc_kind(mode), [])
            if (
                mode != "none"
                and runs
                and len(runs) + len(r[f"{_mrc_kind(mode)}_errors"]) == run + 1
            ):
                keyed += f" | {mode} {runs[-1]['goodput_bps'] / 1e9:.2f} Gbit/s"
        self.log(f"  run {run + 1}/{self.args.runs} links={links} P={p}: {ms}{keyed}{ws}")

    def _summarise(self, links: int, p: int, r: dict[str, list[Any]]) -> dict[str, Any]:
        base = _mrc_kind(self.args.security[0])
        mrc_runs = r[base]
        security: dict[str, Any] = {}
        plain = _median([x["goodput_bps"] for x in r.get("mrc", [])])
        for mode in self.args.security:
            runs = r[_mrc_kind(mode)]
            goodput = _median([x["goodput_bps"] for x in runs])
            security[mode] = {
                "goodput_bps_median": goodput,
                "pps_median": _median([x["pps"] for x in runs]),
                "goodput_bps": [x["goodput_bps"] for x in runs],
                "retransmits": [x["retransmits"] for x in runs],
                # goodput lost against the run without a key, medians of the same runs
                "cost_vs_none": round(1 - goodput / plain, 3) if goodput and plain else None,
                "all_ok": all(x["ok"] for x in runs) and not r[f"{_mrc_kind(mode)}_errors"],
                "errors": r[f"{_mrc_kind(mode)}_errors"],
                **({"runs": runs} if mode != self.args.security[0] else {}),
            }
        mrc = {
            "goodput_bps_median": _median([x["goodput_bps"] for x in mrc_runs]),
            "pps_median": _median([x["pps"] for x in mrc_runs]),
            "retransmits_median": _median([x["retransmits"] for x in mrc_runs]),
            "send_cpu_s_per_gib_median": _median(
                [x["send_cpu_s_per_gib"] for x in mrc_runs if x.get("send_cpu_s_per_gib")]
            ),
            "recv_cpu_s_per_gib_median": _median(
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
        goodput = mrc["goodput_bps_median"]
        ratios: dict[str, float | None] = {}
        for kind, ref in refs.items():
            # MRC goodput against the reference's payload rate (what it moved of the same data)
            ratios[f"mrc_vs_{kind}"] = (
                round(goodput / ref["payload_bps_median"], 3)
                if goodput and ref["payload_bps_median"]
                else None
            )
        aim = None
        if mrc["goodput_bps_median"] is not None:
            aim = round(mrc["goodput_bps_median"] / AIM_BPS, 3)
        return {
            "links": links,
            "payload": p,
            "mrc": mrc,
            **{PEER_KEYS[kind]: ref for kind, ref in refs.items()},
            **ratios,
            "mrc_goodput_vs_1gbit": aim,
            "security": security,
        }


PEER_KINDS = ("raw", "gso", "tcp")
PEER_KEYS = {"raw": "raw_udp", "gso": "gso_udp", "tcp": "tcp"}
PEER_HELP = {
    "raw": "a Python loop of one send/recv per datagram",
    "gso": "GSO sends and GRO receives of the same datagrams",
    "tcp": "kernel TCP, 1 MiB per send, on the first link",
}


def _peer_summary(payload: int, runs: list[dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    return {
        "datagram_bytes": payload + DATA_HDR_LEN,
        "pps_median": _median([x["pps"] for x in runs if x["pps"] is not None]),
        "bps_median": _median([x["bps"] for x in runs]),
        "payload_bps_median": _median([x["payload_bps"] for x in runs]),
        "payload_bps": [round(x["payload_bps"]) for x in runs],
        "runs": runs,
        "errors": errors,
    }


def _mrc_kind(mode: str) -> str:
    """The results key of MRC runs with ``mode`` ("mrc" for no key, as before keys existed)."""
    return "mrc" if mode == "none" else f"mrc_{mode}"


def _mode_of(kind: str) -> str:
    return "none" if kind == "mrc" else kind.removeprefix("mrc_")


def first_touch_us_per_page(mib: int = 64) -> float:
    """Microseconds to fault in one fresh 4 KiB page of anonymous memory (mrc-recv --discard
    writes every packet into fresh memory, so this cost is on its per-packet path)."""
    m = mmap.mmap(-1, mib << 20)
    try:
        t = time.perf_counter()
        for off in range(0, len(m), 4096):
            m[off] = 1
        return round((time.perf_counter() - t) / (len(m) // 4096) * 1e6, 3)
    finally:
        m.close()


def _mem_available() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 30


def warm_memory(size: int) -> dict[str, Any]:
    """Touch and free ``4 * size`` bytes (capped) before measuring.

    Both tools put every byte of a transfer in fresh memory (the sender's generated data, the
    receiver's region). On a VM, guest pages never touched before cost several times more to
    fault in than recycled ones, so without this the first runs are slower than later ones.
    """
    n = min(4 * size, 4 << 30, _mem_available() // 4)
    n -= n % 4096
    if n <= 0:
        return {"bytes": 0, "seconds": 0.0}
    t = time.perf_counter()
    m = mmap.mmap(-1, n)
    try:
        for off in range(0, n, 4096):
            m[off] = 1
    finally:
        m.close()
    return {"bytes": n, "seconds": round(time.perf_counter() - t, 3)}


def _machine() -> dict[str, Any]:
    try:
        from mrc.transport.loop import loop_name

        loop = loop_name()
    except ImportError:
        loop = "unknown"
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    commit = None
    here = Path(__file__).resolve().parent.parent
    with contextlib.suppress(OSError):
        res = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        if res.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "mrc"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            commit = res.stdout.strip() + ("-dirty" if dirty else "")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loop": loop,
        "loadavg_start": os.getloadavg(),
        "first_touch_us_per_page_start": first_touch_us_per_page(),
        "mrc_commit": commit,
    }


def _table(out: dict[str, Any]) -> str:
    compare = out["config"]["compare"]
    head = f"{'links':>5} {'payload':>7} | {'MRC Gbit/s':>10} {'MRC kpps':>8} {'rtx':>5}"
    head += f" {'CPU s/GiB snd/rcv':>17}"
    for kind in compare:
        head += f" | {kind + ' Gbit/s':>11} {'MRC/' + kind:>8}"
    lines = [head, "-" * len(head)]

    def f(v: float | None, scale: float, fmt: str) -> str:
        return "-" if v is None else format(v / scale, fmt)

    for r in out["results"]:
        m = r["mrc"]
        line = (
            f"{r['links']:>5} {r['payload']:>7} | {f(m['goodput_bps_median'], 1e9, '10.3f')} "
            f"{f(m['pps_median'], 1e3, '8.1f')} {f(m['retransmits_median'], 1, '5.0f')} "
            f"{f(m['send_cpu_s_per_gib_median'], 1, '8.2f')}/"
            f"{f(m['recv_cpu_s_per_gib_median'], 1, '<8.2f')}"
        )
        for kind in compare:
            ref = r[PEER_KEYS[kind]]
            line += (
                f" | {f(ref['payload_bps_median'], 1e9, '11.3f')} "
                f"{f(r['mrc_vs_' + kind], 1, '8.3f')}"
            )
        lines.append(line)
    keyed = [
        (r, mode, v)
        for r in out["results"]
        for mode, v in r["security"].items()
        if len(r["security"]) > 1
    ]
    if keyed:
        lines.append("")
        lines.append(f"{'links':>5} {'payload':>7} | {'security':>9} {'Gbit/s':>8} {'cost':>6}")
        for r, mode, v in keyed:
            cost = "-" if v["cost_vs_none"] is None else f"{v['cost_vs_none'] * 100:5.1f}%"
            lines.append(
                f"{r['links']:>5} {r['payload']:>7} | {mode:>9} "
                f"{f(v['goodput_bps_median'], 1e9, '8.3f')} {cost:>6}"
            )
    c = out["config"]
    lines.append(
        f"(medians of {c['runs']} run(s), interleaved; MRC {c['size']} bytes per transfer; "
        f"references {c['duration']:g} s each, in payload Gbit/s: "
        + "; ".join(f"{k} = {PEER_HELP[k]}" for k in compare)
        + f"; loop {out['machine']['loop']})"
    )
    return "\n".join(lines)


# ---- arguments ---------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"need positive numbers, got {text!r}")
    return list(dict.fromkeys(values))


def _peer_kinds(text: str) -> list[str]:
    kinds = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [k for k in kinds if k not in PEER_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"references are {', '.join(PEER_KINDS)}; not {', '.join(bad)}"
        )
    return kinds


def _modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [m for m in modes if m not in SECURITY_MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(
            f"security modes are {', '.join(SECURITY_MODES)}; not {', '.join(bad) or text!r}"
        )
    return modes


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Benchmark one MRC QP (mrc-send -> mrc-recv) against a raw Python UDP "
        "blast of the same datagram size between two namespaces joined by veth links. JSON on "
        "stdout, a table on stderr. Needs root.",
    )
    p.add_argument(
        "--size",
        type=size_arg,
        default=None,
        help=f"bytes per MRC transfer (default 256M; --quick 32M; {SIZE_HELP})",
    )
    p.add_argument(
        "--payloads",
        type=_int_list,
        default=None,
        metavar="P[,P...]",
        help="MRC payload bytes per packet (default 8192); the raw blast sends "
        f"P+{DATA_HDR_LEN}-byte datagrams",
    )
    p.add_argument("--payload", dest="payloads", type=_int_list, help=argparse.SUPPRESS)
    p.add_argument(
        "--links",
        type=_int_list,
        default=None,
        metavar="N[,N...]",
        help="veth links (planes) between the hosts; a list runs each (default 1)",
    )
    p.add_argument(
        "--runs",
        type=positive_int,
        default=None,
        help="repetitions of each measurement, interleaved (default 3; --quick 1)",
    )
    p.add_argument(
        "--duration",
        type=float_between(0, 600, " s"),
        default=None,
        metavar="SECONDS",
        help="length of each raw UDP blast at the receiver (default 2; --quick 1)",
    )
    p.add_argument("--mtu", type=int, default=9000, help="veth MTU (default 9000)")
    p.add_argument(
        "--compare",
        type=_peer_kinds,
        default=list(PEER_KINDS),
        metavar="KIND[,KIND...]",
        help="references run beside MRC, interleaved: raw (a Python loop of one datagram "
        "per send/recv), gso (GSO sends, GRO receives), tcp (kernel TCP); default all",
    )
    p.add_argument(
        "--security",
        type=_modes,
        default=["none"],
        metavar="MODE[,MODE...]",
        help="MRC runs without a key (none), with one (integrity: mrc-send/mrc-recv "
        "--key-file) and encrypting (encrypt: also --encrypt), interleaved; the table adds "
        "each mode's goodput cost against none (default none)",
    )
    p.add_argument(
        "--evs",
        type=positive_int,
        default=None,
        help="mrc-send --evs (default: mrc-send's own, 128)",
    )
    p.add_argument(
        "--window",
        type=positive_int,
        default=None,
        help="mrc-send --window (default: mrc-send's own, 512)",
    )
    p.add_argument(
        "--burst",
        type=positive_int,
        default=None,
        help="mrc-send --burst: packets per EV burst, sent with UDP GSO (default: mrc-send's, 1)",
    )
    p.add_argument(
        "--no-mem-warmup",
        action="store_true",
        help="skip touching 4 x --size of fresh memory before measuring (on a VM "
        "the first touch of never-used guest memory is slow; both tools put every "
        "transfer in fresh memory)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes and one run (under 20 s)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON only (no table, no progress)")
    out.add_argument(
        "--table", action="store_true", help="print the human table on stdout instead of JSON"
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy record mrc-send and mrc-recv during the first MRC run of each "
        "topology into DIR (needs py-spy)",
    )
    return p


def _finish_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.size is None:
        a.size = (32 << 20) if a.quick else (256 << 20)
    if a.size < 1:
        p.error(f"--size must be at least 1 byte, not {a.size}")
    if a.payloads is None:
        a.payloads = [8192]
    if a.links is None:
        a.links = [1]
    if a.runs is None:
        a.runs = 1 if a.quick else 3
    if a.duration is None:
        a.duration = 1.0 if a.quick else 2.0
    if not 1280 <= a.mtu <= 65535:
        p.error(f"--mtu must be 1280..65535, not {a.mtu}")
    biggest = a.mtu - IPV6_UDP - DATA_IMM_HDR_LEN  # the last (zero-length) WRITE_IMM packet
    for pl in a.payloads:
        if pl > min(biggest, 65000):
            p.error(
                f"payload {pl} does not fit one datagram on MTU {a.mtu} "
                f"(at most {min(biggest, 65000)} bytes)"
            )
    if any(n > 16 for n in a.links):
        p.error("--links: at most 16")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    _finish_args(parser, a)
    return run_main(PROG, lambda: _main(a))


def _main(a: argparse.Namespace) -> int:
    from mrc.lab.testbed import netns_available

    why = netns_available()
    if why is not None:
        raise MRCError(why)

    quiet = a.json

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    # a SIGTERM must still run the namespace clean-up in TwoHosts.__exit__
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    bench = Bench(a, log)
    out: dict[str, Any] = {
        "machine": _machine(),
        "config": {
            "size": a.size,
            "payloads": a.payloads,
            "links": a.links,
            "runs": a.runs,
            "duration": a.duration,
            "mtu": a.mtu,
            "evs": a.evs or "mrc-send default (128)",
            "window": a.window or "mrc-send default (512)",
            "raw_datagram": f"payload + {DATA_HDR_LEN} bytes",
            "quick": a.quick,
            "aim_bps": AIM_BPS,
            "security": a.security,
            "compare": a.compare,
        },
        "results": [],
    }
    if not a.no_mem_warmup:
        out["machine"]["memory_warmup"] = warm_memory(a.size)
        log(
            f"memory warm-up: touched {out['machine']['memory_warmup']['bytes'] >> 20} MiB "
            f"in {out['machine']['memory_warmup']['seconds']:.2f} s"
        )
    try:
        for links in a.links:
            out["results"] += bench.topology(links)
    finally:
        bench.close()
    out["machine"]["loadavg_end"] = os.getloadavg()
    out["machine"]["first_touch_us_per_page_end"] = first_touch_us_per_page()
    out["elapsed_seconds"] = round(time.monotonic() - started, 1)
    if a.table:
        print(_table(out))
    else:
        emit_json(out, indent=2)
        if not a.json:
            print(_table(out), file=sys.stderr)
    failed = any(
        r["mrc"]["errors"]
        or any(r[PEER_KEYS[k]]["errors"] for k in a.compare)
        or any(v["errors"] for v in r["security"].values())
        for r in out["results"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
