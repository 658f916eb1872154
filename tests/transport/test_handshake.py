"""The set-up's decisions without sockets (mrc.connection.handshake, issue 41 item 2).

The same hostile cases the socket tests send a real listener (tests/transport/test_limits.py,
test_malformed.py, test_side_channel_paths.py, security/test_setup_lockout.py) are decided
here from values: what a hello asks for is clipped or refused, a join is checked token, plane
and proof, a reply is a welcome or the exception its refusal means, and a region request is
weighed against the listener's bounds before anything is made for it.
"""

from __future__ import annotations

import hashlib
import hmac
import warnings

import pytest

import mrc
from mrc.connection.config import ConnectConfig, ListenerConfig, from_keywords
from mrc.connection.handshake import (
    JoinTable,
    checksum_key,
    hello_of,
    pick_checksum,
    plan_accept,
    plan_dial,
    read_welcome,
    region_cost,
    request_of,
)
from mrc.core.config import QPConfig
from mrc.errors import MRCError
from mrc.security.packet import Mode
from mrc.transport.limits import Ledger, LimitError, Limits
from mrc.transport.messages import (
    PROTOCOL_VERSION,
    Hello,
    Join,
    MessageError,
    Refusal,
    Refused,
    RefusedForNow,
    RegionRequest,
    Welcome,
)
from mrc.wire import MAX_PLANES

HELLO = Hello(qpn=7, psn=100, udp_port=5000)


def test_the_listener_adopts_the_senders_psn_window_and_fits_its_window_into_it() -> None:
    mine = QPConfig(max_outstanding=4096, psn_window=65536)
    plan = plan_accept(
        Hello(qpn=7, psn=1, udp_port=5000, psn_window=1024), "::1", (), 16, mine, None
    )
    assert plan.qp.psn_window == 1024 and plan.qp.max_outstanding == 1024
    assert mine.psn_window == 65536 and mine.max_outstanding == 4096  # its own is untouched


def test_settings_the_hello_makes_impossible_are_a_refusal_naming_the_setting() -> None:
    with pytest.raises(MRCError, match="cannot accept with this receiver's settings: ack_every"):
        plan_accept(HELLO, "::1", (), 16, QPConfig(ack_every=0), None)


def test_planes_pair_up_to_the_side_with_fewer() -> None:
    hello = Hello(qpn=7, psn=1, udp_port=5000, addrs=("fd00::1", "fd01::1", "fd02::1"))
    plan = plan_accept(hello, "fd00::1", ("fd00::2", "fd01::2"), 16, None, None)
    assert plan.pairs == [("fd00::2", "fd00::1"), ("fd01::2", "fd01::1")]
    assert (plan.active, plan.total) == (16, 16 + 4)  # a quarter more as backups
    assert len(plan.routes) == 2


def test_a_hello_naming_no_plane_runs_over_the_side_channels_addresses() -> None:
    plan = plan_accept(HELLO, "192.0.2.9", (), 1, None, None)
    assert plan.pairs == [("0.0.0.0", "192.0.2.9")]  # the wildcard of the peer's family
    assert (plan.active, plan.total) == (1, 2)  # at least one backup per plane


def test_a_hello_with_more_planes_than_an_ack_can_report_is_refused_when_parsed() -> None:
    obj = {**HELLO.to_json(), "addrs": [f"fd00::{i + 1:x}" for i in range(MAX_PLANES + 1)]}
    with pytest.raises(MessageError, match="addrs"):
        Hello.from_json(obj)


def test_the_sender_plans_its_evs_over_the_planes_the_welcome_names() -> None:
    hello = Hello(qpn=7, psn=1, udp_port=5000, addrs=("fd00::1", "fd01::1"), evs=64)
    welcome = Welcome(qpn=9, psn=2, udp_port=4791, addrs=("fd00::2", "fd01::2"))
    plan = plan_dial(hello, welcome, "fd00::2", QPConfig(), None)
    assert plan.pairs == [("fd00::1", "fd00::2"), ("fd01::1", "fd01::2")]
    assert (plan.active, plan.total) == (64, 80)
    one = plan_dial(hello, Welcome(qpn=9, psn=2, udp_port=4791), "fd09::9", QPConfig(), None)
    assert one.pairs == [("fd00::1", "fd09::9")]  # a welcome naming none: the address reached


