"""The side-channel messages, one frozen dataclass each: the one definition of their schema.

Everything a peer says over the side channel is untrusted input that sizes allocations (EV
sockets, a QP, a granted region) and reaches the core (QPNs, PSNs, windows), so each message
is parsed by one ``from_json(obj)`` that checks every field (exact JSON type, range, length)
*before* anything acts on it, and raises :class:`MessageError` with one line naming the
field. ``to_json()`` gives the object to send. docs/PROTOCOL.md ("Connection setup") documents
these classes; the keys on the wire are the field names below.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NoReturn

from mrc import wire
from mrc.core.config import PSN_WINDOW_MAX, PSN_WINDOW_MIN
from mrc.errors import MRCError
from mrc.transport.control import ControlError

#: 2: after set-up, messages travel numbered over a path per plane (Welcome.join, Join)
#: 3: the end-to-end checksum is negotiated (Hello.checksums, Welcome.checksum), and the
#: transfer's messages carry ``digest`` (of that checksum) where they carried ``sha256``
PROTOCOL_VERSION = 3

U24 = (1 << 24) - 1  # QPNs and PSNs are 24-bit on the wire
U32 = (1 << 32) - 1  # rkeys
U64 = (1 << 64) - 1  # virtual addresses
MAX_REGION_SIZE = 1 << 48  # bytes: region lengths and requested sizes (256 TiB)
#: EVs a connection may ask for: with their backups (a quarter more, mrc.connection), every
#: EV's flow label (its index + 1, mrc/transport/evsockets.py) fits the 16 bits of the EV
MAX_EVS = 52428
#: the largest max_imm a peer may announce (QPConfig.max_imm_dest's bound)
MAX_IMM = 1 << 20
#: the largest start_bytes a welcome may grant (more means no limit anyway)
MAX_START_BYTES = 1 << 40
MAX_PLANES = wire.MAX_PLANES  # addresses in ``addrs``: an ACK's port-state bits
MAX_REGIONS = 1024  # regions announced in one message
MAX_NAME = 1024  # characters of a region name
MAX_TEXT = 4096  # characters of an error message
MAX_STATS = 256  # keys of a ``stats`` object (and of each object nested in it)
MAX_ADDR = 64  # characters of an IP literal (an IPv6 address with a zone index fits)

_SHA256 = re.compile(r"[0-9a-f]{64}")
#: a transfer's digest: 128 bits (xxh3-128) to 256 (BLAKE3, SHA-256), in hex
_DIGEST = re.compile(r"[0-9a-f]{32,64}")
#: the end-to-end checksums a transfer can be verified with (mrc.app.checksum), in the order
#: a sender offers them by default
CHECKSUMS = ("blake3", "xxh3-128", "sha256")
#: a checksum's name as a hello may offer it: one this side may not know is ignored, not
#: refused, so that a newer peer's offer still finds one in common
_CHECKSUM_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,15}")
MAX_CHECKSUMS = 8  # names in a hello's offer
_NONCE = re.compile(r"[0-9a-f]{32}")
MODES = ("integrity", "encrypt")  # mrc.security.packet.Mode values
JSON = dict[str, object]

# values of a ``stats`` object: counters, times, labels, or one level of nested counters
StatValue = int | float | str | bool | None | dict[str, int | float | str | bool | None]


class MessageError(ControlError):
    """A side-channel message that does not follow the schema; the message names the field."""


class Refused(MRCError):
    """A listener refused a set-up (its reason is in the message)."""


class RefusedForNow(Refused):
    """A listener refused a set-up for now (it gave way to a newer connection while the
    set-up slots were full): trying again at once may well succeed."""


def _show(value: object) -> str:
    """A short rendering of a rejected value for the error line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 24 else text[:21] + "..."
    if isinstance(value, str):
        return repr(value) if len(value) <= 24 else repr(value[:21]) + "..."
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class _Fields:
    """Typed, range-checked access to the fields of one JSON object of message ``msg``;
    ``path`` prefixes field names in errors (``regions[2].``)."""

    __slots__ = ("obj", "msg", "path")

    def __init__(self, obj: object, msg: str, path: str = "") -> None:
        if not isinstance(obj, dict):
            what = path.rstrip(".") or "the message"
            self._fail_raw(msg, f"{what} must be an object, not {_show(obj)}")
        self.obj: Mapping[str, object] = obj
        self.msg = msg
        self.path = path

    @staticmethod
    def _fail_raw(msg: str, text: str) -> NoReturn:
        raise MessageError(f"bad {msg}: {text}")

    def fail(self, key: str, want: str, value: object) -> NoReturn:
        self._fail_raw(self.msg, f"{self.path}{key} must be {want}, not {_show(value)}")

    @classmethod
    def of_type(cls, obj: object, kind: str) -> _Fields:
        """The fields of ``obj``, which must be a message whose ``type`` is ``kind``."""
        f = cls(obj, f"{kind} message")
        if f.get("type") != kind:
            f.fail("type", f'"{kind}"', f.get("type"))
        return f

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def get(self, key: str) -> object:
        if key not in self.obj:
            self._fail_raw(self.msg, f"{self.path}{key} is missing")
        return self.obj[key]

    def integer(self, key: str, lo: int, hi: int) -> int:
        value = self.get(key)
        # bool is an int in Python but not in the schema; floats (1e999 too) are not integers
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            self.fail(key, f"an integer in {lo}..{hi}", value)
        return value

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.get(key)
        if not isinstance(value, str) or value not in choices:
            self.fail(key, "one of " + ", ".join(choices), value)
        return value

    def text(self, key: str, max_len: int, pattern: re.Pattern[str] | None = None) -> str:
        value = self.get(key)
        if not isinstance(value, str) or len(value) > max_len:
            self.fail(key, f"a string of at most {max_len} characters", value)
        if pattern is not None and not pattern.fullmatch(value):
            digits = (pattern.pattern.partition("{")[2]).rstrip("}").replace(",", " to ")
            self.fail(key, f"{digits} lowercase hex digits", value)
        return value

    def items(self, key: str, max_len: int) -> list[object]:
        value = self.get(key)
        if not isinstance(value, list) or len(value) > max_len:
            self.fail(key, f"a list of at most {max_len} items", value)
        return value

    def addrs(self, key: str) -> tuple[str, ...]:
        out = []
        for i, item in enumerate(self.items(key, MAX_PLANES)):
            if not isinstance(item, str) or len(item) > MAX_ADDR:
                self.fail(f"{key}[{i}]", "an IP address", item)
            try:
                ipaddress.ip_address(item)
            except ValueError:
                self.fail(f"{key}[{i}]", "an IP address", item)
            out.append(item)
        return tuple(out)

    def names(self, key: str) -> tuple[str, ...]:
        """A list of at most :data:`MAX_CHECKSUMS` checksum names (a hello's offer)."""
        out = []
        for i, item in enumerate(self.items(key, MAX_CHECKSUMS)):
            if not isinstance(item, str) or not _CHECKSUM_NAME.fullmatch(item):
                self.fail(f"{key}[{i}]", "a checksum name (a-z, 0-9, -)", item)
            out.append(item)
        return tuple(out)

    def regions(self, key: str) -> tuple[RemoteRegion, ...]:
        items = self.items(key, MAX_REGIONS)
        return tuple(
            RemoteRegion.from_json(item, self.msg, f"{self.path}{key}[{i}].")
            for i, item in enumerate(items)
        )

    def stats(self, key: str) -> dict[str, StatValue]:
        value = self.get(key)
        out: dict[str, StatValue] = {}
        if not isinstance(value, dict) or len(value) > MAX_STATS:
            self.fail(key, f"an object of at most {MAX_STATS} fields", value)
        for name, item in value.items():
            if isinstance(item, dict):
                if len(item) > MAX_STATS or not all(_scalar(v) for v in item.values()):
                    self.fail(f"{key}.{name}", "an object of numbers or strings", item)
                out[name] = dict(item)
            elif _scalar(item):
                out[name] = item
            else:
                self.fail(f"{key}.{name}", "a number, string, boolean or null", item)
        return out

    def version(self) -> None:
        """The ``mrc`` field: absent means not an MRC peer, another value another version."""
        if "mrc" not in self.obj:
            raise MessageError("peer is not speaking the MRC side-channel protocol")
        if self.obj["mrc"] != PROTOCOL_VERSION or isinstance(self.obj["mrc"], bool):
            raise MessageError(
                f"version mismatch: peer speaks MRC side-channel version "
                f"{_show(self.obj['mrc'])}, we speak {PROTOCOL_VERSION}"
            )


