"""``mrc-bench``: collective workloads as synchronized steps on an mrc-fabric, MRC vs TCP vs MPTCP.

Training jobs wait for their slowest transfer, so the number reported first is the P100 (the
worst) step time. See docs/BENCH.md. Every user-caused failure is one line on stderr,
``mrc-bench: error: ...``: exit 2 for bad arguments, 1 for other failures, 130 when interrupted.
Fabrics and agents are always removed, also on Ctrl-C.

Progress notes go through stdlib logging at INFO, and INFO is this command's default level
(a run takes minutes: silence would look like a hang); ``-q`` hides them, ``-v`` adds DEBUG
and the agents' logs when something fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mrc.cli.common import (
    Parser,
    add_logging_args,
    cc_arg,
    configure_logging,
    emit_json,
    float_between,
    int_at_least,
    run_main,
    size_arg,
)
from mrc.cli.qpopts import add_qp_arg, apply_settings
from mrc.core.cc import names
from mrc.core.config import QPConfig
from mrc.errors import MRCError, UsageError
from mrc.lab.bench.common import CONDITIONS, TRANSPORTS, WORKLOADS
from mrc.units import SIZE_HELP

if TYPE_CHECKING:
    from mrc.lab.bench.coordinator import Bench, BenchConfig

PROG = "mrc-bench"
log = logging.getLogger(__name__)
MAX_SIZE = 256 << 20


def _list_of(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    """argparse type for a comma list of ``choices`` (or ``all``)."""

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if items == ["all"]:
            return list(choices)
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or repr(text)}: choose from {', '.join(choices)}"
            )
        return list(dict.fromkeys(items))

    return parse


_seconds = float_between(0, 3600, " s", low_inclusive=True)


def _probability(text: str) -> float:
    try:
        v = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a probability: {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (or 0%..100%), not {text}")
    return v


def _size(text: str) -> int:
    v = size_arg(text)
    if not 1 <= v <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size must be 1 byte .. 256M, not {text}")
    return v


def _link(text: str) -> tuple[str, str]:
    parts = [p for p in text.replace(",", "-").split("-") if p]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two nodes like p0l0-p0s0, not {text!r}")
    return parts[0], parts[1]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description=(
            "Run collective workloads (alltoall, ring, incast, pair) as synchronized steps"
            " between the hosts of an mrc-fabric, over MRC, kernel TCP (plane 0 only) and"
            " MPTCP (one subflow per plane), under conditions (clean, a spine link failing"
            " mid-run, random loss on a link, incast with and without packet trimming)."
            " Reports P50/P99/P100 step times, goodput and SHA-256-verified bytes. Needs root."
            " See docs/BENCH.md."
        ),
        epilog=(
            "examples:\n"
            "  mrc-bench --quick                     # < 1 min smoke run, every condition\n"
            "  mrc-bench --json > bench.json         # the default run (a few minutes)\n"
            "  mrc-bench --conditions clean,link_down --workloads alltoall --plots plots/\n"
            "  mrc-bench --table BENCH-table.md --plots docs/bench\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _what_to_run(p)
    _fabric_args(p)
    _launched_args(p)
    _mrc_args(p)
    _condition_args(p)
    _output_args(p)
    return p


def _comma_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("an empty list")
    return items


def _launched_args(p: argparse.ArgumentParser) -> None:
    """One rank of a job a launcher started on each host (mrc/lab/bench/launched.py)."""
    from mrc.cli.pathopts import port_range
    from mrc.lab.bench.rendezvous import LAUNCHERS

    g = p.add_argument_group(
        "launched job (one process per host, started by mpiexec, srun or torchrun;"
        " docs/CLUSTER.md). No fabric is built: the launcher's hosts are the hosts"
    )
    g.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="this process is one rank of a launched job: mpi (mpi4py: rank 0 broadcasts its"
        " control address and a job token), env (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as"
        " torchrun sets them), slurm (SLURM_PROCID, SLURM_NTASKS; MASTER_ADDR or the first"
        " node), auto. With env and slurm set MRC_BENCH_TOKEN to the same secret on every rank:"
        " the ranks and rank 0 prove it to each other. Rank 0 prints the results; the others"
        " print nothing on stdout",
    )
    g.add_argument(
        "--nics",
        type=_comma_list,
        metavar="IF,IF",
        help="this host's plane NICs in plane order (their first global IPv6 address each)",
    )
    g.add_argument(
        "--addrs", type=_comma_list, metavar="A,B", help="this host's plane addresses in order"
    )
    g.add_argument(
        "--fabric",
        metavar="NAME|FILE",
        help="an mrc-fabric or real-fabric topology: this host's planes are those of its host"
        " in it (the one whose addresses are local), and MRC takes its SRv6 paths",
    )
    g.add_argument(
        "--control-addr",
        metavar="ADDR",
        help="mpi: the address rank 0 announces for the control connections (default: its"
        " plane addresses, last plane first)",
    )
    g.add_argument(
        "--rendezvous-timeout",
        type=_seconds,
        default=120.0,
        help="how long rank 0 waits for the others, and they for it (default 120 s)",
    )
    g.add_argument(
        "--fault-cmd",
        metavar="CMD",
        help="link_down: a shell command that takes a plane away, run by --fault-rank on its"
        " own host; $MRC_NIC0.. and $MRC_ADDR0.. name its planes (e.g. 'ip link set $MRC_NIC0"
        " down', which needs root there). env and slurm: only with MRC_BENCH_TOKEN",
    )
    g.add_argument("--heal-cmd", metavar="CMD", help="link_down: the command that brings it back")
    g.add_argument(
        "--fault-rank", type=int_at_least(0), default=0, help="the rank that runs them (default 0)"
    )
    g.add_argument(
        "--ports",
        type=port_range,
        metavar="LO-HI",
        help="bind MRC's UDP sockets to this range, for a host firewall (docs/CLUSTER.md)",
    )


def _what_to_run(p: argparse.ArgumentParser) -> None:
    """What to run: workloads, transports, sizes, steps."""
    g = p.add_argument_group("what to run")
    g.add_argument(
        "--quick",
        action="store_true",
        help="smoke run in under a minute: 2 planes, 4 hosts, 3 small steps of every"
        " workload and transport, every condition with a 1 s outage (other options"
        " still apply: --conditions clean for the fastest)",
    )
    g.add_argument(
        "--workloads",
        type=_list_of(WORKLOADS, "workload"),
        help="comma list of alltoall,ring,incast,pair (default: per condition: clean"
        " runs all four; link_down and lossy alltoall; trim and no_trim incast)",
    )
    g.add_argument(
        "--transports",
        type=_list_of(TRANSPORTS, "transport"),
        help="comma list of mrc,tcp,mptcp (default all)",
    )
    g.add_argument(
        "--conditions",
        type=_list_of(CONDITIONS, "condition"),
        help="comma list of clean,link_down,lossy,trim,no_trim (default all)",
    )
    g.add_argument(
        "--steps",
        type=int_at_least(1),
        help="measured steps per workload and transport (default 12; --quick 3);"
        " link_down runs on until the heal plus a few steps",
    )
    g.add_argument("--warmup", type=int_at_least(0), help="unmeasured steps first (default 1)")
    g.add_argument(
        "--size",
        type=_size,
        help="bytes per transfer for alltoall, ring, incast (default 1M; --quick 256K;"
        f" {SIZE_HELP})",
    )
    g.add_argument(
        "--pair-size",
        type=_size,
        help="bytes per step of the pair workload (default 8M; --quick 1M)",
    )
    g.add_argument("--seed", type=int, default=1, help="seed of the data every host sends")


def _fabric_args(p: argparse.ArgumentParser) -> None:
    """The fabric each condition builds."""
    f = p.add_argument_group("fabric (built fresh for every condition)")
    f.add_argument("--hosts", type=int_at_least(2), help="hosts (default 4)")
    f.add_argument("--planes", type=int_at_least(1), help="planes (default 2)")
    f.add_argument("--spines", type=int_at_least(1), help="spines per plane (default 2)")
    f.add_argument("--leaves", type=int_at_least(1), help="leaves per plane (default 2)")
    f.add_argument("--rate", help="tbf rate of every link (default 100mbit; 'none': unshaped)")
    f.add_argument("--mtu", type=int_at_least(1280), help="MTU of every link (default 9000)")
    f.add_argument(
        "--host-image",
        metavar="IMAGE",
        help="run every host as a container of IMAGE (mrc-fabric up --host-image;"
        " docker/build.sh builds one)",
    )


def _mrc_args(p: argparse.ArgumentParser) -> None:
    """Every MRC QP's settings."""
    m = p.add_argument_group("MRC")
    m.add_argument("--evs", type=int_at_least(1), help="EVs per QP (default 128)")
    m.add_argument(
        "--payload",
        type=int_at_least(64),
        help="payload bytes per packet (default 8192, or what the MTU allows)",
    )
    m.add_argument(
        "--window",
        type=int_at_least(1),
        help="packets in flight per QP at most (default 64 with --cc nscc, where the"
        " congestion window finds the rate; with --cc fixed the window itself, default 4:"
        " what fits the fabric's queues)",
    )
    m.add_argument(
        "--incast-window",
        type=int_at_least(1),
        help="the same under the trim/no_trim conditions (default 64 with nscc; 16 with"
        " --cc fixed: enough for N-1 senders to overflow the last hop)",
    )
    m.add_argument(
        "--cc",
        type=cc_arg,
        metavar="LAW",
        help="window law of every MRC QP: "
        + ", ".join(names())
        + " or MODULE:CLASS (default nscc; docs/CONGESTION.md)",
    )
    add_qp_arg(m, ", for every MRC QP, after --payload, --window and --cc")


