"""Window laws as plug-ins (mrc/core/cc/): the registry, a law's parameters, the defaults each
law gives the QP, the hooks the requester calls, and a law written outside mrc
(examples/dctcp_window.py) in the simulator's congestion model: an incast through a trimming,
ECN-marking last hop, and one flow whose queue only ECN keeps short."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mrc import wire
from mrc.core import QPConfig
from mrc.core.cc import (
    FixedWindow,
    MrcNscc,
    MrcNsccParams,
    UetNscc,
    WindowLaw,
    create,
    law_class,
    load,
    names,
    param_from_text,
    params_of,
    register,
)
from mrc.core.config import AUTO_BURST
from mrc.lab.sim import Faults
from mrc.lab.sim_links import Fabric, LinkSpec
from mrc.lab.sim_secrets import seeded_secrets

from .mrcsim_harness import RecordingNetwork, Transfer, make_transfer, run_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dctcp_window.py"
DCTCP = f"{EXAMPLE}:Dctcp"
RATE = 12.5e6  # bytes/s: 100 Mbit/s
PAYLOAD = 1000
WIRE = PAYLOAD + wire.DATA_HDR_LEN


def _pattern(n: int, salt: int) -> bytes:
    return bytes((i * 31 + salt * 7 + (i >> 8)) % 251 for i in range(n))


# ---- the registry and parameters ---------------------------------------------------------


def test_the_registry_names_the_laws_and_loads_one_from_a_file() -> None:
    assert {"fixed", "nscc-mrc"} <= set(names())
    assert law_class("fixed") is FixedWindow and law_class("nscc-mrc") is MrcNscc
    assert load(DCTCP) == DCTCP  # (loading is explicit: tests/core/test_law_loading.py)
    dctcp = law_class(DCTCP)
    assert issubclass(dctcp, WindowLaw) and dctcp.__name__ == "Dctcp"
    assert law_class(DCTCP) is dctcp  # loaded once
    assert law_class("dctcp") is dctcp  # the file registered its own name as it loaded
    # a relative path is made absolute, for processes started elsewhere
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(EXAMPLE.parent)
        assert load("dctcp_window.py:Dctcp") == DCTCP
    assert load("nscc-mrc") == "nscc-mrc"
    for bad, why in (
        ("vegas", "cc must be one of"),
        ("no.such.module:Law", "cannot load"),
        (f"{EXAMPLE}:Nothing", "has no 'Nothing'"),
        (f"{EXAMPLE}:DctcpParams", "not a window law"),
    ):
        with pytest.raises(ValueError, match=why) as err:
            load(bad)
        assert "\n" not in str(err.value)


def test_uet_1_0_nscc_is_mrc_ctls_name_for_nscc() -> None:
    """``uet-1.0-nscc``, the algorithm string OCP's mrc_ctl.h defines for UET 1.0 NSCC, is
    another name of ``nscc``: the same class, parameters and decisions (docs/CONGESTION.md)."""
    alias = "uet-1.0-nscc"
    assert {"nscc", alias} <= set(names())
    assert law_class(alias) is law_class("nscc") is UetNscc
    assert load(alias) == alias  # what --cc does with it: a registered name, kept as it is
    values: dict[str, float | int | bool] = {"gamma": 0.5, "qa_gate": 2, "shared_base": False}
    assert params_of(alias, values) == params_of("nscc", values)
    assert param_from_text(alias, "target_delay", "0.0005") == 0.0005
    with pytest.raises(ValueError, match=r"cc\.gamma"):
        QPConfig(cc=alias, cc_params={"gamma": 1.5}).validate()
    config = QPConfig(payload_size=1000, max_outstanding=256, cc=alias, cc_params=values)
    config.validate()
    laws: list[UetNscc] = []
    for cc in ("nscc", alias):
        law = create(cc, config.cc_params, config)
        assert type(law) is UetNscc
        laws.append(law)
    # the same signals give the same windows: ACKs below, at and over the target delay, with
    # and without CE, a trim, a loss and a timeout
    windows: list[list[tuple[float, int]]] = [[], []]
    for law, seen in zip(laws, windows, strict=True):
        law.on_resume(0.0)
        now = 0.0
        for i in range(400):
            now += 0.00005
            rtt = 0.001 + (0.002 if i % 100 >= 60 else 0.0001 * (i % 5))
            law.on_ack(now, 1000 * (1 + i % 3), rtt, i % 100 >= 80)
            if i in (150, 310):
                law.on_trim(now, rtt)
            if i == 220:
                law.on_loss(now)
            if i == 390:
                law.on_timeout(now)
            seen.append((law.cwnd, law.limit))
    assert windows[0] == windows[1]
    assert len(set(windows[0])) > 10  # the window moved: the laws were tested, not idle
    assert laws[0].counters() == laws[1].counters()


def test_register_takes_only_laws_with_plain_parameters() -> None:
    @dataclasses.dataclass(frozen=True)
    class Named:
        label: str = "x"

    class Labelled(WindowLaw):
        Params = Named

    class Loose(WindowLaw):
        Params = dict

    for name, law, why in (
        ("a:b", FixedWindow, "without ':'"),
        ("plain", object, "not a window law"),
        ("labelled", Labelled, "label of Named is not int, float or bool"),
        ("loose", Loose, "Params is not a dataclass"),
    ):
        with pytest.raises(ValueError, match=why):
            register(name, law)  # type: ignore[arg-type]
    assert "labelled" not in names() and "loose" not in names()


def test_a_laws_parameters_are_checked_in_one_line_naming_the_key() -> None:
    load(DCTCP)
    assert params_of("nscc-mrc", {}) == MrcNsccParams()
    assert params_of("nscc-mrc", {"gain": 1, "initial_window": 4}).gain == 1.0  # an int does
    cases: list[tuple[dict[str, float | int | bool], str]] = [
        ({"gian": 0.5}, r"cc\.gian: window law nscc-mrc has no such parameter \(it has: target_"),
        ({"initial_window": 4.5}, r"cc\.initial_window must be an integer, not 4\.5"),
        ({"gain": True}, r"cc\.gain must be a number, not True"),
        ({"gain": -1.0}, r"cc\.gain must be >= 0"),
        ({"target_max": 0.0001}, r"cc\.target_max must be between"),
        ({"min_window": 0.0}, r"cc\.min_window must be between 0\.001 and 1"),
    ]
    for values, why in cases:
        with pytest.raises(ValueError, match=why) as err:
            QPConfig(cc="nscc-mrc", cc_params=values).validate()
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"cc\.min_window"):
        QPConfig(cc="fixed", cc_params={"min_window": 0.5}).validate()  # not fixed's
    with pytest.raises(ValueError, match=r"cc\.g must be > 0"):
        QPConfig(cc=DCTCP, cc_params={"g": 0.0}).validate()


def test_a_parameter_from_text_takes_its_fields_type() -> None:
    load(DCTCP)
    assert param_from_text("nscc-mrc", "min_window", "0.5") == 0.5
    assert param_from_text("nscc-mrc", "initial_window", "32") == 32
    assert isinstance(param_from_text("nscc-mrc", "gain", "1"), float)
    assert param_from_text(DCTCP, "g", "0.125") == 0.125
    with pytest.raises(ValueError, match=r"cc\.initial_window must be an integer, not '1\.5'"):
        param_from_text("nscc-mrc", "initial_window", "1.5")
    with pytest.raises(ValueError, match=r"cc\.gain must be a number, not 'x'"):
        param_from_text("nscc-mrc", "gain", "x")
    with pytest.raises(ValueError, match="no such parameter"):
        param_from_text("fixed", "gain", "1")

    @dataclasses.dataclass(frozen=True)
    class Switch:
        on: bool = False

    class Switched(WindowLaw):
        Params = Switch

    register("switched", Switched)
    assert param_from_text("switched", "on", "yes") is True
    assert param_from_text("switched", "on", "off") is False
    with pytest.raises(ValueError, match=r"cc\.on must be true or false"):
        param_from_text("switched", "on", "maybe")


def test_nscc_keeps_the_defaults_it_had_as_qpconfig_fields() -> None:
    assert dataclasses.asdict(MrcNsccParams()) == {
        "target_delay": 0.0005,
        "target_rtt_fraction": 0.25,
        "target_packets": 0.0,
        "target_max": 0.004,
        "initial_window": 16,
        "gain": 0.5,
        "min_window": 0.25,
        "md_gain": 0.8,
        "max_md": 0.5,
        "ce_md": 0.125,
        "shared_base": True,
        "shared_target_packets": 4.0,
    }
    law = create("nscc-mrc", {}, QPConfig(payload_size=1000))
    assert isinstance(law, MrcNscc)
    assert law.cwnd == 16_000 and law.min_cwnd == 250 and law.limit == 16
    assert law.counters() == {"cc_decreases": 0, "cc_quick_adapts": 0, "cc_losses_ignored": 0}


def test_what_a_law_decides_for_the_qp() -> None:
    """Bursts, plane steering and the prompt ACK follow the law, not its name."""
    load(DCTCP)
    assert QPConfig(payload_size=8192).burst_max == AUTO_BURST
    assert QPConfig().burst_max == 45  # at 1400 bytes: one whole GSO send
    assert QPConfig(cc="fixed").burst_max == 1
    assert QPConfig(cc=DCTCP).burst_max == 1  # the base class's default: spray
    assert QPConfig(cc=DCTCP, burst=4).burst_max == 4
    assert MrcNscc.plane_steering and MrcNscc.prompt_acks and MrcNscc.adaptive
    assert not (FixedWindow.plane_steering or FixedWindow.prompt_acks or FixedWindow.adaptive)
    net = RecordingNetwork(1)
    net.add_host("a")
    net.add_host("b")
    for n, (cc, steered) in enumerate((("nscc-mrc", True), ("fixed", False), (DCTCP, False)), 1):
        qa, _ = net.connect("a", "b", config=QPConfig(cc=cc), planes=2, qpn_a=n, qpn_b=n)
        assert (qa.evs.steering is not None) == steered, cc


# ---- the hooks the requester calls -------------------------------------------------------


class Recording(WindowLaw):
    """A fixed limit of 4 packets that counts every hook call."""

    def __init__(self, params: object, config: QPConfig) -> None:
        self.limit = 4
        self.calls: dict[str, int] = {}

    def _note(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def burst(self, most: int, planes: int) -> int:
        self._note("burst")
        return most

    def pace_gap(self) -> float:
        self._note("pace_gap")
        return 0.0

    def on_resume(self, now: float) -> None:
        self._note("on_resume")

    def on_ack(self, now: float, acked: int, rtt: float | None, ce: bool) -> None:
        self._note("on_ack")
        if acked:
            self._note("acked_bytes")
            self.calls["acked_bytes"] += acked - 1

    def on_trim(self, now: float, rtt_hint: float) -> None:
        self._note("on_trim")
        assert rtt_hint > 0

    def on_loss(self, now: float) -> None:
        self._note("on_loss")

    def on_timeout(self, now: float) -> None:
        self._note("on_timeout")


register("recording", Recording)


def _recorded(faults: Faults, size: int, burst: int = 1) -> tuple[RecordingNetwork, Transfer]:
    net = RecordingNetwork(3, faults)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=PAYLOAD, cc="recording", burst=burst, min_rto=0.005)
    qa, qb = net.connect("a", "b", evs=8, config=cfg)
    t = make_transfer(net, "a", "b", qa, qb, [size + 1000], 3)
    t.post(0, 0, _pattern(size, 3))
    assert run_until(net, [t])
    t.check_final()
    return net, t


def test_the_requester_asks_the_law_and_keeps_to_its_limit() -> None:
    net, t = _recorded(Faults(delay=0.0005, jitter=0.0), 100 * PAYLOAD, burst=2)
    law = t.qp.requester.cc
    assert isinstance(law, Recording)
    assert net.max_in_flight[("a", t.qp.qpn)] == 4  # the law's limit, not max_outstanding
    assert law.calls["acked_bytes"] == 100 * PAYLOAD
    assert law.calls["on_resume"] == 1 and law.calls["burst"] == law.calls["pace_gap"]
    assert "on_trim" not in law.calls and "on_timeout" not in law.calls
    _net, t = _recorded(Faults(trim=0.05, loss=0.03, reorder=0.2), 400 * PAYLOAD)
    law = t.qp.requester.cc
    assert isinstance(law, Recording)
    qs = t.qp.stats
    assert law.calls["on_trim"] == qs.retransmits_nack > 0
    assert law.calls.get("on_timeout", 0) == qs.retransmits_timeout
    assert law.calls.get("on_loss", 0) > 0 and qs.retransmits_sack > 0


# ---- a law written outside mrc, in the simulator -----------------------------------------


def _incast(cc: str, senders: int, packets: int, last: LinkSpec) -> tuple[Fabric, list[Transfer]]:
    cc = load(cc)  # a law given as code is named once loaded
    net = RecordingNetwork(17, Faults(delay=0.0, jitter=0.0))
    fab = Fabric(lasthop=last, record=True)
    net.set_fabric(fab)
    net.add_host("r")
    transfers = []
    for i in range(senders):
        src = f"s{i}"
        net.add_host(src)
        cfg = QPConfig(payload_size=PAYLOAD, max_outstanding=48, ack_every=4, min_rto=0.005, cc=cc)
        qa, qb = net.connect(src, "r", evs=16, config=cfg, qpn_a=i + 1, qpn_b=i + 1)
        t = make_transfer(net, src, "r", qa, qb, [packets * PAYLOAD + 2000], 30 + i)
        t.post(0, 1000, _pattern(packets * PAYLOAD, i), imm=i)
        transfers.append(t)
    assert run_until(net, transfers)
    for t in transfers:
        t.check_final()  # every byte in place, completions in order, nothing placed twice
    return fab, transfers


def _p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def test_an_outside_law_runs_an_incast_and_reacts_to_trims_and_ecn() -> None:
    """Three senders into one trimming last hop (a 20-packet queue): without marks the law
    halves on trims, with marks at 3 packets its CE cuts keep the queue below the trimming
    point, and fewer packets are trimmed. (The fixed window, even at 8 packets per sender,
    storms this queue until max_nack_retries fails its QPs.)"""
    packets = 400
    runs = {}
    alphas: dict[int | None, list[float]] = {}
    for ecn in (None, 3 * WIRE):
        fab, transfers = _incast(
            DCTCP, 3, packets, LinkSpec(rate=RATE, queue=20_000, trim=True, ecn=ecn)
        )
        link = fab.link("last:r/p0")
        counters = [t.qp.requester.cc.counters() for t in transfers]
        assert all(t.qp.stats.retransmits_timeout == 0 for t in transfers)
        assert link.utilization() >= 0.9
        runs[ecn] = (link.stats.trimmed / (3 * packets), link.stats.ecn_marked, counters)
        alphas[ecn] = [getattr(t.qp.requester.cc, "alpha") for t in transfers]  # noqa: B009
    trims, marks, counters = runs[None]
    assert marks == 0 and all(c["cc_ce_cuts"] == 0 and c["cc_trim_cuts"] > 0 for c in counters)
    assert trims < 0.2, trims
    ecn_trims, marks, ecn_counters = runs[3 * WIRE]
    assert marks > 0
    for c, alpha in zip(ecn_counters, alphas[3 * WIRE], strict=True):
        assert c["cc_ce_cuts"] > 0 and 0.0 < alpha < 1.0, (c, alpha)
    assert ecn_trims < trims
    assert sum(c["cc_trim_cuts"] for c in ecn_counters) < sum(c["cc_trim_cuts"] for c in counters)


def test_uet_1_0_nscc_sends_what_nscc_sends_in_a_seeded_incast() -> None:
    """QPs configured ``cc="uet-1.0-nscc"`` put on the wire exactly what ``cc="nscc"`` QPs do,
    datagram for datagram, through a trimming, ECN-marking last hop."""
    last = LinkSpec(rate=RATE, queue=20_000, trim=True, ecn=3 * WIRE)
    runs = []
    for cc in ("nscc", "uet-1.0-nscc"):
        with seeded_secrets(1):
            fab, transfers = _incast(cc, 2, 150, last)
        assert all(isinstance(t.qp.requester.cc, UetNscc) for t in transfers)
        stats = fab.link("last:r/p0").stats
        assert stats.trimmed + stats.ecn_marked > 0  # the law had signals to act on
        net = transfers[0].net
        runs.append([(s.time, s.host, s.qpn, s.ev, s.sport, s.data) for s in net.sent])
    assert runs[0] == runs[1]


def test_ecn_keeps_an_outside_laws_queue_short() -> None:
    """One flow into a deep tail-drop queue: without marks the window grows to its cap and the
    queue holds it; with marks at 3 packets the law's CE cuts keep the queue near that."""
    packets = 800
    plain_fab, plain = _incast(DCTCP, 1, packets, LinkSpec(rate=RATE, queue=60_000))
    marked_fab, marked = _incast(DCTCP, 1, packets, LinkSpec(rate=RATE, queue=60_000, ecn=3 * WIRE))
    plain_link, marked_link = plain_fab.link("last:r/p0"), marked_fab.link("last:r/p0")
    assert plain_link.stats.ecn_marked == 0
    assert plain[0].qp.requester.cc.counters()["cc_ce_cuts"] == 0
    assert marked[0].qp.requester.cc.counters()["cc_ce_cuts"] > 0
    for link in (plain_link, marked_link):
        assert link.stats.dropped == 0 and link.utilization() >= 0.95
    assert _p99(marked_link.stats.queue_delays) * 2 < _p99(plain_link.stats.queue_delays)
