"""mrc-recv: accept MRC transfers straight into an output file (or memory)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import mmap
import os
import sys
from typing import cast

from mrc.cli.common import (
    Parser,
    Progress,
    emit_json,
    endpoint_arg,
    human_bytes,
    human_rate,
    parse_endpoint,
    positive_int,
    run_command,
    size_arg,
)
from mrc.cli.pathopts import EVLog, add_path_args, apply_denies, load_fabric, local_plane_addrs
from mrc.connection import Connection, Listener, listen
from mrc.errors import MRCError
from mrc.transfer import receive_buffer
from mrc.units import SIZE_HELP
from mrc.wire import DEFAULT_PORT

PROG = "mrc-recv"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Receive MRC transfers from mrc-send. Each packet is written straight to "
        "its offset in an mmap of the output file (write-to-offset), in whatever order it "
        "arrives; the result is verified with SHA-256 against the sender's.",
        epilog="Exit status: 0 every transfer verified, 1 a transfer failed, 2 bad usage.",
    )
    p.add_argument(
        "--listen",
        action="append",
        metavar="[ADDR]:PORT",
        type=endpoint_arg,
        help="address and port to listen on (UDP data and the TCP side channel); "
        f"repeat once per plane address. Default [::]:{DEFAULT_PORT}",
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument(
        "--out",
        metavar="FILE",
        help="write the data here ({n} in the name is replaced by the transfer "
        "number when --count > 1); written as FILE.part and renamed when verified",
    )
    out.add_argument(
        "--discard",
        action="store_true",
        help="receive into memory, verify, and throw the data away",
    )
    p.add_argument(
        "--count",
        type=positive_int,
        default=1,
        help="transfers to accept before exiting; they may run at once (default 1)",
    )
    p.add_argument(
        "--evs",
        type=positive_int,
        default=16,
        help="entropy values for acknowledgements, split across planes (default 16)",
    )
    p.add_argument(
        "--max-size",
        type=size_arg,
        default=64 << 30,
        help=f"refuse transfers larger than this (default 64G; {SIZE_HELP})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up if no sender connects within this time",
    )
    add_path_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per transfer")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    return p


POPULATE_LIMIT = 4 << 30


def _populate(size: int, anonymous: bool = False) -> int:
    """mmap flags that fault the whole region in at registration, as RDMA memory registration
    pins its pages: a page fault per arriving packet would otherwise cost about as much as the
    rest of the receive path (measured: half the receiver's CPU). Very large regions are left
    to fault lazily rather than take that much memory up front."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS if anonymous else mmap.MAP_SHARED
    if size <= POPULATE_LIMIT:
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    return flags


class _Outputs:
    """Allocates the memory a sender asks for: an mmap of FILE.part, or anonymous memory."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.count = 0
        self.paths: dict[int, str] = {}  # id(mmap) -> final path

    def __call__(self, size: int, request: dict[str, object]) -> mmap.mmap:
        if size > self.args.max_size:
            raise MRCError(f"transfer of {size} bytes exceeds --max-size {self.args.max_size}")
        self.count += 1
        if self.args.discard:
            return mmap.mmap(-1, max(size, 1), flags=_populate(size, anonymous=True))
        path = self.args.out.replace("{n}", str(self.count))
        part = path + ".part"
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise MRCError(f"cannot create {part}: {exc.strerror}") from None
        try:
            os.ftruncate(fd, size)
            m = mmap.mmap(fd, size, flags=_populate(size)) if size else mmap.mmap(-1, 1)
        except OSError as exc:
            os.unlink(part)
            raise MRCError(f"cannot map {part} ({size} bytes): {exc.strerror}") from None
        finally:
            os.close(fd)
        self.paths[id(m)] = path
        return m


async def _one(conn: Connection, outputs: _Outputs, args: argparse.Namespace, evlog: EVLog) -> bool:
    region = conn.granted
    if region is None:
        await conn.close()
        raise MRCError("a sender connected without asking for a region (not mrc-send?)")
    size = conn.requested_size if conn.requested_size is not None else region.length
    view = region.view[:size]
    buf = cast(mmap.mmap, region.view.obj)  # _Outputs hands out nothing but mmaps
    path = outputs.paths.get(id(buf))
    peer = conn.peer_host
    progress = Progress(size, f"receiving from {peer}", None if not args.no_progress else False)
    evlog.attach(conn, "recv")
    try:
        apply_denies(conn, args.deny)
        result = await receive_buffer(conn, view, progress.update)
    except MRCError as exc:
        result = None
        error = str(exc)
    finally:
        progress.finish()
        stats = conn.stats()
        await conn.close()
    ok = result is not None and result.ok
    if path is not None:
        if ok:
            buf.flush()
        del view
        conn.deregister(region)
        buf.close()
        if ok:
            os.replace(path + ".part", path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path + ".part")
    if result is not None and not result.ok:
        error = result.error or "verification failed"
    out = {
        "ok": ok,
        "role": "recv",
        "from": peer,
        "out": path if not args.discard else None,
        "bytes": size,
        "seconds": round(result.seconds, 6) if result else None,
        "goodput_bps": round(result.goodput_bps) if result else None,
        "sha256": result.sha256 if result else None,
        "sha256_sender": result.peer_sha256 if result else None,
        "packets_received": stats["packets_received"],
        "bytes_placed": stats["bytes_placed"],
        "duplicates": stats["duplicates"],
        "trims_seen": stats["trims_seen"],
        "nacks_sent": stats["nacks_sent"],
        "acks_sent": stats["acks_sent"],
        "dropped_by_reason": stats["dropped_by_reason"],
        **conn.ev_counters(),
        "error": None if ok else error,
    }
    if args.json:
        emit_json(out)
    elif ok and result is not None:
        print(
            f"ok: received {human_bytes(size)} from {peer} in {result.seconds:.3f} s "
            f"({human_rate(result.goodput_bps)}); sha256 {result.sha256[:16]}... verified"
        )
    if not ok:  # with --json too: every failure is one line on stderr
        print(f"{PROG}: error: transfer from {peer} failed: {error}", file=sys.stderr)
    return ok


async def _main(args: argparse.Namespace) -> int:
    endpoints = [parse_endpoint(e) for e in (args.listen or [f"[::]:{DEFAULT_PORT}"])]
    port = endpoints[0][1]
    hosts = [h for h, _p in endpoints]
    outputs = _Outputs(args)
    fabric = load_fabric(args.fabric)
    if fabric is not None and hosts == ["::"]:
        hosts = local_plane_addrs(fabric) or hosts
    plane_addrs = hosts if len(hosts) > 1 or hosts[0] not in ("::", "0.0.0.0") else None
    evlog = EVLog(args.ev_log)
    listener: Listener = await listen(
        hosts[0], port, plane_addrs=plane_addrs, evs=args.evs, region_factory=outputs, fabric=fabric
    )
    if sys.stderr.isatty() and not args.json:
        print(f"listening on {', '.join(f'[{h}]:{listener.port}' for h in hosts)}", file=sys.stderr)
    failures = 0
    tasks = []
    try:
        for _ in range(args.count):
            try:
                conn = await listener.accept(args.timeout)
            except TimeoutError:
                raise MRCError(f"no sender connected within {args.timeout:g} s") from None
            tasks.append(asyncio.ensure_future(_one(conn, outputs, args, evlog)))
        for ok in await asyncio.gather(*tasks):
            failures += 0 if ok else 1
    finally:
        for t in tasks:
            t.cancel()
        await listener.close()
        evlog.close()
    return 1 if failures else 0


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see on its own (exit status 2)."""
    ports = {parse_endpoint(e)[1] for e in args.listen or []}
    if len(ports) > 1:
        parser.error("all --listen addresses must use the same port")
    if args.out and args.count > 1 and "{n}" not in args.out:
        parser.error("with --count > 1, --out needs a {n} placeholder in the file name")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_usage(parser, args)
    return run_command(PROG, _main(args))


if __name__ == "__main__":
    sys.exit(main())