def _condition_args(p: argparse.ArgumentParser) -> None:
    """The conditions and their faults."""
    c = p.add_argument_group("conditions")
    c.add_argument(
        "--outage", type=_seconds, help="link_down: seconds the link stays down (default 2)"
    )
    c.add_argument(
        "--fail-step",
        type=int_at_least(0),
        help="link_down: the step during which the link goes down (default steps/3)",
    )
    c.add_argument(
        "--fail-link",
        type=_link,
        help="link_down: the link to fail (default p0l0-p0s0, on the plane-0"
        " spine-0 path TCP is pinned to)",
    )
    c.add_argument(
        "--loss",
        type=_probability,
        help="lossy: drop probability each way on one link (default 0.03)",
    )
    c.add_argument(
        "--loss-link",
        type=_link,
        help="lossy: ROUTER-PEER link whose router drops (default p0s0-p0l0)",
    )
    c.add_argument(
        "--step-timeout",
        type=_seconds,
        help="a step not complete after this long fails (default outage + 20 s)",
    )


def _output_args(p: argparse.ArgumentParser) -> None:
    """Where results go."""
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    o.add_argument("--table", metavar="FILE", help="also write the markdown table to FILE")
    o.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    add_logging_args(
        p,
        default=logging.INFO,
        verbose_help="also DEBUG notes, and the agents' logs when something fails",
        quiet_help="no progress lines on stderr: errors only",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    from mrc.lab.bench.coordinator import BenchConfig

    cfg = BenchConfig()
    if args.quick:
        cfg.quick = True
        cfg.planes = 2
        cfg.hosts = 4
        cfg.steps = 3
        cfg.size = 256 << 10
        cfg.pair_size = 1 << 20
        cfg.outage = 1.0
    for name in (
        "steps",
        "warmup",
        "size",
        "pair_size",
        "hosts",
        "planes",
        "spines",
        "leaves",
        "mtu",
        "host_image",
        "evs",
        "window",
        "incast_window",
        "cc",
        "qp",
        "outage",
        "fail_step",
        "fail_link",
        "loss",
        "loss_link",
        "step_timeout",
        "transports",
        "workloads",
        "conditions",
    ):
        v = getattr(args, name)
        if v is not None:
            setattr(cfg, name, v)
    cfg.seed = args.seed
    cfg.verbose = args.verbose > 0
    if args.rate is not None:
        cfg.rate = None if args.rate.lower() in ("none", "0", "") else args.rate
    if args.payload is not None:
        cfg.payload = args.payload
    else:
        cfg.payload = cfg.payload_for_mtu()
    return cfg


def validate(cfg: BenchConfig) -> None:
    """Raise :class:`UsageError` with a one-line reason if the configuration cannot run."""
    cfg.fabric_spec("check").validate()
    if cfg.payload > cfg.mtu - 120:
        raise UsageError(
            f"--payload {cfg.payload} does not fit the MTU {cfg.mtu} (max {cfg.mtu - 120})"
        )
    names = {f"h{i}" for i in range(cfg.hosts)}
    names |= {
        f"p{p}{t}{i}"
        for p in range(cfg.planes)
        for t, n in (("l", cfg.leaves), ("s", cfg.spines))
        for i in range(n)
    }
    if "link_down" in cfg.conditions:
        a, b = cfg.fail_link
        if a not in names or b not in names:
            raise UsageError(f"--fail-link {a}-{b}: no such nodes in this fabric")
    if "lossy" in cfg.conditions:
        a, b = cfg.loss_link
        if a not in names or b not in names or a.startswith("h"):
            raise UsageError(f"--loss-link {a}-{b}: the first node must be a router of this fabric")
    if ("trim" in cfg.conditions) and not cfg.rate:
        raise UsageError("the trim condition needs a shaped fabric (--rate)")
    validate_qp(cfg)


def validate_qp(cfg: BenchConfig) -> None:
    """Every condition's MRC QP settings build a valid QPConfig (else a one-line reason)."""
    for condition in cfg.conditions:
        try:
            apply_settings(QPConfig(), cfg.qp_settings(condition)).validate()
        except ValueError as exc:
            raise UsageError(f"{condition}: {exc}") from None


def progress_printer() -> Callable[[str], None]:
    """The coordinator's progress notes, as INFO log lines stamped with the run's elapsed time."""
    start = time.monotonic()

    def progress(msg: str) -> None:
        log.info("[%6.1fs] %s", time.monotonic() - start, msg)

    return progress


async def _run(bench: Bench) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await bench.run()
    finally:
        await bench.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    return run_main(PROG, lambda: _main(args), "interrupted (fabrics and agents removed)")


def _main(args: argparse.Namespace) -> int:
    if args.launcher:
        return _launched_main(args)
    _refuse(args, _LAUNCHED_ONLY, "is for a launched run (--launcher); this run builds its fabric")
    cfg = config_from_args(args)
    validate(cfg)
    if os.geteuid() != 0:
        raise MRCError("needs root (network namespaces, veth links, tc); run it as root")
    _check_plots(args)
    from mrc.lab.bench.coordinator import Bench
    from mrc.lab.harness.machine import loadavg

    progress = progress_printer()
    load_start = loadavg()
    t0 = time.monotonic()
    bench = Bench(cfg, progress)
    progress(
        f"conditions {', '.join(cfg.conditions)}; transports {', '.join(cfg.transports)};"
        f" load average {load_start[0]:.2f} on {os.cpu_count()} CPUs"
    )
    try:
        asyncio.run(_run(bench))
    except asyncio.CancelledError:  # SIGTERM cancelled the run (see _run)
        raise KeyboardInterrupt from None
    except MRCError:
        if cfg.verbose:
            for a in bench.agents:
                log.debug("h%d log: %s", a.index, a.log_tail(20))
        raise
    finally:
        bench.cleanup_sync()  # whatever the loop could not remove (idempotent)
    return _report(args, bench, load_start, t0, progress, {})


def _check_plots(args: argparse.Namespace) -> None:
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MRCError("--plots needs matplotlib (pip install matplotlib)") from None


def _report(
    args: argparse.Namespace,
    bench: Bench,
    load_start: tuple[float, float, float],
    t0: float,
    progress: Callable[[str], None],
    extra: dict[str, object],
) -> int:
    """The run's JSON document, table and plots (``extra``: more top-level keys)."""
    from mrc.lab.bench.coordinator import config_dict
    from mrc.lab.bench.report import aims, plots, table
    from mrc.lab.harness.envelope import envelope
    from mrc.lab.harness.machine import machine_info

    doc = envelope(
        PROG,
        machine_info(load_start),
        {
            "format": 1,
            "config": config_dict(bench.cfg),
            "duration_s": round(time.monotonic() - t0, 1),
            "results": bench.rows,
            "aims": aims(bench.rows, judged=not bench.cfg.quick),
            "skipped": bench.skipped,
            **extra,
        },
    )
    md = table(doc)
    if args.table:
        try:
            with open(args.table, "w") as f:
                f.write(md)
        except OSError as exc:
            raise MRCError(f"cannot write {args.table}: {exc.strerror}") from None
    if args.plots:
        files = plots(doc, args.plots)
        progress(f"{len(files)} plots in {args.plots}")
    if args.json:
        emit_json(doc, indent=1)
    else:
        print(md, end="")
    sys.stdout.flush()
    # the time until now, report and plots included (duration_s is the run's, before them)
    took = time.monotonic() - t0
    progress(f"done in {took:.1f} s (the run {doc['duration_s']} s, then its report)")
    return 0


def _launched_qp(cfg: BenchConfig) -> frozenset[str]:
    """The window laws given as code (MODULE:CLASS) on this rank's command line, loaded there
    (--cc, --qp cc=), the only ones a request from rank 0 may name (mrc/lab/bench/agent.py);
    and a usage error if the --qp settings rank 0 sends would not pass the ranks' request
    schema (mrc/lab/bench/schema.py)."""
    from mrc.lab.bench.schema import QP_MAX, QP_TEXT_MAX

    for condition in cfg.conditions:
        settings = cfg.qp_settings(condition)
        if len(settings) > QP_MAX or any(len(t) > QP_TEXT_MAX for t in settings):
            raise UsageError(
                f"a launched run takes at most {QP_MAX - 3} --qp settings, and every QP setting"
                f" (--cc's too) at most {QP_TEXT_MAX} characters long"
            )
    return cfg.code_laws()


# options of a launched run only
_LAUNCHED_ONLY = ("nics", "addrs", "fabric", "control_addr", "fault_cmd", "heal_cmd", "ports")


def _refuse(args: argparse.Namespace, names: Sequence[str], why: str) -> None:
    """A usage error for the first of ``names`` given on the command line."""
    for name in names:
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} {why}")


