"""What may cross a launched ``mrc-bench``'s control connections, checked field by field.

The control connections (mrc/lab/bench/launched.py) carry JSON lines between hosts, so every
line is untrusted input: a stranger may reach the port, and a rank must never take code from
it. Each message is checked here against a small schema before anything uses it: its keys (no
unknown ones), each value's type (a boolean is not a number: ``True`` is not rank 1), ranges
and lengths. A line that breaks it raises :class:`Refused`, one line saying which field and
why; the side that reads it answers ``{"ok": false, "error": ...}``, counts it and goes on.

Hand-written rather than JSON Schema: a dozen small messages, checks that depend on the
world size, and no dependency for a rank to install.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from mrc.errors import MRCError

PROTOCOL = 2  # the hello's version: 2 is the challenge-response hello (1 sent the token)
WORLD_MAX = 1 << 16
PLANES_MAX = 16
NAME_MAX = 300  # a host name (255 at most) and "/rank"
ADDR_MAX = 64  # an IPv6 address's text, with a scope
ERROR_MAX = 1024  # an error message in a reply (longer ones are cut)
SIZE_MAX = 256 << 20  # bytes per transfer (mrc-bench --size and --pair-size at most)
SECONDS_MAX = 86400.0
QP_MAX = 64  # --qp settings in a listen or connect request
QP_TEXT_MAX = 1024
INT_MAX = (1 << 63) - 1
NUM_MAX = float(1 << 63)  # a counter or a time: a float() of it never overflows
DEPTH_MAX = 6  # the deepest legitimate message (init: object, list, object, list) is 4
TRANSPORTS = ("mrc", "tcp", "mptcp")

#: a line of the hello exchange at most (the largest, a rank's hello with 16 planes of the
#: longest addresses and a 255-character host name, is under 2 KiB)
HELLO_LINE_MAX = 8 << 10
#: the read-ahead of a control connection's reader: what a silent peer can make it hold
READ_LIMIT = 16 << 10


def line_max(world: int) -> int:
    """The longest line a control connection of a ``world``-rank job takes after the hello:
    requests and replies grow with the ranks (init's peer table, a step's sends, verify's
    hashes), at most about 1 KiB per rank with 16 planes (measured in
    tests/lab/test_bench_control.py), plus the --qp settings; twice that, for headroom."""
    return (256 << 10) + (2 << 10) * max(world, 2)


class Refused(MRCError):
    """A control message that breaks its schema, or asks for something a rank never does."""


class LineTooLong(Refused):
    """A line past its cap (the rest of it was skipped, or the connection is to be closed)."""


Check = Callable[[Any, str], Any]


# ---- reading lines ---------------------------------------------------------------------------


async def read_line(reader: asyncio.StreamReader, cap: int, skip_long: bool = False) -> bytes:
    """The next line from ``reader`` (b"" at the end of the stream), never holding more than
    ``cap`` bytes of it. A longer line raises :class:`LineTooLong`: at once (the caller drops
    the connection), or with ``skip_long`` once the rest of it has been read and dropped, so
    that the next line can be read."""
    parts: list[bytes] = []
    size = 0
    too_long = False
    while True:
        try:
            chunk = await reader.readuntil(b"\n")
            end = True
        except asyncio.LimitOverrunError as exc:
            chunk = await reader.readexactly(exc.consumed)
            end = False
        except asyncio.IncompleteReadError as exc:  # the stream ended mid-line
            chunk, end = exc.partial, True
            if not chunk and not parts and not too_long:
                return b""
        size += len(chunk)
        if size > cap:
            if not skip_long:
                raise LineTooLong(f"a line longer than {cap} bytes")
            too_long = True
            parts.clear()
        elif not too_long:
            parts.append(chunk)
        if end:
            if too_long:
                raise LineTooLong(f"a line longer than {cap} bytes (skipped)")
            return b"".join(parts)


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a number here")


def parse_line(line: bytes) -> dict[str, Any]:
    """One JSON object from ``line``, nested at most :data:`DEPTH_MAX` deep; :class:`Refused`
    otherwise (no NaN or Infinity, and never a RecursionError)."""
    try:
        obj = json.loads(line, parse_constant=_no_constant)
    except RecursionError:
        raise Refused(f"JSON nested deeper than {DEPTH_MAX} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(f"not a JSON line ({str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise Refused(f"a JSON object was expected, not {type(obj).__name__}")
    if _depth(obj) > DEPTH_MAX:
        raise Refused(f"JSON nested deeper than {DEPTH_MAX} levels")
    return obj


def _depth(obj: object) -> int:
    deepest, todo = 0, [(obj, 1)]
    while todo:
        item, d = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, d)
            if d <= DEPTH_MAX:
                todo.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


# ---- field checkers --------------------------------------------------------------------------


def _where(path: str) -> str:
    return path or "the message"


def integer(lo: int = -INT_MAX - 1, hi: int = INT_MAX) -> Check:
    def check(v: Any, path: str) -> int:
        if type(v) is not int:  # bool is a subclass of int, and not a number here
            raise Refused(f"{_where(path)} must be an integer, not {_show(v)}")
        if not lo <= v <= hi:
            raise Refused(f"{_where(path)} must be in {lo}..{hi}, not {v}")
        return v

    return check


def number(lo: float = -NUM_MAX, hi: float = NUM_MAX) -> Check:
    """An int or float (not a bool), finite, in [lo, hi]; an int stays an int (a counter)."""

    def check(v: Any, path: str) -> Any:
        if type(v) not in (int, float) or (type(v) is float and not math.isfinite(v)):
            raise Refused(f"{_where(path)} must be a finite number, not {_show(v)}")
        if not lo <= v <= hi:  # an int compares exactly, however large
            raise Refused(f"{_where(path)} must be in {lo:g}..{hi:g}, not {_show(v)}")
        return v

    return check


def boolean(v: Any, path: str) -> bool:
    if type(v) is not bool:
        raise Refused(f"{_where(path)} must be true or false, not {_show(v)}")
    return v


def text(max_len: int, min_len: int = 0, pattern: str | None = None) -> Check:
    """A string of ``min_len``..``max_len`` printable characters (matching ``pattern``)."""
    rx = re.compile(pattern) if pattern else None

    def check(v: Any, path: str) -> str:
        if type(v) is not str:
            raise Refused(f"{_where(path)} must be a string, not {_show(v)}")
        if not min_len <= len(v) <= max_len:
            want = max_len if min_len == max_len else f"{min_len}..{max_len}"
            raise Refused(f"{_where(path)} must be {want} characters, not {len(v)}")
        if not v.isprintable() or (rx is not None and not rx.fullmatch(v)):
            raise Refused(f"{_where(path)}: {_show(v)} is not allowed here")
        return v

    return check


def message(v: Any, path: str) -> str:
    """An error message: any string, cut to :data:`ERROR_MAX` characters, its control
    characters (a terminal's escapes, newlines) made spaces, as it will be printed."""
    if type(v) is not str:
        raise Refused(f"{_where(path)} must be a string, not {_show(v)}")
    return "".join(c if c.isprintable() else " " for c in v[:ERROR_MAX])


def const(*values: object) -> Check:
    def check(v: Any, path: str) -> Any:
        if not any(type(v) is type(x) and v == x for x in values):
            want = " or ".join(json.dumps(x) for x in values)
            raise Refused(f"{_where(path)} must be {want}, not {_show(v)}")
        return v

    return check


def address(v: Any, path: str) -> str:
    """An IP address's text (a plane address: never a name to resolve)."""
    text(ADDR_MAX, 2)(v, path)
    try:
        ipaddress.ip_address(v)
    except ValueError:
        raise Refused(f"{_where(path)}: {_show(v)} is not an IP address") from None
    return str(v)


def optional(inner: Check) -> Check:
    """``inner``, or null."""

    def check(v: Any, path: str) -> Any:
        return None if v is None else inner(v, path)

    return check


def array(item: Check, max_len: int, min_len: int = 0) -> Check:
    def check(v: Any, path: str) -> list[Any]:
        if type(v) is not list:
            raise Refused(f"{_where(path)} must be a list, not {_show(v)}")
        if not min_len <= len(v) <= max_len:
            raise Refused(f"{_where(path)} must have {min_len}..{max_len} items, not {len(v)}")
        return [item(x, f"{path}[{i}]") for i, x in enumerate(v)]

    return check


def table(key: Check, value: Check, max_len: int) -> Check:
    """An object used as a map: any keys that pass ``key``, values that pass ``value``."""

    def check(v: Any, path: str) -> dict[str, Any]:
        if type(v) is not dict:
            raise Refused(f"{_where(path)} must be an object, not {_show(v)}")
        if len(v) > max_len:
            raise Refused(f"{_where(path)} must have at most {max_len} entries, not {len(v)}")
        return {key(k, _join(path, "(key)")): value(x, _join(path, k)) for k, x in v.items()}

    return check


def record(required: Mapping[str, Check], optional: Mapping[str, Check] | None = None) -> Check:
    """An object with exactly these keys: every one of ``required``, any of ``optional``,
    nothing else."""
    opt = dict(optional or {})

    def check(v: Any, path: str) -> dict[str, Any]:
        if type(v) is not dict:
            raise Refused(f"{_where(path)} must be an object, not {_show(v)}")
        for k in v:
            if k not in required and k not in opt:
                raise Refused(f"unknown field {_show(_join(path, k))}")
        for k in required:
            if k not in v:
                raise Refused(f"{_join(path, k)} is missing")
        return {k: (required.get(k) or opt[k])(x, _join(path, k)) for k, x in v.items()}

    return check


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, str | int | float | bool | None) else type(v).__name__
    return s if len(s) <= 60 else s[:57] + "..."