def test_a_reply_is_a_welcome_or_the_exception_its_refusal_means() -> None:
    welcome = Welcome(qpn=9, psn=2, udp_port=4791, join="ab" * 16)
    assert read_welcome(welcome.to_json(), "::1") == welcome
    with pytest.raises(Refused, match="connection refused by the receiver: full") as info:
        read_welcome(Refusal.because("full").to_json(), "::1")
    assert not isinstance(info.value, RefusedForNow)
    with pytest.raises(RefusedForNow, match="gave way"):
        read_welcome(Refusal.because("gave way", retry=True).to_json(), "::1")
    with pytest.raises(MRCError, match=r"\[::1\] closed the side channel during set-up"):
        read_welcome(None, "::1")


@pytest.mark.parametrize(
    "reply",
    [
        {"mrc": PROTOCOL_VERSION, "ok": True},  # a welcome without its QP
        {"mrc": PROTOCOL_VERSION, "ok": "yes"},
        {"mrc": PROTOCOL_VERSION + 1, "ok": True, "qpn": 1, "psn": 1, "udp_port": 1},
        {"mrc": PROTOCOL_VERSION, "ok": True, "qpn": 1 << 24, "psn": 1, "udp_port": 1},
        [],
    ],
)
def test_a_malformed_reply_is_one_line_naming_what_is_wrong(reply: object) -> None:
    with pytest.raises(MRCError) as info:
        read_welcome(reply, "::1")
    assert "\n" not in str(info.value) and str(info.value)


def _proof(key: bytes, token: str) -> str:
    return hmac.new(key, b"join" + token.encode(), hashlib.sha256).hexdigest()


def test_joins_are_checked_token_plane_and_proof() -> None:
    table: JoinTable[str] = JoinTable()
    assert table.offer("single", 1) is None and len(table) == 0  # one plane: nothing to join
    token = table.offer("side", 2)
    assert token is not None and list(table) == [token]

    def keyless(_side: str, _token: str, _plane: int) -> str | None:
        return None

    assert table.check(Join(token, 1), keyless) == "side"
    with pytest.raises(MRCError, match="no connection to join with that token"):
        table.check(Join("00" * 16, 1), keyless)
    with pytest.raises(MRCError, match="the connection has 2 planes, no plane 2"):
        table.check(Join(token, 2), keyless)

    def keyed(_side: str, t: str, _plane: int) -> str | None:
        return _proof(b"k" * 32, t)

    assert table.check(Join(token, 1, _proof(b"k" * 32, token)), keyed) == "side"
    for proof in (None, _proof(b"x" * 32, token), "zz"):
        with pytest.raises(MRCError, match="the join's proof is wrong"):
            table.check(Join(token, 1, proof), keyed)
    table.forget(token)
    table.forget(None)
    with pytest.raises(MRCError, match="no connection to join with that token"):
        table.check(Join(token, 1), keyless)