def _scalar(value: object) -> bool:
    """A JSON scalar a stats object may hold: finite numbers, short strings, booleans, null."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_NAME


@dataclass(frozen=True, slots=True)
class RemoteRegion:
    """A registered region as a peer describes it: what a WRITE needs to land there."""

    name: str
    rkey: int
    addr: int
    length: int

    @classmethod
    def from_json(cls, obj: object, msg: str = "region", path: str = "") -> RemoteRegion:
        f = _Fields(obj, msg, path)
        region = cls(
            f.text("name", MAX_NAME),
            f.integer("rkey", 0, U32),
            f.integer("addr", 0, U64),
            f.integer("length", 0, MAX_REGION_SIZE),
        )
        if region.addr + region.length > U64 + 1:
            f.fail("length", "within the 64-bit address space after addr", region.length)
        return region

    def to_json(self) -> JSON:
        return {"name": self.name, "rkey": self.rkey, "addr": self.addr, "length": self.length}


@dataclass(frozen=True, slots=True)
class RegionRequest:
    """A sender asking the listener to allocate a region of ``size`` bytes for it."""

    size: int
    name: str = ""

    @classmethod
    def from_json(cls, obj: object, msg: str = "request", path: str = "") -> RegionRequest:
        f = _Fields(obj, msg, path)
        return cls(
            f.integer("size", 0, MAX_REGION_SIZE), f.text("name", MAX_NAME) if f.has("name") else ""
        )

    def to_json(self) -> JSON:
        return {"size": self.size, "name": self.name}


@dataclass(frozen=True, slots=True)
class AuthOffer:
    """The sender's half of the key handshake, inside its hello: a fresh nonce, and whether
    payloads are to be encrypted or only authenticated (mrc/security/handshake.py)."""

    nonce: str  # 16 bytes, hex
    mode: str = "integrity"

    @classmethod
    def from_json(cls, obj: object, msg: str = "hello", path: str = "auth.") -> AuthOffer:
        f = _Fields(obj, msg, path)
        mode = f.get("mode")
        if mode not in MODES:
            f.fail("mode", '"integrity" or "encrypt"', mode)
        return cls(f.text("nonce", 32, _NONCE), str(mode))

    def to_json(self) -> JSON:
        return {"nonce": self.nonce, "mode": self.mode}


@dataclass(frozen=True, slots=True)
class Hello:
    """The sender's first message: its QP, where it listens, and what it asks for.

    ``addrs`` empty: one plane, at the address the side channel came from. ``evs`` and
    ``psn_window`` may be absent (None); the listener then uses its own window.
    """

    qpn: int
    psn: int
    udp_port: int
    addrs: tuple[str, ...] = ()
    evs: int | None = None
    psn_window: int | None = None
    max_imm: int | None = None  # WRITE_IMMs the sender takes in flight (its max_imm_dest)
    regions: tuple[RemoteRegion, ...] = ()
    request: RegionRequest | None = None
    auth: AuthOffer | None = None
    #: the end-to-end checksums the sender can verify a transfer with, preferred first
    #: (``CHECKSUMS``' names; others are ignored); empty: it names none (SHA-256 then)
    checksums: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, obj: object) -> Hello:
        f = _Fields(obj, "hello")
        f.version()
        hello = cls(
            qpn=f.integer("qpn", 1, U24),
            psn=f.integer("psn", 0, U24),
            udp_port=f.integer("udp_port", 1, 65535),
            addrs=f.addrs("addrs") if f.has("addrs") else (),
            evs=f.integer("evs", 1, MAX_EVS) if f.has("evs") else None,
            psn_window=(
                f.integer("psn_window", PSN_WINDOW_MIN, PSN_WINDOW_MAX)
                if f.has("psn_window")
                else None
            ),
            max_imm=f.integer("max_imm", 1, MAX_IMM) if f.has("max_imm") else None,
            regions=f.regions("regions") if f.has("regions") else (),
            request=(
                RegionRequest.from_json(f.get("request"), "hello", "request.")
                if f.has("request")
                else None
            ),
            auth=AuthOffer.from_json(f.get("auth")) if f.has("auth") else None,
            checksums=f.names("checksums") if f.has("checksums") else (),
        )
        if hello.request is not None and hello.auth is not None and hello.auth.mode == "encrypt":
            f._fail_raw(
                "hello",
                'request must not travel in clear with auth mode "encrypt" (it follows '
                "the proof, sealed)",
            )
        return hello

    def to_json(self) -> JSON:
        out: JSON = {
            "mrc": PROTOCOL_VERSION,
            "qpn": self.qpn,
            "psn": self.psn,
            "udp_port": self.udp_port,
            "addrs": list(self.addrs),
            "regions": [r.to_json() for r in self.regions],
        }
        if self.evs is not None:
            out["evs"] = self.evs
        if self.psn_window is not None:
            out["psn_window"] = self.psn_window
        if self.max_imm is not None:
            out["max_imm"] = self.max_imm
        if self.request is not None:
            out["request"] = self.request.to_json()
        if self.auth is not None:
            out["auth"] = self.auth.to_json()
        if self.checksums:
            out["checksums"] = list(self.checksums)
        return out

    def context(self) -> bytes:
        """What the key handshake binds: this hello as both sides serialise it, so a
        change on the way (another port, another region request) fails the proofs."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Challenge:
    """Receiver -> sender, in answer to a hello with ``auth``: the receiver's fresh nonce
    and its proof that it holds the key (HMAC over both nonces and the hello)."""

    nonce: str  # 16 bytes, hex
    proof: str  # 32 bytes, hex

    @classmethod
    def from_json(cls, obj: object) -> Challenge:
        f = _Fields(obj, "challenge")
        f.version()
        g = _Fields(f.get("challenge"), "challenge", "challenge.")
        return cls(g.text("nonce", 32, _NONCE), g.text("proof", 64, _SHA256))

    def to_json(self) -> JSON:
        return {"mrc": PROTOCOL_VERSION, "challenge": {"nonce": self.nonce, "proof": self.proof}}


