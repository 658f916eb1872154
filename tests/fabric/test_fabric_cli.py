"""(f) The CLI: one-line errors with non-zero exits, help, and the happy paths."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from fabric.fabric_helpers import SKIP_REASON, needs_netns, run_cli, running_fabric, unique_name

from mrc.lab.cli.fabric import main
from mrc.lab.fabric import FabricSpec, Topology


def _one_line_error(
    res: subprocess.CompletedProcess[str], code: int | None = None, contains: str = ""
) -> None:
    assert res.returncode != 0
    if code is not None:
        assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("mrc-fabric: error: ")
    assert contains in lines[0]


@pytest.mark.parametrize(
    "args, contains",
    [
        (["up", "--planes", "0"], "--planes"),
        (["up", "--hosts", "1"], "--hosts"),
        (["up", "--spines", "-1"], "--spines"),
        (["up", "--planes", "two"], "integer"),
        (["up", "--rate", "fast"], "rate"),
        (["up", "--mtu", "500"], "--mtu"),
        (["up", "--name", "bad-name"], "name"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["link", "sideways", "h0", "p0l0"], "invalid choice"),
        (["link", "down", "h0"], "required"),
        (["down", "--name", "../etc"], "name"),
        (["up", "--rate", "10mbit", "--trim", "--ecn-threshold", "1.5"], "--ecn-threshold"),
        (["up", "--rate", "10mbit", "--trim", "--ecn-threshold", "x"], "--ecn-threshold"),
        (["up", "--rate", "10mbit", "--ecn-threshold", "0.5"], "needs --trim"),
        (["up", "--rate", "10mbit", "--no-prio-band"], "needs --trim"),
    ],
)
def test_bad_arguments(args: list[str], contains: str) -> None:
    _one_line_error(run_cli(*args), code=2, contains=contains)


def test_help_explains_every_subcommand() -> None:
    res = run_cli("--help")
    assert res.returncode == 0
    for cmd in ("up", "down", "status", "link", "exec", "list", "paths", "ping"):
        assert cmd in res.stdout
        sub = run_cli(cmd, "--help")
        assert sub.returncode == 0 and "usage:" in sub.stdout, cmd


def test_not_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Pretend to be unprivileged (a real uid switch cannot exec a venv living under /root)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cases = (["up", "--name", unique_name("n")], ["down"], ["status"], ["link", "up", "a", "b"])
    for args in cases:
        assert main(args) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mrc-fabric: error: must run as root")


@pytest.fixture(scope="module")
def small() -> Iterator[Topology]:
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    with running_fabric(FabricSpec(name=unique_name("f"), planes=2, hosts=3)) as topo:
        yield topo


@pytest.mark.netns
@pytest.mark.parametrize(
    "args, code, contains",
    [
        (["link", "down", "h7", "p0l0"], 2, "unknown node 'h7'"),
        (["link", "down", "h0", "p0s0"], 2, "no link between"),
        (["link", "up", "p0l0", "p1s0"], 2, "no link between"),
        (["exec", "h9", "--", "true"], 2, "unknown node"),
        (["exec", "h0"], 2, "needs a command"),
        (["exec", "h0", "--", "no-such-command-mrc"], 127, "cannot run"),
        (["exec", "h0", "--bogus", "--", "true"], 2, "unexpected"),
        (["ping", "h0", "h0"], 2, "same host"),
        (["ping", "h0", "h1", "--via", "p0l0"], 2, "not a spine"),
        (["paths", "h0", "h42"], 2, "unknown node"),
    ],
)
def test_bad_names_on_running_fabric(
    small: Topology, args: list[str], code: int, contains: str
) -> None:
    res = run_cli(args[0], "--name", small.name, *args[1:])
    _one_line_error(res, code=code, contains=contains)


@pytest.mark.netns
def test_unknown_fabric() -> None:
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    for args in (["status"], ["link", "down", "h0", "p0l0"], ["paths", "h0", "h1"]):
        _one_line_error(run_cli(*args, "--name", "nosuchfabric"), code=1, contains="no fabric")


@pytest.mark.netns
def test_happy_paths(small: Topology) -> None:
    name = small.name
    res = run_cli("list", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["fabrics"][name]["namespaces"] == 11

    res = run_cli("status", "--json", "--name", name)
    st = json.loads(res.stdout)
    assert len(st["links"]) == len(small.links) and all(lk["up"] for lk in st["links"])
    assert {"tx_packets", "rx_packets", "tx_bytes", "rx_bytes", "qdisc_drops"} <= set(
        st["links"][0]["a_end"]
    )
    assert "LINK" in run_cli("status", "--name", name).stdout

    res = run_cli("exec", "--name", name, "h2", "--", "sh", "-c", "exit 7")
    assert res.returncode == 7  # exit code passed through
    res = run_cli(
        "exec", "--name", name, "p1s1", "--", "sysctl", "-n", "net.ipv6.conf.l0.forwarding"
    )
    assert res.stdout.strip() == "1"

    res = run_cli("paths", "--name", name, "h0", "h2", "--json")
    assert [p["spine"] for p in json.loads(res.stdout)["paths"]] == ["p0s0", "p0s1", "p1s0", "p1s1"]

    res = run_cli("ping", "--name", name, "h0", "h2", "--via", "p1s1", "-c", "2")
    assert res.returncode == 0 and "2/2 replies" in res.stdout, res.stderr


@needs_netns
@pytest.mark.netns
def test_up_json_and_down() -> None:
    name = unique_name("u")
    try:
        res = run_cli(
            "up",
            "--name",
            name,
            "--planes",
            "1",
            "--hosts",
            "2",
            "--leaves",
            "1",
            "--spines",
            "1",
            "--json",
        )
        assert res.returncode == 0, res.stderr
        topo = json.loads(res.stdout)
        assert topo["name"] == name and len(topo["routers"]) == 2
        with open(f"/run/mrc/fabric-{name}.json") as f:
            assert json.load(f) == topo
    finally:
        res = run_cli("down", "--name", name)
    assert res.returncode == 0 and "removed 4 namespaces" in res.stdout
    res = run_cli("down", "--name", name)
    assert res.returncode == 0 and "nothing to remove" in res.stdout
