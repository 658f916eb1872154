"""A QP's line rate from the host's NICs (mrc/transport/linkspeed.py), read from a fake
/proc and /sys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mrc.core.config import QPConfig
from mrc.lab.testbed import TwoHosts
from mrc.transport.linkspeed import (
    device_of,
    line_rate_bps,
    nic_speed_bps,
    topology_rate_bps,
    with_line_rate,
)

IF_INET6 = """\
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000102 03 40 00 80    plane0
fd000001000000000000000000000102 04 40 00 80    plane1
fe80000000000000020000fffe000001 02 40 20 80     veth0
"""
# 10.0.0.0/24 on plane0, 10.1.0.0/16 on plane1, a default route through eth9
ROUTE = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth9\t00000000\t0101000A\t0003\t0\t0\t0\t00000000\t0\t0\t0
plane0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
plane1\t0000010A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
"""


def _roots(
    tmp_path: Path, speeds: dict[str, str], virtual: tuple[str, ...] = ("lo", "veth0")
) -> tuple[Path, Path]:
    """A fake /proc and /sys: every device in ``speeds`` has a NIC (``device``) but those
    named in ``virtual``."""
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "if_inet6").write_text(IF_INET6)
    (proc / "net" / "route").write_text(ROUTE)
    for dev, speed in speeds.items():
        d = sys_ / "class" / "net" / dev
        d.mkdir(parents=True)
        if dev not in virtual:
            (d / "device").mkdir()
        if speed:
            (d / "speed").write_text(speed + "\n")
    return proc, sys_


def test_devices_and_speeds_from_a_fake_tree(tmp_path: Path) -> None:
    proc, sys_ = _roots(tmp_path, {"plane0": "25000", "plane1": "100", "veth0": "-1", "lo": ""})
    assert device_of("fd00::102", proc) == "plane0"
    assert device_of("fd00:1::102", proc) == "plane1"
    assert device_of("fe80::200:ff:fe00:1%veth0", proc) == "veth0"
    assert device_of("10.0.0.7", proc) == "plane0"
    assert device_of("10.1.3.4", proc) == "plane1"
    assert device_of("192.168.1.1", proc) is None  # only the default route: no owner
    assert device_of("not an address", proc) is None
    assert nic_speed_bps("plane0", sys_) == 25e9
    assert nic_speed_bps("plane1", sys_) == 100e6
    assert nic_speed_bps("veth0", sys_) is None  # -1: unknown
    assert nic_speed_bps("lo", sys_) is None  # no speed file
    assert nic_speed_bps("gone", sys_) is None


def test_a_virtual_device_s_speed_is_no_line_rate(tmp_path: Path) -> None:
    """A veth says 10000 Mbit/s whatever it carries; a VLAN on a NIC says the NIC's speed."""
    _, sys_ = _roots(tmp_path, {"veth0": "10000", "vlan7": "25000"}, virtual=("veth0", "vlan7"))
    assert nic_speed_bps("veth0", sys_) is None
    assert nic_speed_bps("vlan7", sys_) is None  # no lower device yet
    (sys_ / "class" / "net" / "vlan7" / "lower_eth0").mkdir()
    assert nic_speed_bps("vlan7", sys_) == 25e9


def test_the_sum_over_planes_or_none(tmp_path: Path) -> None:
    proc, sys_ = _roots(tmp_path, {"plane0": "25000", "plane1": "100", "veth0": "-1"})
    kw: dict[str, Any] = {"sys_root": sys_, "proc_root": proc}
    assert line_rate_bps(["fd00::102", "10.1.0.9"], **kw) == 25e9 + 100e6
    assert line_rate_bps(["fd00::102", "fe80::200:ff:fe00:1"], **kw) is None  # a veth
    assert line_rate_bps(["::1"], **kw) is None  # loopback
    assert line_rate_bps([], **kw) is None


def test_a_topology_link_rate_comes_first(tmp_path: Path) -> None:
    proc, sys_ = _roots(tmp_path, {"veth0": "-1"})
    link = SimpleNamespace(kind="host-leaf", rate_bps=100_000_000, a_address="fe80::200:ff:fe00:1")
    spine = SimpleNamespace(kind="leaf-spine", rate_bps=1, a_address="fd00::102")
    topo: Any = SimpleNamespace(links=[spine, link])
    assert topology_rate_bps("fe80::200:ff:fe00:1", topo) == 100e6
    assert topology_rate_bps("fd00::102", topo) is None  # not a host's link
    rate = line_rate_bps(["fe80::200:ff:fe00:1"], topo, sys_root=sys_, proc_root=proc)
    assert rate == 100e6


def test_with_line_rate_fills_a_copy_and_keeps_what_the_user_set() -> None:
    topo: Any = SimpleNamespace(
        links=[SimpleNamespace(kind="host-leaf", rate_bps=50_000_000, a_address="fd00::1")]
    )
    cfg = QPConfig()
    told = with_line_rate(cfg, ["fd00::1"], topo)
    assert told.line_rate_bps == 50e6 and cfg.line_rate_bps is None
    mine = QPConfig(line_rate_bps=1e9)
    assert with_line_rate(mine, ["fd00::1"], topo) is mine
    assert with_line_rate(cfg, ["::1"]) is cfg  # loopback: unknown, unchanged


def test_a_real_veth_gives_no_line_rate(two_hosts: TwoHosts) -> None:
    """On a real veth (the kernel's, in a namespace) the speed file says 10000 and the QP's
    line rate is unknown: read from inside host A, where its own /sys is mounted."""
    probe = (
        "import sys; from mrc.transport.linkspeed import device_of, line_rate_bps;"
        "dev = device_of(sys.argv[1]); speed = open(f'/sys/class/net/{dev}/speed').read();"
        "print(dev, speed.strip(), line_rate_bps(sys.argv[1:]))"
    )
    argv = two_hosts.exec_argv("a", [sys.executable, "-c", probe, *two_hosts.a_addrs])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    ia, _ = two_hosts.link_names(0)
    assert out == [ia, "10000", "None"]
