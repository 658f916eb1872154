"""Fuzzing the side channel: hostile bursts against one real listener on loopback.

Each example is a burst of connections opened at once, each saying something generated:
hellos with fields set to random or extreme JSON (huge, negative, 1e999, NaN, wrong types,
nested junk, unicode, long strings), random bytes, truncated JSON, lines cut off by a close,
lines over the 1 MiB limit, a valid hello followed by garbage, or nothing at all; then each
ends by closing, half-closing, or staying to read.

What must hold, whatever was said: every connection that stays to read gets one line (a
refusal with a non-empty one-line reason) and is hung up on, or a welcome followed by an abort
with a reason once its silent sender's start timeout passes; nothing raises in the event loop
(no handler exception, no "exception was never retrieved"); every region made for a sender
that never started is released; file descriptors and memory come back; and afterwards a real
sender still connects and writes, verified by hash.

Derandomized by default (a fixed set of bursts, a few seconds); MRC_FUZZ_EXAMPLES=N draws N
random bursts instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mrc
from mrc.connection import Listener
from mrc.transport.control import MAX_LINE
from mrc.transport.messages import Hello, RegionRequest, RemoteRegion

HOST = "::1"
_FUZZ_EXAMPLES = int(os.environ.get("MRC_FUZZ_EXAMPLES", "0"))
FACTORY_MAX = 256 << 10  # the factory refuses larger requests with a reason of its own

# ---- what to say -------------------------------------------------------------------------

HELLO = Hello(
    qpn=0x123456,
    psn=7,
    udp_port=9,
    addrs=(HOST,),
    evs=4,
    psn_window=1024,
    regions=(RemoteRegion("mine", 5, 1 << 32, 4096),),
    request=RegionRequest(1000, "file"),
    checksums=("blake3", "xxh3-128", "sha256"),
).to_json()

EXTREME_NUMBERS = [
    "0",
    "-1",
    "1",
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "1.5",
    "-0.0",
    "16777215",
    "16777216",
    "65535",
    "65536",
    str(1 << 48),
    str((1 << 48) + 1),
    str(1 << 64),
    str(-(1 << 63)),
    "9" * 400,
    "true",
    "null",
    '""',
    "[]",
    "{}",
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0x80), min_size=1, max_size=8),  # unicode
    st.sampled_from(["x" * 5000, "\u2603" * 3000, "::1", "fe80::1%lo", "1.2.3.4", "\x00"]),
)
json_junk = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "mrc",
    "qpn",
    "psn",
    "udp_port",
    "addrs",
    "evs",
    "psn_window",
    "regions",
    "request",
    "checksums",
]
NESTED = [
    "request.size",
    "request.name",
    "regions.0.rkey",
    "regions.0.length",
    "regions.0.addr",
    "checksums.0",
]
# a field's value: JSON text as is (so 1e999 and 9...9 reach the parser as written), or junk
values = st.sampled_from(EXTREME_NUMBERS) | json_junk.map(json.dumps)
# in range, so that some hellos are valid and reach the limits and the allocator
good_sizes = st.sampled_from([0, 1, 1000, 64 << 10, FACTORY_MAX, FACTORY_MAX + 1, 1 << 30])


def hello_with(changes: dict[str, str], size: int, drop: list[str]) -> bytes:
    obj: dict[str, Any] = json.loads(json.dumps(HELLO))
    obj["request"]["size"] = size
    for key in drop:
        obj.pop(key, None)
    raw: dict[str, str] = {}
    for i, (path, text) in enumerate(changes.items()):
        *parents, key = path.split(".")
        inner: Any = obj
        for p in parents:
            inner = inner[int(p)] if isinstance(inner, list) else inner.setdefault(p, {})
            if not isinstance(inner, dict | list):
                break
        else:
            marker = f"__RAW{i}__"
            if isinstance(inner, list):
                inner[int(key)] = marker
            else:
                inner[key] = marker
            raw[marker] = text
    line = json.dumps(obj)
    for marker, text in raw.items():
        line = line.replace(f'"{marker}"', text)
    return line.encode() + b"\n"


@st.composite
def hellos(draw: st.DrawFn) -> bytes:
    fields = st.dictionaries(st.sampled_from(FIELDS + NESTED), values, min_size=1, max_size=3)
    changes = draw(st.just({}) | fields)  # half of them well formed: on to the limits
    drop = draw(st.lists(st.sampled_from(FIELDS), max_size=2))
    return hello_with(changes, draw(good_sizes), drop)


@st.composite
def truncated(draw: st.DrawFn) -> bytes:
    line = json.dumps(HELLO).encode()
    return line[: draw(st.integers(0, len(line) - 1))] + b"\n"


oversized = st.sampled_from([MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 2 * MAX_LINE])


@dataclass
class Peer:
    """One connection of a burst: what it says and how it ends."""

    kind: str
    payload: bytes
    ending: str  # "read": read until hung up; "half": write_eof, then read; "close": go
    pad: int = 0  # then this many bytes more inside a string (made when sent, not kept)

    def line(self) -> bytes:
        if not self.pad:
            return self.payload
        return self.payload + b'{"mrc": 3, "pad": "' + b"a" * self.pad + b'"}\n'


payloads = st.one_of(
    hellos().map(lambda b: ("hello", b)),
    hellos().map(lambda b: ("hello", b)),  # (twice as likely: hellos go furthest)
    st.binary(max_size=300).map(lambda b: ("bytes", b)),
    st.binary(min_size=1, max_size=300).map(lambda b: ("unterminated", b.replace(b"\n", b""))),
    truncated().map(lambda b: ("truncated", b)),
    st.tuples(hellos(), st.binary(max_size=200)).map(lambda t: ("hello+garbage", t[0] + t[1])),
    st.just(("silent", b"")),
)
peers = st.builds(
    lambda p, ending: Peer(p[0], p[1], ending),
    payloads,
    st.sampled_from(["read", "read", "half", "close"]),
)
bursts = st.tuples(
    st.lists(peers, min_size=4, max_size=40),
    st.lists(oversized.map(lambda n: Peer("oversized", b"", "read", n)), max_size=1),
).map(lambda t: t[0] + t[1])


# ---- the listener and what it must never do ----------------------------------------------


@dataclass
class Ledger:
    made: dict[int, bytearray] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)

    def factory(self, size: int, _request: dict[str, object]) -> bytearray:
        if size > FACTORY_MAX:
            raise mrc.MRCError(f"{size} bytes is more than this test allocates")
        buf = bytearray(max(size, 1))
        self.made[id(buf)] = buf
        return buf

    def release(self, buf: object) -> None:
        assert isinstance(buf, bytearray) and id(buf) in self.made, "released what was not made"
        self.freed.append(id(buf))
        del self.made[id(buf)]


@dataclass
class Outcome:
    peer: Peer
    lines: list[dict[str, Any]]
    partial: bytes
    error: str | None = None


async def run_peer(port: int, peer: Peer) -> Outcome:
    reader, writer = await asyncio.open_connection(HOST, port, limit=4 * MAX_LINE)
    data = b""
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(peer.line())
            await writer.drain()
            if peer.ending == "half":
                writer.write_eof()
        if peer.ending != "close":
            with contextlib.suppress(ConnectionResetError):
                while chunk := await asyncio.wait_for(reader.read(65536), 5.0):
                    data += chunk
    except TimeoutError:
        return Outcome(peer, [], data, "the listener neither answered nor hung up in 5 s")
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    *complete, partial = data.split(b"\n")
    return Outcome(peer, [json.loads(line) for line in complete], partial)


def check(outcome: Outcome) -> None:
    """A refusal with a reason and nothing more, or a welcome then an abort with a reason;
    or (a reset after an oversized line, or a peer that went away) nothing at all."""
    peer, lines = outcome.peer, outcome.lines
    where = f"{peer.kind}/{peer.ending}/{peer.pad}: {peer.payload[:120]!r} -> {lines}"
    assert outcome.error is None, f"{outcome.error}: {where}"
    assert outcome.partial == b"", f"a partial line: {where}"
    if peer.ending == "close" or not lines:
        assert peer.ending == "close" or peer.kind == "oversized" or not lines, where
        return
    first = lines[0]
    assert first.get("mrc") == 3, where
    if first["ok"] is False:
        error = first["error"]
        assert isinstance(error, str) and error.strip() and "\n" not in error, where
        assert len(lines) == 1, where
    else:
        assert first["ok"] is True and peer.kind in ("hello", "hello+garbage"), where
        assert len(lines) == 2, where
        # after set-up messages are numbered (mrc.transport.sidechannel)
        assert lines[1] == {
            "n": 0,
            "m": {"error": "no data from the sender within 0.25 s of set-up; connection dropped"},
        }, where


def rss() -> int:
    """Resident memory, after handing glibc's free heap back (the 1 MiB line buffers of
    oversized messages leave free heap behind that malloc keeps, and that is not a leak)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def drained(listener: Listener, ledger: Ledger, baseline_fds: int) -> None:
    """Wait until nothing is held (no event announces it: poll, bounded)."""
    deadline = time.monotonic() + 5
    while True:
        usage = listener.usage()
        idle = usage["setups"] == 0 and usage["connections"] == 0 and not ledger.made
        if idle and open_fds() <= baseline_fds:
            return
        assert time.monotonic() < deadline, (usage, len(ledger.made), open_fds(), baseline_fds)
        await asyncio.sleep(0.01)


