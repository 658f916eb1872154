"""bench_manyqp: many queue pairs into one receiver on loopback, next to one QP moving the same
bytes.

One mrc-recv serving many QPs at once is the incast end of a collective: every stream's
packets, acknowledgements and hashing go through one process. This measures what N = K x P
concurrent QPs get together and how fairly they share it, and reads the aggregate against one
QP that moves the same N x S bytes on the same machine in the same run, so a figure says
"the receiver keeps up" (ratio near 1) or "it collapses under many streams" (well below 1)
whatever the machine's own speed. For every run, interleaved (each leads in turn, so drift on a
shared machine hits both alike):

* **many**: ``mrc-recv --listen [::1]:PORT --discard --count N --json`` and K processes of
  ``mrc-send --parallel P --size S --evs E --json``, all started at once;
* **one** (``--compare-one``, the default): the same receiver with ``--count 1`` and one
  ``mrc-send --size N*S``.

Each reports: streams completed ok, wall time (first sender started to last sender exited),
aggregate goodput (bytes of the ok streams x 8 / wall), per-stream seconds and rates, Jain's
fairness index over the stream rates, the senders' CPU, the kernel's UDP buffer drops (deltas
of /proc/net/snmp6), the senders' loss-recovery counters, the receiver's ACKs and duplicates,
its exit status and the first errors. A run that does not finish in 30 s + bytes at 5 MB/s is
stopped and reported as failed.

tools/bench_manyqp.py parses the arguments and calls :func:`main`.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError
from mrc.lab.harness.children import Child, Children, exit_times
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import unwind_on_sigterm
from mrc.lab.harness.hosts import tool_path, wait_listening
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.lab.harness.output import last_line
from mrc.lab.harness.stats import jain, median, medians, rounded
from mrc.lab.harness.table import line
from mrc.transport.sockets import udp6_counters
from mrc.units import human_bytes

TOOL = "bench_manyqp"
HOST = "::1"
#: the kernel's Udp6 counters whose deltas say loopback itself dropped datagrams
UDP6_DROPS = {"Udp6RcvbufErrors": "rcvbuf_errors", "Udp6SndbufErrors": "sndbuf_errors"}
#: the senders' per-stream counters summed over all streams of a phase
SENDER_COUNTERS = (
    "retransmits_timeout",
    "silent_timeouts",
    "retransmits_nack",
    "retransmits_tlp",
    "retransmits_sack",
    "evs_assumed_bad",
    "data_packets",
    "bursts",
)
RTX_KINDS = ("timeout", "nack", "tlp", "sack")  # the table's retransmission columns
#: the receiver's per-transfer counters summed over its JSON lines
RECEIVER_COUNTERS = ("acks_sent", "duplicates", "queue_marks")
#: the figures of a phase whose medians over the runs make the summary
SUMMARY_KEYS = (
    "streams_ok",
    "wall_seconds",
    "goodput_bps",
    "transfer_goodput_bps",
    "finish_min",
    "finish_median",
    "finish_max",
    "jain",
    "send_cpu_seconds",
    "recv_cpu_seconds",
    *UDP6_DROPS.values(),
    *SENDER_COUNTERS,
    *RECEIVER_COUNTERS,
)
#: places the summary's medians keep: one that prints 0.78784999 says more than it knows
SUMMARY_DIGITS = 6
LISTEN_WITHIN = 15.0  # seconds mrc-recv has to listen
RECV_GRACE = 10.0  # seconds mrc-recv has to report once every sender is done
RECV_GRACE_FAILED = 3.0  # once one failed: it would wait for streams that never come
SLOWEST_BPS = 5e6  # bytes/s the timeout allows: far below loopback, so only a stuck run hits it
MAX_ERRORS = 5

Log = Callable[[str], None]


def run_timeout(total_bytes: int) -> float:
    """Seconds a phase may take before it is stopped and failed: generous (30 s for start-up
    plus the bytes at 5 MB/s) so that a slow shared machine is measured, never a stuck run."""
    return 30.0 + total_bytes / SLOWEST_BPS


def free_port() -> int:
    """A port the kernel picks, free on ::1 for TCP and UDP both (mrc-recv takes both)."""
    for _ in range(20):
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as tcp:
            tcp.bind((HOST, 0))
            port: int = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((HOST, port))
                except OSError:
                    continue
        return port
    raise MRCError(f"no port free for both TCP and UDP on {HOST}")


def spread(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """Minimum, median and maximum (Nones when there are no values)."""
    if not values:
        return None, None, None
    return min(values), median(values), max(values)


@dataclass(frozen=True)
class Shape:
    """What one phase moves: ``procs`` mrc-send processes of ``parallel`` QPs, ``size`` bytes
    per QP."""

    procs: int
    parallel: int
    size: int

    @property
    def streams(self) -> int:
        return self.procs * self.parallel

    @property
    def total(self) -> int:
        return self.streams * self.size

    def fields(self) -> dict[str, int]:
        """The shape as a phase's JSON says it."""
        return {
            "procs": self.procs,
            "parallel": self.parallel,
            "streams": self.streams,
            "size": self.size,
        }

    @property
    def label(self) -> str:
        return "1 QP" if self.streams == 1 else f"{self.procs}x{self.parallel} QPs"