@dataclass(frozen=True, slots=True)
class Proof:
    """Sender -> receiver: its proof that it holds the key; only then is anything allocated."""

    proof: str  # 32 bytes, hex

    @classmethod
    def from_json(cls, obj: object) -> Proof:
        f = _Fields(obj, "proof")
        f.version()
        return cls(f.text("proof", 64, _SHA256))

    def to_json(self) -> JSON:
        return {"mrc": PROTOCOL_VERSION, "proof": self.proof}


@dataclass(frozen=True, slots=True)
class SealedRequest:
    """Sender -> receiver, the first sealed message of a sender that encrypts (right after its
    proof): the region request its hello left out, so the name and size travel sealed."""

    request: RegionRequest | None

    @classmethod
    def from_json(cls, obj: object) -> SealedRequest:
        f = _Fields(obj, "sealed request")
        f.version()
        return cls(
            RegionRequest.from_json(f.get("request"), "sealed request", "request.")
            if f.has("request")
            else None
        )

    def to_json(self) -> JSON:
        out: JSON = {"mrc": PROTOCOL_VERSION}
        if self.request is not None:
            out["request"] = self.request.to_json()
        return out


def parse_challenge(obj: object) -> Challenge | Refusal:
    """A keyed sender's first answer: the receiver's challenge, or a refusal."""
    if isinstance(obj, dict) and "challenge" in obj:
        return Challenge.from_json(obj)
    reply = parse_reply(obj)
    if isinstance(reply, Welcome):
        raise MessageError("bad challenge: the receiver welcomed us without a key exchange")
    return reply