def test_hostile_bursts_leave_the_listener_whole(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")
    loop = asyncio.new_event_loop()
    loop_errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    ledger = Ledger()
    listener = loop.run_until_complete(
        mrc.listen(
            HOST,
            0,
            mrc.ListenerConfig(
                evs=4,
                region_factory=ledger.factory,
                region_release=ledger.release,
                max_setups=24,
                max_connections=8,
                max_granted_bytes=1 << 20,
                setup_timeout=0.5,
                start_timeout=0.25,
            ),
        )
    )
    stats = {"connections": 0, "bursts": 0, "welcomed": 0, "refused": 0, "seconds": 0.0}
    replay: list[Peer] = []  # refused at once: replayed at the end to measure the rate
    refusals: dict[str, int] = {}
    baseline: dict[str, int] = {}

    async def burst(peers: list[Peer]) -> list[Outcome]:
        t0 = time.monotonic()
        outcomes = await asyncio.gather(*(run_peer(listener.port, p) for p in peers))
        for outcome in outcomes:
            check(outcome)
            if outcome.lines:
                ok = outcome.lines[0]["ok"]
                stats["welcomed" if ok else "refused"] += 1
                reason = str(outcome.lines[0].get("error", ""))
                # (refusals of the parser, not of the limits or timeouts: the same each time)
                at_once = not reason.startswith(
                    ("set-up did not", "set-up dropped", "no hello", "too many", "cannot grant")
                )
                if not ok and at_once and len(replay) < 400:
                    replay.append(outcome.peer)
                if not ok:
                    reason = str(outcome.lines[0]["error"]).split(":")[0][:40]
                    refusals[reason] = refusals.get(reason, 0) + 1
        await drained(listener, ledger, baseline["fds"])
        stats["seconds"] += time.monotonic() - t0
        stats["connections"] += len(peers)
        stats["bursts"] += 1
        assert not loop_errors, loop_errors
        return outcomes

    @settings(
        derandomize=not _FUZZ_EXAMPLES,
        max_examples=_FUZZ_EXAMPLES or 20,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(bursts)
    def fuzz(peers: list[Peer]) -> None:
        loop.run_until_complete(burst(peers))

    try:
        # warm up (first-use allocations), then measure from there
        warm = [Peer("hello", hello_with({}, 1000, []), "read"), Peer("silent", b"", "read")]
        baseline["fds"] = open_fds()
        loop.run_until_complete(burst(warm))
        gc.collect()
        rss_before = rss()
        # a flood beyond max_setups and max_connections: silence in every set-up slot, then
        # hellos at once
        silent = [Peer("silent", b"", "read") for _ in range(30)]
        hellos_ = [Peer("hello", hello_with({}, 4096, []), "read") for _ in range(30)]

        async def flood() -> list[Outcome]:
            quiet = asyncio.ensure_future(burst(silent))
            while listener.usage()["setups"] < 24:  # (no event says the slots are taken)
                await asyncio.sleep(0.005)
            return [*await burst(hellos_), *await quiet]

        answers = [o.lines[0] for o in loop.run_until_complete(flood())]
        # the silent ones give way to the hellos (and time out after 0.5 s), 30 welcomed ones
        # hold connection slots for 0.25 s: both limits must have refused some, and let no more
        # than the limit through
        errors = [str(a.get("error")) for a in answers]
        dropped = "set-up dropped for a newer connection: all 24 set-up slots were taken"
        assert any(e.startswith(dropped) for e in errors), errors
        assert "too many connections (limit 8)" in errors, errors
        assert errors.count("set-up did not finish within 0.5 s") <= 24
        assert 1 <= [a["ok"] for a in answers].count(True) <= 8
        fuzz()
        gc.collect()
        loop.run_until_complete(drained(listener, ledger, baseline["fds"]))
        rss_after = rss()
        assert open_fds() == baseline["fds"]
        assert ledger.made == {}, "regions made for senders that never started, not released"
        # every refusal of the limits and the parser left the listener able to take a sender
        data = os.urandom(200_000)

        async def real_sender() -> str:
            async with await mrc.connect(
                HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=len(data))
            ) as c:
                assert c.requested is not None
                await c.write(data, c.requested)
                peer = await listener.accept(timeout=5, started=True)
                assert peer.granted is not None
                digest = hashlib.sha256(peer.granted.view[: len(data)]).hexdigest()
                await peer.close()
                return digest

        assert loop.run_until_complete(real_sender()) == hashlib.sha256(data).hexdigest()

        async def replayed() -> float:
            t0 = time.monotonic()
            for i in range(0, len(replay), 20):  # (20 at a time: under max_setups)
                for outcome in await asyncio.gather(
                    *(run_peer(listener.port, p) for p in replay[i : i + 20])
                ):
                    check(outcome)
                    assert outcome.peer.ending == "close" or outcome.lines[0]["ok"] is False
            return time.monotonic() - t0

        replay_seconds = loop.run_until_complete(replayed())
    finally:
        loop.run_until_complete(listener.close())
        gc.collect()  # (a task dropped with its exception unread is reported here)
        loop.close()
    assert not loop_errors, loop_errors
    bad = [
        r.getMessage()
        for r in caplog.records
        if "never retrieved" in r.getMessage() or "Unhandled exception" in r.getMessage()
    ]
    assert bad == []
    assert rss_after - rss_before < 32 << 20, (rss_before, rss_after)
    print(
        f"\nside-channel fuzz: {stats['bursts']} bursts, {stats['connections']} connections "
        f"({stats['welcomed']} welcomed, {stats['refused']} refused) in {stats['seconds']:.2f} s "
        f"(timeouts included); {len(replay)} refused inputs replayed in {replay_seconds:.2f} s, "
        f"{len(replay) / max(replay_seconds, 1e-9):.0f}/s; RSS {rss_before >> 20} -> "
        f"{rss_after >> 20} MiB; refusals {dict(sorted(refusals.items(), key=lambda kv: -kv[1]))}"
    )
