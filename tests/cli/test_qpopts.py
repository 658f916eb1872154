"""``--qp KEY=VALUE`` (mrc/cli/qpopts.py): one parser for every QPConfig knob, in mrc-send,
mrc-bench (forwarded to its agents) and the failover demo's roles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrc.cli.qpopts import BASE_PSN_WINDOW, apply_settings, parse_setting, with_window
from mrc.core.config import QPConfig

BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("probe_interval=0.01", "probe_interval", 0.01),
        ("route_dead_evs=0", "route_dead_evs", 0),
        ("route_weighted_planes=1", "route_weighted_planes", True),
        ("ecn_steering=off", "ecn_steering", False),
        ("plane_steering=True", "plane_steering", True),
        ("plane_steering=none", "plane_steering", None),
        ("burst=auto", "burst", None),
        ("burst=8", "burst", 8),
        ("cc=fixed", "cc", "fixed"),
        ("cc.gain=0.5", "cc.gain", "0.5"),  # text: the law's hook reads it
    ],
)
def test_values_take_their_fields_type(text: str, key: str, value: object) -> None:
    assert parse_setting(text) == (key, value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("probe_intervl=0.01", "did you mean probe_interval"),
        ("zzz=1", "QPConfig fields: ack_batch_bytes, ack_batch_max, ack_delay, ack_every,"),
        ("probe_interval", "want KEY=VALUE"),
        ("=1", "want KEY=VALUE"),
        ("route_dead_evs=two", "route_dead_evs: want an integer, not 'two'"),
        ("max_outstanding=1.5", "want an integer"),
        ("ack_delay=nan", "want a finite number"),
        ("ecn_steering=maybe", "want a boolean"),
        ("cc.=1", "want cc.NAME=VALUE"),
    ],
)
def test_unknown_keys_and_bad_values_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_setting(text)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_settings_apply_in_order_and_the_psn_window_follows_the_window() -> None:
    cfg = apply_settings(QPConfig(), ["probe_interval=0.01", "probe_interval=0.03"])
    assert cfg.probe_interval == 0.03
    assert with_window(QPConfig(), 64).psn_window == BASE_PSN_WINDOW == 16384
    assert with_window(QPConfig(), 8192).psn_window == 4 * 8192
    cfg = apply_settings(QPConfig(), ["max_outstanding=8192"])
    assert (cfg.max_outstanding, cfg.psn_window) == (8192, 32768)
    cfg = apply_settings(QPConfig(), ["psn_window=40000", "max_outstanding=8192"])
    assert (cfg.max_outstanding, cfg.psn_window) == (8192, 40000)  # given: kept


def test_cc_keys_are_parameters_of_the_law_the_settings_choose() -> None:
    """cc.NAME is read by the law's own Params, after every other key, so that a ``cc=``
    given later still decides which law it belongs to."""
    assert apply_settings(QPConfig(), ["cc.gamma=1"]).cc_params == {"gamma": 1.0}
    with pytest.raises(ValueError, match="window law fixed has no such parameter"):
        apply_settings(QPConfig(), ["cc.gamma=1", "cc=fixed"])
    with pytest.raises(ValueError, match="cc.gamma must be"):
        apply_settings(QPConfig(), ["cc.gamma=fast"])
    cfg = apply_settings(QPConfig(cc="fixed"), ["cc.min_window=0.5", "cc=nscc-mrc"])
    assert cfg.cc == "nscc-mrc" and cfg.cc_params == {"min_window": 0.5}


def test_cc_keys_go_to_the_hook() -> None:
    seen: list[tuple[str, str]] = []
    cfg = apply_settings(
        QPConfig(), ["cc.gain=1", "cc=fixed"], cc=lambda c, name, v: seen.append((name, v))
    )
    assert seen == [("gain", "1")] and cfg.cc == "fixed"


def _usage_error(*argv: str) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_mrc_send_takes_qp_and_refuses_a_bad_one_in_one_line() -> None:
    from mrc.cli.configs import sender_qp
    from mrc.cli.send import build_parser

    args = build_parser().parse_args(
        ["--size", "1M", "--to", "[::1]:1", "--window", "8192", "--qp", "probe_interval=0.01"]
    )
    cfg = sender_qp(args, 1400)
    assert (cfg.probe_interval, cfg.max_outstanding, cfg.psn_window) == (0.01, 8192, 32768)
    line = _usage_error(str(BIN / "mrc-send"), "--size", "1M", "--to", "[::1]:1", "--qp", "x=1")
    assert line.startswith("mrc-send: error: argument --qp: unknown QP setting 'x'")
    line = _usage_error(
        str(BIN / "mrc-send"), "--size", "1M", "--to", "[::1]:1", "--qp", "ecn_penalty_min=99"
    )
    assert line.startswith("mrc-send: error: ecn_penalty_min must be between")


def test_mrc_bench_forwards_its_qp_settings_whole_to_the_agents() -> None:
    from mrc.lab.bench.agent import MrcTransport
    from mrc.lab.cli.bench import build_parser, config_from_args

    cfg = config_from_args(
        build_parser().parse_args(
            ["--cc", "fixed", "--qp", "route_dead_evs=0", "--qp", "tlp_max=1"]
        )
    )
    settings = cfg.qp_settings("clean")
    assert settings[-2:] == ["route_dead_evs=0", "tlp_max=1"]
    qp = MrcTransport._config(None, {"qp": settings})  # type: ignore[arg-type]
    assert (qp.cc, qp.max_outstanding, qp.route_dead_evs, qp.tlp_max) == ("fixed", 4, 0, 1)
    assert qp.payload_size == cfg.payload and cfg.qp_settings("trim")[1] == "max_outstanding=16"
    line = _usage_error(str(BIN / "mrc-bench"), "--qp", "max_outstanding=0")
    assert line == "mrc-bench: error: clean: max_outstanding must be at least 1"
    line = _usage_error(str(BIN / "mrc-bench"), "--qp", "route_dead_evz=0")
    assert "did you mean route_dead_evs" in line


def test_the_failover_roles_read_qp_the_same_way() -> None:
    import argparse

    from mrc.lab.bench.failover_roles import _mrc_config

    args = argparse.Namespace(payload=8192, window=64, qp=["route_weighted_planes=1"])
    cfg = _mrc_config(args)
    assert (cfg.payload_size, cfg.max_outstanding, cfg.psn_window) == (8192, 64, 16384)
    assert cfg.route_weighted_planes is True
    res = subprocess.run(
        [
            sys.executable, "-m", "mrc.lab.bench.failover_roles", "mrc-send", "--fabric", "f",
            "--host", "h", "--port", "1", "--size", "1", "--result", "r", "--qp", "tlp_max=x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr  # plain argparse: usage, then the one error line
    assert res.stderr.splitlines()[-1].endswith(
        "error: argument --qp: tlp_max: want an integer, not 'x'"
    )


def test_mrc_send_spray_sets_the_burst_and_refuses_a_contradiction() -> None:
    from mrc.cli.configs import sender_qp
    from mrc.cli.send import build_parser

    def qp(*extra: str) -> QPConfig:
        args = build_parser().parse_args(["--size", "1M", "--to", "[::1]:1", *extra])
        return sender_qp(args, 1400)

    assert qp("--spray", "packet").burst_max == 1
    assert qp("--spray", "burst").burst == qp().burst is None  # the law's bursts (nscc: 16)
    assert qp().burst_max > 1
    assert qp("--spray", "burst", "--burst", "8").burst_max == 8
    line = _usage_error(
        str(BIN / "mrc-send"),
        "--size",
        "1M",
        "--to",
        "[::1]:1",
        "--spray",
        "packet",
        "--burst",
        "4",
    )
    assert line.startswith("mrc-send: error: --spray packet sends every packet on its own EV")
    line = _usage_error(
        str(BIN / "mrc-send"), "--size", "1M", "--to", "[::1]:1", "--spray", "burst", "--burst", "1"
    )
    assert line.startswith("mrc-send: error: --spray burst needs bursts: not --burst 1")