@dataclass(frozen=True, slots=True)
class Welcome:
    """The listener's acceptance: its QP for this connection and the regions it offers
    (the one allocated for the hello's ``request`` first). ``addrs`` empty: one plane."""

    qpn: int
    psn: int
    udp_port: int
    addrs: tuple[str, ...] = ()
    regions: tuple[RemoteRegion, ...] = ()
    max_imm: int | None = None  # WRITE_IMMs the listener takes in flight (its max_imm_dest)
    # payload bytes the sender may have in flight before its first ACK: its share of the
    # listener's receive buffer (Endpoint.start_share)
    start_bytes: int | None = None
    #: what a further side-channel connection shows to join this one (:class:`Join`)
    join: str | None = None
    #: the checksum the listener picked from the hello's offer; None: the hello offered none
    checksum: str | None = None

    @classmethod
    def from_json(cls, obj: object) -> Welcome:
        f = _Fields(obj, "welcome")
        f.version()
        if f.get("ok") is not True:
            f.fail("ok", "true", f.get("ok"))
        return cls(
            qpn=f.integer("qpn", 1, U24),
            psn=f.integer("psn", 0, U24),
            udp_port=f.integer("udp_port", 1, 65535),
            addrs=f.addrs("addrs") if f.has("addrs") else (),
            regions=f.regions("regions") if f.has("regions") else (),
            max_imm=f.integer("max_imm", 1, MAX_IMM) if f.has("max_imm") else None,
            start_bytes=(
                f.integer("start_bytes", 1, MAX_START_BYTES) if f.has("start_bytes") else None
            ),
            join=f.text("join", 32, _NONCE) if f.has("join") else None,
            checksum=f.choice("checksum", CHECKSUMS) if f.has("checksum") else None,
        )

    def to_json(self) -> JSON:
        out: JSON = {
            "mrc": PROTOCOL_VERSION,
            "ok": True,
            "qpn": self.qpn,
            "psn": self.psn,
            "udp_port": self.udp_port,
            "addrs": list(self.addrs),
            "regions": [r.to_json() for r in self.regions],
        }
        if self.max_imm is not None:
            out["max_imm"] = self.max_imm
        if self.start_bytes is not None:
            out["start_bytes"] = self.start_bytes
        if self.join is not None:
            out["join"] = self.join
        if self.checksum is not None:
            out["checksum"] = self.checksum
        return out