def hexstr(n: int) -> Check:
    return text(n, n, "[0-9a-f]+")


NONCE = hexstr(32)
PROOF = text(64, 0, "(?:[0-9a-f]{64})?")  # HMAC-SHA256; "" without a job token
ERROR = message
ID = integer(0, INT_MAX)
TRANSPORT = const(*TRANSPORTS)
SECONDS = number(0.0, SECONDS_MAX)
NAME = text(NAME_MAX, 1)
LABEL = text(256)
COUNT = integer(0, INT_MAX)


# ---- the hello exchange ----------------------------------------------------------------------


#: a rank's first line: who it says it is and its challenge to rank 0 (no secret in it)
HELLO = record(
    {
        "hello": const(PROTOCOL),
        "rank": integer(0, WORLD_MAX),
        "world": integer(2, WORLD_MAX),
        "nonce": NONCE,
    }
)

#: rank 0's answer: its challenge and its proof of the job token (or a refusal)
CHALLENGE = record(
    {"ok": boolean},
    {"hello": const(PROTOCOL), "nonce": NONCE, "proof": PROOF, "error": ERROR},
)

#: the rest of a rank's hello, sent once rank 0 has proved the token: its proof and planes
HELLO_BODY = record(
    {
        "proof": PROOF,
        "name": NAME,
        "addrs": array(address, PLANES_MAX, 1),
        "mtus": array(optional(integer(68, 1 << 20)), PLANES_MAX),
        "net_admin": boolean,
        "pid": integer(1, INT_MAX),
    }
)