def test_a_region_request_is_weighed_against_the_bounds_before_anything_is_made() -> None:
    ledger = Ledger(Limits(max_granted_bytes=10_000, max_memory_bytes=4_000))
    assert region_cost(None, None) == (0, 0)
    assert region_cost(RegionRequest(6000, ""), lambda size: size // 2) == (6000, 3000)
    admitted = ledger.admit(*region_cost(RegionRequest(6000, ""), lambda size: size // 2))
    with pytest.raises(LimitError, match="cannot grant 6000 bytes"):
        ledger.admit(*region_cost(RegionRequest(6000, ""), None))
    with pytest.raises(LimitError, match="memory"):
        ledger.admit(*region_cost(RegionRequest(2000, ""), None))  # 3000 + 2000 > 4000
    assert ledger.admit(*region_cost(RegionRequest(2000, ""), lambda _s: 0))  # a file: no memory
    admitted.release()
    assert ledger.usage()["granted_bytes"] == 2000


def test_a_full_set_up_table_drops_the_oldest_that_proved_nothing() -> None:
    ledger = Ledger(Limits(max_setups=2))
    assert ledger.begin_setup("a", "fd00::1") is None
    ledger.said_hello("a")
    ledger.proven("a")
    assert ledger.begin_setup("b", "fd00::2") is None
    assert ledger.begin_setup("c", "fd00::3") == "b"  # a proved itself, b did not
    ledger.end_setup("b")
    ledger.said_hello("c")
    ledger.proven("c")
    with pytest.raises(LimitError, match="too many set-ups in progress"):
        ledger.begin_setup("d", "fd00::4")  # every set-up proved itself: refused


def test_the_hello_says_what_the_config_asks_for() -> None:
    config = ConnectConfig(evs=32, request_size=4096, request_name="f")
    qp = QPConfig(psn_window=8192, max_outstanding=512, max_imm_dest=7)
    hello = hello_of(config, qp, qpn=1, psn=2, udp_port=3, addrs=["::1"], regions=[])
    assert (hello.evs, hello.psn_window, hello.max_imm) == (32, 8192, 7)
    assert hello.request == RegionRequest(4096, "f") == request_of(config)
    assert hello.auth is None
    sealed = ConnectConfig(request_size=4096, key=b"k" * 32, encrypt=True)
    hello = hello_of(sealed, qp, qpn=1, psn=2, udp_port=3, addrs=["::1"], regions=[])
    assert hello.request is None  # encrypting: sent sealed after the key proof
    assert hello.auth is not None and Mode.ENCRYPT.name.lower() in str(hello.auth).lower()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: ConnectConfig(encrypt=True), "encrypt needs a key"),
        (lambda: ConnectConfig(evs=0), "need at least one EV"),
        (lambda: ConnectConfig(request_size=-1), "cannot request a region of -1 bytes"),
        (lambda: ConnectConfig(local_addrs=["::1"] * 17), "local_addrs: at most 16 planes"),
        (lambda: ConnectConfig(qp=QPConfig(ack_every=0)), "ack_every must be at least 1"),
        (lambda: ListenerConfig(require_encrypt=True), "require_encrypt needs a key"),
        (lambda: ListenerConfig(hello_timeout=0), "hello_timeout must be more than 0 s"),
        (lambda: ListenerConfig(max_memory_bytes=-5), "max_memory_bytes must be None or at"),
        (lambda: ListenerConfig(plane_addrs=["::1"] * 17), "plane_addrs: at most 16 planes"),
        (lambda: ConnectConfig(checksums=["md5"]), "'md5' is not a checksum mrc knows"),
        (lambda: ConnectConfig(checksums=["sha256"] * 2), "names one checksum twice"),
        (lambda: ListenerConfig(checksums=()), "name at least one checksum"),
    ],
)
def test_an_impossible_config_is_refused_when_made(make: object, expected: str) -> None:
    with pytest.raises(MRCError, match=expected):
        make()  # type: ignore[operator]


def test_configs_are_frozen_and_keep_no_list_of_the_callers() -> None:
    addrs = ["::1", "::2"]
    config = ListenerConfig(plane_addrs=addrs, limit_hints={"setups": "--max-setups"})
    addrs.append("::3")
    assert config.plane_addrs == ("::1", "::2")
    with pytest.raises(AttributeError):
        config.evs = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.limit_hints["setups"] = "x"  # type: ignore[index]