@dataclass(frozen=True)
class Ran:
    """The children of one phase once they are gone, and how they went."""

    recv: Child
    senders: list[Child]
    wall: float  # seconds from starting the senders until the last exited (or the timeout)
    done: bool  # every sender exited within the timeout
    recv_stopped: bool  # the receiver was still waiting for streams and had to be stopped


# ---- reading the children's JSON ---------------------------------------------------------------


def sender_streams(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The streams of one mrc-send's JSON: its ``streams`` list, or the object itself where a
    single QP reports no list."""
    streams = result.get("streams")
    return list(streams) if streams else [dict(result)]


def read_senders(senders: Sequence[Child]) -> tuple[list[dict[str, Any]], float, list[str]]:
    """Every stream of every sender, their CPU seconds and the errors (a sender that printed
    no JSON is one error: its last stderr line, or its exit status)."""
    streams: list[dict[str, Any]] = []
    cpu = 0.0
    errors: list[str] = []
    for s in senders:
        result = s.result()
        if result is None:
            errors.append(f"{s.label}: {last_words(s, 'mrc-send')}")
            continue
        cpu += float(result.get("cpu_seconds") or 0.0)
        for stream in sender_streams(result):
            streams.append(stream)
            if not stream.get("ok"):
                errors.append(f"{s.label}: {stream.get('error') or 'not ok'}")
    return streams, cpu, errors


def last_words(child: Child, command: str) -> str:
    """Why ``child`` failed: its last stderr line without its own ``command:`` prefix (the
    caller names the child), or its exit status."""
    return last_line(child.stderr).removeprefix(f"{command}: ") or f"exit {child.returncode}"


def read_receiver(recv: Child, stopped: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """The receiver's JSON lines (one per transfer) and its errors: those of failed transfers,
    and why it did not exit 0 (``stopped``: the benchmark stopped it, still waiting)."""
    lines = recv.results()
    errors = [f"mrc-recv: {r.get('error') or 'not ok'}" for r in lines if not r.get("ok")]
    if stopped:
        errors.append(f"mrc-recv: stopped while waiting, {len(lines)} transfer(s) reported")
    elif recv.returncode != 0:
        errors.append(f"mrc-recv: {last_words(recv, 'mrc-recv')}")
    return lines, errors


# ---- one phase -----------------------------------------------------------------------------


def figures(
    shape: Shape, streams: Sequence[Mapping[str, Any]], wall: float, cpu: float
) -> dict[str, Any]:
    """The phase's figures from its senders' streams: only ok streams count as moved bytes,
    finish times and rates (a failed stream's rate means nothing)."""
    ok = [s for s in streams if s.get("ok")]
    moved = sum(int(s["bytes"]) for s in ok)
    secs = [float(s["seconds"]) for s in ok]
    rates = [int(s["bytes"]) * 8 / float(s["seconds"]) for s in ok if s["seconds"]]
    fmin, fmed, fmax = spread(secs)
    rmin, rmed, rmax = spread(rates)
    return {
        **shape.fields(),
        "streams_ok": len(ok),
        "bytes": moved,
        "wall_seconds": round(wall, 3),
        "goodput_bps": round(moved * 8 / wall) if wall > 0 else None,
        # without process start-up: the bytes over the longest stream's own seconds
        "transfer_goodput_bps": round(moved * 8 / fmax) if fmax else None,
        "finish_min": fmin,
        "finish_median": fmed,
        "finish_max": fmax,
        "rate_min_bps": rounded(rmin, None),
        "rate_median_bps": rounded(rmed, None),
        "rate_max_bps": rounded(rmax, None),
        "jain": rounded(jain(rates), 4),
        "send_cpu_seconds": round(cpu, 3),
        **{k: sum(int(s.get(k) or 0) for s in streams) for k in SENDER_COUNTERS},
    }


def receiver_figures(lines: Sequence[Mapping[str, Any]], recv: Child) -> dict[str, Any]:
    """The receiver's side: its exit status, transfers reported and ok, counters summed, CPU
    (its lines carry the process's CPU since each transfer began: the largest is the most
    that can be told apart from start-up)."""
    cpu = [float(r["cpu_seconds"]) for r in lines if r.get("cpu_seconds") is not None]
    return {
        "recv_exit_code": recv.returncode,
        "recv_transfers": len(lines),
        "recv_ok": sum(1 for r in lines if r.get("ok")),
        "recv_cpu_seconds": max(cpu) if cpu else None,
        **{k: sum(int(r.get(k) or 0) for r in lines) for k in RECEIVER_COUNTERS},
    }


def drops(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """How many datagrams the kernel dropped for full socket buffers meanwhile (loopback loses
    nothing else), machine-wide: other traffic on the machine counts too. The counters are
    read by the harness's reader, the one bench_qp's reference receivers use."""
    return {key: after.get(name, 0) - before.get(name, 0) for name, key in UDP6_DROPS.items()}


class Bench:
    """The phases of the runs, with the commands found once: the mrc-send and mrc-recv next to
    this Python, so the benchmark measures the code it runs with."""

    def __init__(self, args: argparse.Namespace, log: Log) -> None:
        self.args = args
        self.log = log
        self.mrc_send = tool_path("mrc-send")
        self.mrc_recv = tool_path("mrc-recv")

    def recv_argv(self, port: int, shape: Shape, timeout: float) -> list[str]:
        argv = [self.mrc_recv, "--listen", f"[{HOST}]:{port}", "--discard"]
        argv += ["--count", str(shape.streams), "--timeout", f"{timeout:.0f}"]
        return [*argv, "--json", "--no-progress"]

    def send_argv(self, port: int, shape: Shape) -> list[str]:
        argv = [self.mrc_send, "--parallel", str(shape.parallel), "--size", str(shape.size)]
        argv += ["--to", f"[{HOST}]:{port}", "--evs", str(self.args.evs)]
        return [*argv, "--json", "--no-progress", *self.args.extra]

    def phase(self, shape: Shape) -> dict[str, Any]:
        """One phase, its children always stopped; an MRCError (the receiver never listened)
        is a failed phase, not the end of the benchmark."""
        try:
            return self._phase(shape)
        except MRCError as exc:
            return {"ok": False, **shape.fields(), "streams_ok": 0, "errors": [str(exc)]}

    def _phase(self, shape: Shape) -> dict[str, Any]:
        port = self.args.port or free_port()
        timeout = run_timeout(shape.total)
        before = udp6_counters()
        ran = self._run_children(shape, port, timeout)
        streams, cpu, send_errors = read_senders(ran.senders)
        lines, recv_errors = read_receiver(ran.recv, ran.recv_stopped)
        late = [] if ran.done else [f"stopped after {timeout:.0f} s: not finished"]
        errors = late + send_errors + recv_errors  # the senders' first: the cause, usually
        out = {
            **figures(shape, streams, ran.wall, cpu),
            **receiver_figures(lines, ran.recv),
            **drops(before, udp6_counters()),
            "send_exit_codes": [s.returncode for s in ran.senders],
            "port": port,
            "timeout_seconds": round(timeout),
            "timed_out": not ran.done,
        }
        ok = not errors and out["streams_ok"] == shape.streams and out["recv_exit_code"] == 0
        return {"ok": ok, **out, "errors": errors[:MAX_ERRORS]}

    def _run_children(self, shape: Shape, port: int, timeout: float) -> Ran:
        """The receiver, then every sender at once; waits for them until ``timeout`` and
        stops whatever still runs then (and a receiver still waiting once they are done)."""
        with Children() as kids:
            recv = kids.start(self.recv_argv(port, shape, timeout), "mrc-recv")
            wait_listening(recv, port, None, LISTEN_WITHIN)
            t0 = time.monotonic()
            argv = self.send_argv(port, shape)
            senders = [kids.start(argv, f"mrc-send {i + 1}") for i in range(shape.procs)]
            exits = exit_times(dict(enumerate(senders)), t0 + timeout - time.monotonic())
            done = len(exits) == len(senders)
            wall = time.monotonic() - t0
            if done:
                clean = all(s.returncode == 0 for s in senders)
                recv.finished(RECV_GRACE if clean else RECV_GRACE_FAILED)
            stopped = recv.running  # the end of the block stops it
        return Ran(recv, senders, wall, done, stopped)

    # ---- the runs ----------------------------------------------------------------------------

    def run(self, i: int) -> dict[str, Any]:
        """Run ``i``: the many-QP phase and the single QP, each leading in turn."""
        a = self.args
        many = Shape(a.procs, a.parallel, a.size)
        one = Shape(1, 1, many.total)
        order = ["many", "one"] if a.compare_one else ["many"]
        order = order[i % len(order) :] + order[: i % len(order)]
        got = {kind: self.phase(many if kind == "many" else one) for kind in order}
        record: dict[str, Any] = {"run": i + 1, "order": order, **got}
        record.setdefault("one", None)
        record["ratio"] = ratio(got["many"], got.get("one"), "goodput_bps")
        record["transfer_ratio"] = ratio(got["many"], got.get("one"), "transfer_goodput_bps")
        self.log(progress(record, a.runs))
        return record


def ratio(many: Mapping[str, Any], one: Mapping[str, Any] | None, key: str) -> float | None:
    """The many-QP aggregate as a fraction of the single QP's, both figure ``key`` measured
    the same way; None if either phase failed."""
    if one is None or not many["ok"] or not one["ok"] or not one.get(key):
        return None
    return round(float(many[key]) / float(one[key]), 3)


def summarise(phases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of every figure in SUMMARY_KEYS (of the runs that have it)."""
    return {
        **{k: phases[0][k] for k in ("procs", "parallel", "streams", "size")},
        "runs": len(phases),
        "runs_ok": sum(1 for p in phases if p["ok"]),
        **medians(phases, SUMMARY_KEYS, SUMMARY_DIGITS),
    }


def summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary: medians of each phase's figures and of the per-run ratios."""
    ones = [r["one"] for r in runs if r["one"] is not None]
    ratios = medians(runs, ("ratio", "transfer_ratio"), SUMMARY_DIGITS)
    return {
        "many": summarise([r["many"] for r in runs]),
        "one": summarise(ones) if ones else None,
        **{f"{k}_median": m for k, m in ratios.items()},
    }


# ---- what people read ----------------------------------------------------------------------


def _f(v: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v / scale, fmt)


Cell = Callable[[Mapping[str, Any]], str]


def _num(key: str, fmt: str, scale: float = 1.0) -> Cell:
    return lambda p: _f(p.get(key), fmt, scale)


def _joined(keys: Sequence[str], fmt: str) -> Cell:
    return lambda p: "/".join(_f(p.get(k), fmt) for k in keys)


#: the table's columns after run and phase: heading, width, the cell of a phase
COLUMNS: tuple[tuple[str, int, Cell], ...] = (
    ("ok", 7, lambda p: f"{_f(p.get('streams_ok'), '.0f')}/{p['streams']}"),
    ("wall s", 6, _num("wall_seconds", ".2f")),
    ("Mbit/s", 7, _num("goodput_bps", ".1f", 1e6)),
    ("xfer Mbit/s", 11, _num("transfer_goodput_bps", ".1f", 1e6)),
    ("finish s min/med/max", 20, _joined(("finish_min", "finish_median", "finish_max"), ".2f")),
    ("jain", 5, _num("jain", ".3f")),
    ("cpu s snd/rcv", 13, _joined(("send_cpu_seconds", "recv_cpu_seconds"), ".2f")),
    ("rtx to/nack/tlp/sack", 20, _joined([f"retransmits_{k}" for k in RTX_KINDS], ".0f")),
    ("silent", 6, _num("silent_timeouts", ".0f")),
    ("EVbad", 5, _num("evs_assumed_bad", ".0f")),
    ("drops r/s", 9, _joined(list(UDP6_DROPS.values()), ".0f")),
    ("acks", 6, _num("acks_sent", ".0f")),
    ("dups", 5, _num("duplicates", ".0f")),
    ("marks", 6, _num("queue_marks", ".0f")),
)
#: run, phase and COLUMNS: their widths and sides
WIDTHS = (6, 11, *(w for _, w, _ in COLUMNS))
ALIGN = "><>"
HEAD = line(("run", "phase", *(h for h, _, _ in COLUMNS)), WIDTHS, ALIGN, " ")


def row(label: str, p: Mapping[str, Any]) -> str:
    """One line of the table: a phase of one run, or the medians of a phase."""
    return line((label, _kind(p), *(cell(p) for _, _, cell in COLUMNS)), WIDTHS, ALIGN, " ")


def run_line(record: Mapping[str, Any]) -> str:
    """Progress after each run: the rows of its phases and its ratio."""
    lines = [row(str(record["run"]), record[k]) for k in ("many", "one") if record[k] is not None]
    return "\n".join(lines + _error_lines(record))


def progress(record: Mapping[str, Any], runs: int) -> str:
    """One line after each run (the table at the end has the details), and its errors."""
    parts = [
        f"{_kind(p)} {p['streams_ok']}/{p['streams']} ok "
        f"{_f(p.get('goodput_bps'), '.1f', 1e6)} Mbit/s in {_f(p.get('wall_seconds'), '.2f')} s, "
        f"jain {_f(p.get('jain'), '.3f')}"
        for p in (record["many"], record["one"])
        if p is not None
    ]
    if record["one"] is not None:
        parts.append(f"ratio {_f(record['ratio'], '.3f')} ({_f(record['transfer_ratio'], '.3f')})")
    first = f"run {record['run']}/{runs}: " + " | ".join(parts)
    return "\n".join([first, *_error_lines(record)])


def _kind(p: Mapping[str, Any]) -> str:
    return Shape(p["procs"], p["parallel"], p["size"]).label


def _error_lines(record: Mapping[str, Any]) -> list[str]:
    return [
        f"{'':>6} {k} FAILED: {e}"
        for k in ("many", "one")
        if record[k] is not None and not record[k]["ok"]
        for e in record[k]["errors"] or ["(no error reported)"]
    ]


def table(out: Mapping[str, Any]) -> str:
    """The human table: every phase of every run, their medians (of several runs), the ratio
    and what ran."""
    c, s = out["config"], out["summary"]
    rule = "-" * len(HEAD)
    lines = [HEAD, rule, *(run_line(r) for r in out["results"])]
    if c["runs"] > 1:
        lines += [rule, *(row("median", p) for p in (s["many"], s["one"]) if p is not None)]
    if s["one"] is not None:
        lines.append(
            f"aggregate / one QP: {_f(s['ratio_median'], '.3f')} over the wall time (Mbit/s), "
            f"{_f(s['transfer_ratio_median'], '.3f')} over the streams' own seconds (xfer)"
        )
    return "\n".join([*lines, _footnote(out)])


def _footnote(out: Mapping[str, Any]) -> str:
    c, m = out["config"], out["machine"]
    one = f"one QP moves {human_bytes(c['streams'] * c['size'])}; " if c["compare_one"] else ""
    extra = f" {' '.join(c['extra'])}" if c["extra"] else ""
    return (
        f"({c['streams']} streams of {human_bytes(c['size'])} into one mrc-recv on [{HOST}]; "
        f"{one}mrc-send --evs {c['evs']}{extra}; {c['runs']} run(s)"
        + (", interleaved" if c["compare_one"] else "")
        + "; xfer = bytes / the longest stream's seconds, without start-up; "
        f"loop {m['event_loop']}; "
        f"load {m['loadavg_start'][0]} -> {m['loadavg_end'][0]} on {m['cpus']} cpus)"
    )


# ---- the command ---------------------------------------------------------------------------


def main(a: argparse.Namespace) -> int:
    """Run the benchmark as ``a`` (tools/bench_manyqp.py's arguments) says: JSON on stdout,
    the table on stderr (``--json``: JSON only); 1 if any phase failed."""

    def log(msg: str) -> None:
        if not a.json:
            print(msg, file=sys.stderr, flush=True)

    unwind_on_sigterm()  # a kill stops the children on the way out, as Ctrl-C does
    started = time.monotonic()
    load_start = loadavg()
    bench = Bench(a, log)
    config = {
        "procs": a.procs,
        "parallel": a.parallel,
        "streams": a.procs * a.parallel,
        "size": a.size,
        "runs": a.runs,
        "evs": a.evs,
        "compare_one": a.compare_one,
        "extra": a.extra,
        "host": HOST,
        "port": a.port,
    }
    runs = [bench.run(i) for i in range(a.runs)]
    out = envelope(
        TOOL,
        machine_info(load_start),
        {
            "config": config,
            "results": runs,
            "summary": summary(runs),
            "elapsed_seconds": round(time.monotonic() - started, 1),
        },
    )
    emit_json(out, indent=2)
    if not a.json:
        print(table(out), file=sys.stderr)
    failed = any(not r["many"]["ok"] or (r["one"] is not None and not r["one"]["ok"]) for r in runs)
    return 1 if failed else 0