ANSWER = record({"ok": boolean}, {"error": ERROR})


# ---- requests (rank 0 to a rank) -------------------------------------------------------------

OPTS = record(
    {},
    {
        "evs": integer(1, 1 << 16),
        "listener_evs": integer(1, 1 << 16),
        "qp": array(text(QP_TEXT_MAX), QP_MAX),
        "timeout": SECONDS,
        "side_plane": integer(0, PLANES_MAX - 1),
        "subflow_wait": number(0.0, 3600.0),
    },
)


@functools.cache
def requests(world: int) -> dict[str, Check]:
    """Each request's schema in a ``world``-rank job (``id`` and ``op`` included)."""
    rank = integer(0, world - 1)
    ranks = array(rank, world)
    transfers = array(array(integer(0, SIZE_MAX), 2, 2), world)
    peer = record({"rank": rank, "name": NAME, "addrs": array(address, PLANES_MAX, 1)})

    def req(fields: Mapping[str, Check], opt: Mapping[str, Check] | None = None) -> Check:
        # no id: rank 0's own part, served in-process (the connections always number them)
        return record({"op": text(16), **fields}, {"id": ID, **(opt or {})})

    return {
        "ping": req({}),
        "exit": req({}),
        "fault": req({}),
        "heal": req({}),
        "init": req(
            {
                "peers": array(peer, world, world),
                "max_size": integer(1, SIZE_MAX),
                "seed": integer(),
            }
        ),
        "listen": req({"transport": TRANSPORT}, {"opts": OPTS}),
        "connect": req({"transport": TRANSPORT, "peers": ranks, "expect": ranks}, {"opts": OPTS}),
        "step": req(
            {"transport": TRANSPORT, "k": integer(0, INT_MAX)},
            {"timeout": SECONDS, "sends": transfers, "recvs": transfers},
        ),
        "verify": req({"k": integer(0, INT_MAX)}),
        "stats": req({"transport": TRANSPORT}),
        "close": req({"transport": TRANSPORT}),
    }