def test_the_old_keywords_still_work_for_a_release_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"ConnectConfig\(evs=, qp=\)"):
        config = from_keywords(ConnectConfig, None, {"evs": 4, "config": QPConfig()}, "connect")
    assert config.evs == 4 and config.qp == QPConfig()
    base = ListenerConfig(evs=8)
    with pytest.warns(DeprecationWarning):
        merged = from_keywords(ListenerConfig, base, {"key": b"k" * 32}, "listen")
    assert (merged.evs, merged.key) == (8, b"k" * 32)
    with pytest.warns(DeprecationWarning):  # listen(config=QPConfig(...)): the old spelling
        old = from_keywords(ListenerConfig, QPConfig(payload_size=4096), {}, "listen")
    assert old.qp == QPConfig(payload_size=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert from_keywords(ListenerConfig, base, {}, "listen") is base  # nothing old: silent
    with pytest.raises(TypeError, match="connect\\(\\) got an unexpected keyword argument 'evz'"):
        from_keywords(ConnectConfig, None, {"evz": 4}, "connect")


async def test_listen_and_connect_take_the_old_keywords_and_still_transfer() -> None:
    with pytest.warns(DeprecationWarning, match="listen"):
        listener = await mrc.listen("::1", 0, evs=4)
    try:
        inbox = bytearray(1000)
        listener.register(inbox, name="inbox")
        with pytest.warns(DeprecationWarning) as said:
            conn = await mrc.connect("::1", listener.port, evs=4, alternates=["::1"])
        lines = sorted(str(w.message) for w in said)
        assert len(lines) == 2 and "alternates=" in lines[0] and "ConnectConfig(evs=)" in lines[1]
        async with conn:
            await conn.write(b"z" * 1000, conn.remote["inbox"])
        assert bytes(inbox) == b"z" * 1000
    finally:
        await listener.close()


def test_the_listener_picks_its_first_checksum_the_sender_offers() -> None:
    assert pick_checksum(("xxh3-128", "blake3"), ("blake3", "sha256")) == "blake3"
    assert pick_checksum(("sha256",), ("blake3", "sha256", "xxh3-128")) == "sha256"
    # a name this side does not know (a newer peer's) is passed over, not refused
    assert pick_checksum(("k12", "xxh3-128"), ("blake3", "xxh3-128")) == "xxh3-128"
    assert pick_checksum((), ("blake3", "sha256")) is None  # none named: SHA-256
    with pytest.raises(MRCError, match=r"^no end-to-end checksum in common: the sender offers"):
        pick_checksum(("xxh3-128",), ("blake3",))
    with pytest.raises(MRCError, match="names no end-to-end checksum"):
        pick_checksum((), ("blake3",))


def test_a_welcome_must_pick_a_checksum_the_hello_offered() -> None:
    picked = Welcome(qpn=9, psn=2, udp_port=4791, checksum="sha256")
    assert read_welcome(picked.to_json(), "::1", ("blake3", "sha256")).checksum == "sha256"
    with pytest.raises(MRCError, match="picked the checksum sha256, not one of those offered"):
        read_welcome(picked.to_json(), "::1", ("blake3",))
    with pytest.raises(MRCError, match="picked the checksum none"):
        read_welcome(Welcome(qpn=9, psn=2, udp_port=4791).to_json(), "::1", ("blake3",))
    with pytest.raises(MessageError, match="checksum must be one of"):
        read_welcome({**picked.to_json(), "checksum": "md5"}, "::1", ("blake3",))


def test_a_hello_offer_is_bounded_and_names_are_words() -> None:
    hello = Hello(qpn=7, psn=1, udp_port=5000, checksums=("blake3", "sha256"))
    assert Hello.from_json(hello.to_json()).checksums == ("blake3", "sha256")
    for bad in (["x"] * 9, ["BLAKE3"], [1], ["a" * 17], "blake3"):
        with pytest.raises(MessageError, match="checksums"):
            Hello.from_json({**hello.to_json(), "checksums": bad})


def test_the_checksum_key_is_derived_and_never_the_connections_own() -> None:
    key = b"k" * 32
    derived = checksum_key(key)
    assert derived is not None and len(derived) == 32 and derived != key
    assert checksum_key(None) is None and checksum_key(b"j" * 32) != derived
