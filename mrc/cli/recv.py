"""mrc-recv: accept MRC transfers straight into an output file (or memory)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import mmap
import signal
import sys
import time
from typing import cast

from mrc import counter_registry as registry
from mrc.app.timed import SLOT
from mrc.app.transfer import IDLE_TIMEOUT, agreed, receive_buffer
from mrc.cli.common import (
    JsonAnswer,
    Parser,
    Progress,
    add_checksum_arg,
    add_idle_timeout,
    add_key_args,
    add_logging_args,
    add_scheduling_arg,
    configure_logging,
    endpoint_arg,
    float_between,
    json_text,
    load_key,
    parse_endpoint,
    positive_int,
    run_command,
    size_arg,
)
from mrc.cli.configs import listener_config, receiver_qp
from mrc.cli.lineout import LineWriter
from mrc.cli.metricsopts import add_metrics_args, check_metrics_usage, start_metrics
from mrc.cli.outputs import (
    DISCARD_WINDOW,
    Outputs,
    check_out_dir,
    check_target,
    shell_word,
    stale_parts,
)
from mrc.cli.pathopts import (
    EVLog,
    add_path_args,
    apply_denies,
    check_host_routes,
    load_fabric,
    local_plane_addrs,
)
from mrc.cli.planewatch import PlaneWatch
from mrc.cli.qpopts import add_qp_arg
from mrc.connection import START_TIMEOUT, Connection, Listener, listen
from mrc.connection.config import TAKEN_CHECKSUMS
from mrc.core import fastpath
from mrc.errors import MRCError
from mrc.transport.limits import DEFAULT_MAX_SETUPS
from mrc.transport.memory import usable_memory
from mrc.transport.messages import Abort
from mrc.units import SIZE_HELP, human_bytes, human_rate
from mrc.wire import DEFAULT_PORT

PROG = "mrc-recv"
#: the smallest --discard-window: what a timed sender (mrc-send --time) asks for
MIN_WINDOW = 2 * SLOT
#: the counters mrc-recv prints with --json (declared with json=RECV, mrc/core/counters.py)
RECEIVED = registry.in_json("recv")
log = logging.getLogger(__name__)


EXAMPLES = f"""\
examples:
  mrc-recv --out big.iso                          one transfer into big.iso, on [::]:{DEFAULT_PORT}
  mrc-recv --listen [fd00:1::2]:{DEFAULT_PORT} --listen [fd00:2::2]:{DEFAULT_PORT} --out x.bin
                                                  two planes: one --listen per plane address
  mrc-recv --discard --count 4 --json             four transfers into memory, verified, dropped;
                                                  a JSON object each (and one on failure)
  mrc-recv --out 'run-{{n}}.bin' --count 10         ten transfers into run-1.bin .. run-10.bin
  mrc-recv --discard --key-file k.key --encrypt   only senders holding the key, encrypting