# options that shape the fabric mrc-bench builds, which a launched run does not build
_FABRIC_ONLY = (
    "hosts",
    "planes",
    "spines",
    "leaves",
    "mtu",
    "host_image",
    "fail_link",
    "loss",
    "loss_link",
    "incast_window",
)


def _launched_main(args: argparse.Namespace) -> int:
    """One rank of a launched job (mrc/lab/bench/launched.py); rank 0 reports."""
    from mrc.lab.bench.launched import LAUNCHED_CONDITIONS, LaunchOptions, run_rank
    from mrc.lab.bench.planes import find
    from mrc.lab.bench.rendezvous import rendezvous
    from mrc.lab.harness.machine import loadavg
    from mrc.transport.loop import run
    from mrc.units import parse_rate

    _refuse(
        args, _FABRIC_ONLY, "does not apply to a launched run: the launcher's hosts are the hosts"
    )
    bad = [c for c in args.conditions or [] if c not in LAUNCHED_CONDITIONS]
    if bad:
        raise UsageError(
            f"a launched run has the conditions {', '.join(LAUNCHED_CONDITIONS)};"
            f" {', '.join(bad)} need mrc-bench's own fabric"
        )
    if (args.fault_cmd is None) != (args.heal_cmd is None):
        raise UsageError("--fault-cmd and --heal-cmd go together")
    if args.conditions and "link_down" in args.conditions and args.fault_cmd is None:
        raise UsageError("link_down in a launched run needs --fault-cmd and --heal-cmd")
    cfg = config_from_args(args)
    if args.rate is None:
        cfg.rate = None  # unknown: no ideal step time (the built-in fabric's default is moot)
    if args.conditions is None:
        cfg.conditions = ["clean"] + (["link_down"] if args.fault_cmd else [])
    validate_qp(cfg)
    laws = _launched_qp(cfg)
    _check_plots(args)
    opts = LaunchOptions(
        rendezvous_timeout=args.rendezvous_timeout,
        control_addr=args.control_addr,
        fault_cmd=args.fault_cmd,
        heal_cmd=args.heal_cmd,
        fault_rank=args.fault_rank,
        rate_bps=parse_rate(cfg.rate) if cfg.rate else None,
        payload_given=args.payload is not None,
        transports_given=args.transports is not None,
        ports=args.ports,
        laws=laws,
    )
    rv = rendezvous(args.launcher)
    if opts.fault_rank >= rv.world:
        raise UsageError(f"--fault-rank {opts.fault_rank}: there are only {rv.world} ranks")
    authenticated = bool(rv.token) or rv.launcher == "mpi"  # MPI makes and shares a token
    if not authenticated and args.fault_cmd is not None:
        raise UsageError(
            "--fault-cmd and --heal-cmd need MRC_BENCH_TOKEN (the same secret on every"
            " rank): without it anyone who reaches the control port could run them"
        )
    planes = find(args.nics, args.addrs, args.fabric)
    if not authenticated:
        log.warning(
            "rank %d: the control channel is unauthenticated: anyone who reaches rank 0's"
            " port first can take a rank's place (set MRC_BENCH_TOKEN, the same on every rank)",
            rv.rank,
        )
    progress = progress_printer() if rv.rank == 0 else log.debug
    load_start = loadavg()
    t0 = time.monotonic()
    try:
        done = run(run_rank(rv, planes, cfg, opts, progress))
    except MRCError as exc:
        if rv.rank:
            exc.args = (f"rank {rv.rank}: {exc}",)
        raise
    if done is None:
        return 0
    bench, info = done
    return _report(args, bench, load_start, t0, progress, {"launch": info})


if __name__ == "__main__":
    sys.exit(main())