@dataclass(frozen=True, slots=True)
class Join:
    """Sender -> listener, the first line of a further side-channel connection: it joins the
    connection whose welcome gave ``token`` as its path over ``plane`` (an index into both
    sides' plane addresses). With a key, ``proof`` is HMAC-SHA256 of the token under the
    path's key (mrc.transport.sidechannel.join_proof); the answer is ``{"mrc", "ok"}`` or a
    :class:`Refusal`, and the path's messages are protected under its own keys from then on."""

    token: str
    plane: int
    proof: str | None = None

    @staticmethod
    def is_join(obj: object) -> bool:
        return isinstance(obj, dict) and "join" in obj

    @classmethod
    def from_json(cls, obj: object) -> Join:
        f = _Fields(obj, "join")
        f.version()
        return cls(
            f.text("join", 32, _NONCE),
            f.integer("plane", 0, MAX_PLANES - 1),
            f.text("proof", 64, _SHA256) if f.has("proof") else None,
        )

    def to_json(self) -> JSON:
        out: JSON = {"mrc": PROTOCOL_VERSION, "join": self.token, "plane": self.plane}
        if self.proof is not None:
            out["proof"] = self.proof
        return out


@dataclass(frozen=True, slots=True)
class Refusal:
    """The listener's refusal of a hello, with the reason (one line), before it closes.
    ``retry``: the refusal is for now (the set-up gave way to a newer connection), and the
    sender may try again at once."""

    error: str
    retry: bool = False

    @classmethod
    def from_json(cls, obj: object) -> Refusal:
        f = _Fields(obj, "refusal")
        f.version()
        if f.get("ok") is not False:
            f.fail("ok", "false", f.get("ok"))
        return cls(
            f.text("error", MAX_TEXT) if f.has("error") else "no reason",
            f.boolean("retry") if f.has("retry") else False,
        )

    @classmethod
    def because(cls, reason: str, retry: bool = False) -> Refusal:
        """A refusal whose reason fits the schema (long reasons are cut)."""
        return cls(reason if len(reason) <= MAX_TEXT else reason[: MAX_TEXT - 3] + "...", retry)

    def to_json(self) -> JSON:
        out: JSON = {"mrc": PROTOCOL_VERSION, "ok": False, "error": self.error}
        if self.retry:
            out["retry"] = True
        return out

    def exception(self) -> MRCError:
        """What a sender raises for it: :class:`Refused`, :class:`RefusedForNow` if it may try
        again."""
        text = f"connection refused by the receiver: {self.error}"
        return RefusedForNow(text) if self.retry else Refused(text)