Exit status: 0 every transfer verified, 1 a transfer failed, 2 bad usage, 130 interrupted."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        json_role="recv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Receive MRC transfers from mrc-send. Each packet is written straight to its offset in an
mmap of the output file (write-to-offset), in whatever order it arrives; the result is
verified end to end against the sender's, with the checksum the two agree on (BLAKE3 by
default, --checksum).""",
        epilog=EXAMPLES,
    )
    where = p.add_argument_group("where to listen")
    where.add_argument(
        "--listen",
        action="append",
        metavar="[ADDR]:PORT",
        type=endpoint_arg,
        help="address and port to listen on (UDP data and the TCP side channel); "
        f"repeat once per plane address. Default [::]:{DEFAULT_PORT}",
    )
    output = p.add_argument_group("where the data goes (one of --out, --discard)")
    out = output.add_mutually_exclusive_group(required=True)
    out.add_argument(
        "--out",
        metavar="FILE",
        help="write the data here ({n} in the name is replaced by the transfer "
        "number when --count > 1: 1, 2, ..., never the same twice, also when a sender that "
        "never started is dropped); written to a new FILE.mrc-<random>.part, renamed to FILE "
        "once verified, deleted on any failure; an existing FILE is refused unless --force. "
        "Its directory must exist and be writable (checked at start)",
    )
    out.add_argument(
        "--discard",
        action="store_true",
        help="receive into memory, verify, and throw the data away; a transfer larger than "
        "--discard-window comes through a window of that size, hashed as it lands",
    )
    output.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output file (without it, an existing --out is refused)",
    )
    output.add_argument(
        "--discard-window",
        type=size_arg,
        default=DISCARD_WINDOW,
        metavar="SIZE",
        help=f"with --discard, the most memory one transfer gets (default "
        f"{DISCARD_WINDOW >> 20}M, at least {MIN_WINDOW >> 20}M): two slots a larger transfer "
        "is written through, one while the other is hashed",
    )
    transfers = p.add_argument_group("transfers")
    transfers.add_argument(
        "--count",
        type=positive_int,
        default=1,
        metavar="N",
        help="transfers to accept before exiting; they may run at once (default 1)",
    )
    transfers.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up if no sender connects and starts sending within this time",
    )
    transfers.add_argument(
        "--start-timeout",
        type=float_between(0.1, 86400.0),
        default=START_TIMEOUT,
        metavar="SECONDS",
        help="drop a sender that connected but sent no data for this long, freeing its "
        f"transfer slot and file for another sender (default {START_TIMEOUT:g}); "
        "--idle-timeout covers a transfer that stalls once started",
    )
    add_idle_timeout(transfers, "no data arrives", IDLE_TIMEOUT)
    add_scheduling_arg(transfers)
    transfers.add_argument(
        "--evs",
        type=positive_int,
        default=16,
        metavar="N",
        help="entropy values for acknowledgements, split across planes (default 16)",
    )
    add_qp_arg(
        transfers,
        ", for every QP this receiver accepts (the sender's hello still sets the PSN window)",
    )
    limits = p.add_argument_group("limits (each refusal names the flag that raises it)")
    limits.add_argument(
        "--max-size",
        type=size_arg,
        default=64 << 30,
        metavar="SIZE",
        help=f"refuse transfers larger than this (default 64G; {SIZE_HELP})",
    )
    limits.add_argument(
        "--max-total",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="refuse a transfer that would take the space granted to transfers in progress "
        "together over SIZE (default 64G, or --max-size if larger)",
    )
    limits.add_argument(
        "--max-memory",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="refuse a transfer that would take the memory held by transfers in progress "
        "together over SIZE (--discard holds a transfer's size in memory; an --out file's "
        "pages are the kernel's page cache, not counted). Default: a quarter of this "
        "machine's memory (or of its memory cgroup's limit), at most half of what is "
        "available at start; more than the machine's memory is refused",
    )
    limits.add_argument(
        "--max-setups",
        type=positive_int,
        default=DEFAULT_MAX_SETUPS,
        metavar="N",
        help="side-channel connections being set up at once; beyond N the oldest that has "
        "not yet said its hello (or proved the key) is dropped for the newcomer, and if all "
        f"have, the newcomer is refused (default {DEFAULT_MAX_SETUPS})",
    )
    add_path_args(where, p.add_argument_group("paths"))
    security = p.add_argument_group("security")
    add_key_args(security, ENCRYPT_HELP)
    add_checksum_arg(security, TAKEN_CHECKSUMS, "taken")
    shown = p.add_argument_group("output")
    shown.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per transfer (docs/schemas/mrc-recv.schema.json), and "
        'one with "ok": false and the "error" when the run fails without a transfer to say it',
    )
    shown.add_argument(
        "--no-progress",
        action="store_true",
        help="never draw progress bars (drawn only when stderr is a terminal, one line per "
        "transfer, and never with --json or -q)",
    )
    add_metrics_args(shown, "the counters of every transfer (and of the listener)")
    add_logging_args(p)
    return p


#: what --encrypt asks of senders (mrc/security: AES-GCM with 128-bit keys per connection)
ENCRYPT_HELP = (
    "refuse senders that do not also encrypt every payload (AES-128-GCM under keys made "
    "for each connection from the key file); needs --key-file"
)


async def _one(
    conn: Connection, outputs: Outputs, args: argparse.Namespace, evlog: EVLog, lines: LineWriter
) -> bool:
    region = conn.granted
    if region is None:
        await conn.close()
        raise MRCError("a sender connected without asking for a region (not mrc-send?)")
    size = conn.requested_size if conn.requested_size is not None else region.length
    view = region.view[:size]
    buf = cast(mmap.mmap, region.view.obj)  # _Outputs hands out nothing but mmaps
    path = outputs.path_of(buf)
    peer = conn.peer_host
    where = path if path else "memory"
    if size > region.length:
        where = f"a window of {human_bytes(region.length)}"
    log.info(
        "transfer from %s: %s into %s, verified with %s",
        peer,
        human_bytes(size),
        where,
        agreed(conn).label,
    )
    quiet = args.no_progress or args.quiet or args.json
    label = f"{peer} -> {path if path else 'memory'}"
    progress = Progress(size, label, False if quiet else None)
    evlog.attach(conn, "recv")
    finished = False

    def finish(keep: bool) -> None:
        """Release our views, then put the part file in place (``keep``) or delete it."""
        nonlocal finished
        finished = True
        view.release()
        conn.deregister(region)
        outputs.finish(buf, keep)

    def commit() -> None:
        """The hashes match: put the file in place before the sender is told it is there."""
        finish(keep=True)

    cpu0 = time.process_time()
    watch = PlaneWatch(conn)
    watch.start()
    result = None
    try:
        apply_denies(conn, args.deny)
        result = await receive_buffer(conn, view, progress.update, commit, args.idle_timeout)
    except MRCError as exc:
        error = str(exc)
        with contextlib.suppress(MRCError):
            await conn.send_message(Abort(error).to_json())
    finally:
        progress.finish("verified" if result is not None and result.ok else "failed")
        await watch.stop()
        stats = conn.stats()
        counters = conn.counters()
        await conn.close()
        if not finished:
            finish(keep=False)
    ok = result is not None and result.ok
    if result is not None and not result.ok:
        error = result.error or "verification failed"
    out = {
        "ok": ok,
        "role": "recv",
        "from": peer,
        "out": path if not args.discard else None,
        "bytes": result.bytes if result else size,  # a timed sender's rounds, all verified
        "seconds": round(result.seconds, 6) if result else None,
        "goodput_bps": round(result.goodput_bps) if result else None,
        # CPU time of this process since the transfer began (hashing included; with --count
        # N transfers at once it is shared between them)
        "cpu_seconds": round(time.process_time() - cpu0, 4),
        # the end-to-end checksum agreed with the sender (mrc.app.checksum) and both digests
        "checksum": result.checksum if result else None,
        "digest": result.digest if result else None,
        "digest_sender": result.peer_digest if result else None,
        # the counters declared with json=RECV (mrc/core/counters.py)
        **{spec.key: counters[spec.name] for spec in RECEIVED},
        "dropped_by_reason": stats["dropped_by_reason"],
        # planes lost and back, on the data path and the side channel (mrc.cli.planewatch)
        "plane_events": watch.events,
        "error": None if ok else error,
    }
    # written off the event loop (mrc.cli.lineout): a reader slow to drain a pipe must not
    # stall the transfers still running
    if args.json:
        lines.put(sys.stdout, json_text(out))
    elif ok and result is not None:
        lines.put(
            sys.stdout,
            f"ok: received {human_bytes(result.bytes)} from {peer} in {result.seconds:.3f} s "
            f"({human_rate(result.goodput_bps)}); {result.checksum} {result.digest[:16]}... "
            "verified",
        )
    if not ok:  # with --json too: every failure is one line on stderr
        lines.put(sys.stderr, f"{PROG}: error: transfer from {peer} failed: {error}")
    return ok


async def _main(args: argparse.Namespace) -> int:
    endpoints = [parse_endpoint(e) for e in (args.listen or [f"[::]:{DEFAULT_PORT}"])]
    port = endpoints[0][1]
    hosts = [h for h, _p in endpoints]
    key = load_key(args)
    outputs = Outputs(args)
    fabric = load_fabric(args.fabric, args.fabric_host)
    if fabric is not None and hosts == ["::"]:
        hosts = local_plane_addrs(fabric, args.fabric_host) or hosts
    check_host_routes(fabric, hosts)
    plane_addrs = hosts if len(hosts) > 1 or hosts[0] not in ("::", "0.0.0.0") else None
    evlog = EVLog(args.ev_log)
    config = listener_config(
        args,
        args.config,
        plane_addrs=plane_addrs or (),
        key=key,
        fabric=fabric,
        regions=(outputs, outputs.release),
    )
    listener: Listener = await listen(hosts[0], port, config)
    try:
        metrics = await start_metrics(args)
    except BaseException:
        await listener.close()
        raise
    if metrics is not None:
        metrics.exporter.watch_listener(listener)
    # SIGTERM ends the run as Ctrl-C does: through the finally below, so no part file is left
    main_task = asyncio.current_task()
    assert main_task is not None
    terminated = False

    def on_term() -> None:
        nonlocal terminated
        terminated = True
        main_task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)
    log.info("listening on %s", ", ".join(f"[{h}]:{listener.port}" for h in hosts))
    failures = 0
    tasks = []
    lines = LineWriter()
    try:
        for _ in range(args.count):
            try:
                # a sender counts once its data arrives: one that says hello and nothing
                # more is dropped by the listener after --start-timeout, its slot kept
                conn = await listener.accept(args.timeout, started=True)
            except TimeoutError:
                raise MRCError(_no_sender(args.timeout, outputs)) from None
            tasks.append(asyncio.ensure_future(_one(conn, outputs, args, evlog, lines)))
        for ok in await asyncio.gather(*tasks):
            failures += 0 if ok else 1
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await listener.close()
        if metrics is not None:
            await metrics.close()
        outputs.remove_all()
        evlog.close()
        lines.close()  # every transfer is over: waiting on a slow reader stalls nothing now
    return 1 if failures else 0


def _no_sender(timeout: float, outputs: Outputs) -> str:
    """Why --timeout ran out: nobody came, or those who came were refused (and why)."""
    if not outputs.refused:
        return f"no sender connected within {timeout:g} s"
    return (
        f"no transfer started within {timeout:g} s: {outputs.refused} sender(s) refused, the "
        f"last because: {outputs.last_refusal}"
    )


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see on its own (exit status 2)."""
    usable = usable_memory()
    if args.max_memory is not None and usable is not None and args.max_memory > usable:
        parser.error(
            f"--max-memory {human_bytes(args.max_memory)} is more than this machine's memory "
            f"({human_bytes(usable)})"
        )
    ports = {parse_endpoint(e)[1] for e in args.listen or []}
    if len(ports) > 1:
        parser.error("all --listen addresses must use the same port")
    if args.out and args.count > 1 and "{n}" not in args.out:
        parser.error("with --count > 1, --out needs a {n} placeholder in the file name")
    if args.out:
        try:
            check_out_dir(args.out)
            if "{n}" not in args.out:
                check_target(args.out, args.force)
        except MRCError as exc:
            parser.error(f"--out {args.out}: {exc}")
    if args.discard_window < MIN_WINDOW:
        parser.error(f"--discard-window: at least {MIN_WINDOW >> 20}M, not {args.discard_window}")
    try:
        args.config = receiver_qp(args)
    except ValueError as exc:
        parser.error(f"--qp: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args)
    log.info("receive kernel: %s", fastpath.describe())  # -v: native, or python and why
    _check_usage(parser, args)
    check_metrics_usage(parser, args)
    if args.out:
        _warn_stale_parts(args.out)
    answer = JsonAnswer("recv", args.json)
    return run_command(PROG, _main(args), answer, args.scheduling)


def _warn_stale_parts(out: str) -> None:
    """Name the part files a killed receiver left in ``--out``'s directory (for any ``--out``),
    and how to remove them: nobody else ever will, and each can be as large as its transfer.
    Nothing is removed here. What could not be looked at is said with -v, one line each."""
    found = stale_parts(out)
    for note in found.notes:
        log.info("%s", note)
    if found.unchecked:
        log.info(
            "%d part file(s) could not be opened to check whether they are stale", found.unchecked
        )
    if found.paths:
        log.warning(
            "%s%d part file(s) left by a receiver that is gone (their transfers never completed)"
            "%s; remove with: rm -- %s",
            "" if found.complete else "at least ",
            found.count,
            f" (the first {len(found.paths)} named here)" if found.more else "",
            " ".join(shell_word(p) for p in found.paths),
        )


if __name__ == "__main__":
    sys.exit(main())