def check_request(msg: dict[str, Any], world: int) -> dict[str, Any]:
    """``msg`` if it is one of the requests a rank serves, well formed; else :class:`Refused`."""
    op = msg.get("op")
    schema = requests(world).get(op) if isinstance(op, str) else None
    if schema is None:
        raise Refused(f"unknown request {_show(op)}")
    out: dict[str, Any] = schema(msg, "")
    return out


# ---- replies (a rank to rank 0) --------------------------------------------------------------

_NUM = number()
_COUNTERS = table(LABEL, _NUM, 512)  # dropped_by_reason, ev_transitions


def _stat(v: Any, path: str) -> Any:
    """A transport counter: a number, or a table of them."""
    return _COUNTERS(v, path) if isinstance(v, dict) else _NUM(v, path)


@functools.cache
def replies(world: int) -> dict[str, Check]:
    """Each successful reply's schema in a ``world``-rank job, by the request's op."""
    rank_key = text(8, 1, "[0-9]+")
    head = {"id": ID, "ok": const(True)}
    subflows = table(LABEL, optional(integer(0, 1 << 16)), world)
    stat_fields = record(head, {"subflows": subflows})
    some_stats = table(LABEL, _stat, 256)

    def rep(fields: Mapping[str, Check], opt: Mapping[str, Check] | None = None) -> Check:
        return record({**head, **fields}, opt)

    def stats(v: Any, path: str) -> Any:
        """Counters by name: which ones depends on the transport (MrcTransport.stats)."""
        if type(v) is not dict:
            raise Refused(f"{_where(path)} must be an object, not {_show(v)}")
        known = {k: x for k, x in v.items() if k in head or k == "subflows"}
        return {
            **some_stats({k: x for k, x in v.items() if k not in known}, path),
            **stat_fields(known, path),
        }

    hashes = table(rank_key, hexstr(64), world)
    return {
        "ping": rep(
            {"now": _NUM},
            {"host": NAME, "addrs": array(address, PLANES_MAX), "pid": integer(1, INT_MAX)},
        ),
        "exit": rep({}),
        "init": rep({}),
        "fault": rep({}, {"t": _NUM}),
        "heal": rep({}, {"t": _NUM}),
        "listen": rep({}, {"port": integer(0, 65535), "mptcp": array(text(512), 64)}),
        "connect": rep(
            {},
            {
                "evs": table(rank_key, integer(0, 1 << 16), world),
                "routes": array(text(256), 4096),
                "subflows": subflows,
            },
        ),
        "step": rep(
            {
                "t_cmd": _NUM,
                "done": table(text(32, 1, "(send|recv):h[0-9]+"), _NUM, 2 * world),
                "errors": array(ERROR, 2 * world + 8),
            }
        ),
        "verify": rep({"sent": hashes, "recv": hashes}),
        "stats": stats,
        "close": rep({}),
    }


_FAILED = record({"id": ID, "ok": const(False)}, {"error": ERROR})


def check_reply(op: str, reply: dict[str, Any], world: int) -> dict[str, Any]:
    """``reply`` to a request ``op`` if well formed, a success or a refusal (``ok`` false and
    an error); else :class:`Refused`."""
    schema = _FAILED if reply.get("ok") is False else replies(world).get(op)
    if schema is None:
        raise Refused(f"a reply to {_show(op)}, which is no request")
    out: dict[str, Any] = schema(reply, "")
    return out