def parse_reply(obj: object) -> Welcome | Refusal:
    """The answer to a hello: a Welcome or a Refusal, told apart by ``ok``."""
    f = _Fields(obj, "welcome")
    f.version()
    ok = f.boolean("ok")
    return Welcome.from_json(obj) if ok else Refusal.from_json(obj)


# ---- after set-up: the transfer verdict of mrc-send / mrc-recv (mrc/app/transfer.py) ----------


@dataclass(frozen=True, slots=True)
class Done:
    """Sender -> receiver once its final WRITE_IMM completed: what it sent, hashed (its
    ``digest`` under the checksum the connection agreed on)."""

    digest: str
    bytes: int
    type: Literal["done"] = "done"

    @classmethod
    def from_json(cls, obj: object) -> Done:
        f = _Fields.of_type(obj, "done")
        return cls(f.text("digest", 64, _DIGEST), f.integer("bytes", 0, MAX_REGION_SIZE))

    def to_json(self) -> JSON:
        return {"type": "done", "digest": self.digest, "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class Result:
    """Receiver -> sender: the verdict (hash of what was placed) and the receiver's counters."""

    ok: bool
    digest: str
    stats: Mapping[str, StatValue]
    #: why the receiver failed the transfer although it may have the data (e.g. the output file
    #: could not be put in place); None when ``ok`` or when the hashes simply differ
    error: str | None = None
    type: Literal["result"] = "result"

    @classmethod
    def from_json(cls, obj: object) -> Result:
        f = _Fields.of_type(obj, "result")
        return cls(
            f.boolean("ok"),
            f.text("digest", 64, _DIGEST),
            f.stats("stats") if f.has("stats") else {},
            f.text("error", MAX_TEXT) if f.has("error") else None,
        )

    def to_json(self) -> JSON:
        out: JSON = {"type": "result", "ok": self.ok, "digest": self.digest}
        out["stats"] = dict(self.stats)
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class RoundDigest:
    """Receiver -> sender in a timed transfer (``mrc-send --time``): round ``round`` (counted
    modulo 2^24, as its immediate carries it) is placed and its slot hashes to ``digest``."""

    round: int
    digest: str
    type: Literal["round"] = "round"

    @classmethod
    def from_json(cls, obj: object) -> RoundDigest:
        f = _Fields.of_type(obj, "round")
        return cls(f.integer("round", 0, U24), f.text("digest", 64, _DIGEST))

    def to_json(self) -> JSON:
        return {"type": "round", "round": self.round, "digest": self.digest}


@dataclass(frozen=True, slots=True)
class Abort:
    """Either side giving up mid-transfer, with the reason: ``{"error": "..."}``."""

    error: str

    @classmethod
    def from_json(cls, obj: object) -> Abort:
        f = _Fields(obj, "abort message")
        return cls(f.text("error", MAX_TEXT))

    def to_json(self) -> JSON:
        return {"error": self.error}
