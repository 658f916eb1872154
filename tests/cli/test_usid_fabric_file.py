"""A real uSID fabric's file (mrc/topology/realfile.py) and mrc-host-setup's plan of it.

Every mistake in the ``usid`` parts of a file is one line naming the field, before anything
touches the network; a good file gives each path its container and source ports, and the
host set-up the exact ``ip`` lines ``--dry-run`` prints. No root needed: all of it is pure.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mrc.errors import UsageError
from mrc.srv6 import hostroutes
from mrc.srv6.evroutes import fabric_routes, route_overhead
from mrc.topology.realfile import UsidTopology, load_fabric, parse_real_fabric

if TYPE_CHECKING:
    from conftest import MrcTools


def nic(plane: int, host: int, leaf: str, dev: str) -> dict[str, Any]:
    return {
        "plane": plane,
        "address": f"2001:db8:{plane}:{host}::10",
        "leaf": leaf,
        "usid": f"c{plane}0{host}",
        "dev": dev,
        "gateway": "fe80::1",
    }


GOOD: dict[str, Any] = {
    "name": "lab",
    "srv6": "usid",
    "usid": {"block": "fcbb:bb00::/32", "mtu": 9000},
    "planes": [
        {
            "plane": 0,
            "leaves": [{"name": "red-l1", "usid": "4001"}, {"name": "red-l2", "usid": "4002"}],
            "spines": [{"name": "red-s1", "usid": "8001"}, {"name": "red-s2", "usid": "8002"}],
        },
        {
            "plane": 1,
            "leaves": [{"name": "blue-l1", "usid": "4101"}, {"name": "blue-l2", "usid": "4102"}],
            "spines": [{"name": "blue-s1", "usid": "8101"}],
        },
    ],
    "hosts": [
        {"name": "gpu1", "nics": [nic(0, 1, "red-l1", "eth1"), nic(1, 1, "blue-l1", "eth2")]},
        {"name": "gpu2", "nics": [nic(1, 2, "blue-l2", "eth2"), nic(0, 2, "red-l2", "eth1")]},
    ],
}


def edit(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    change(doc)
    return doc


def put(path: tuple[Any, ...], value: object) -> Callable[[dict[str, Any]], object]:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], object]:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


NIC0 = ("hosts", 0, "nics", 0)
USID_KEYS = "(known: 'block', 'mtu', 'ports', 'table', 'priority')"
NIC_KEYS = "(known: 'plane', 'address', 'leaf', 'usid', 'dev', 'gateway')"
NOT_USID = 'is not a micro-SID: 1-4 hex digits, not 0 ("8101")'

# (id, document, the error after "fabric file x: ")
BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "srv6-unknown",
        edit(put(("srv6",), "mpls")),
        "srv6: 'mpls': one of 'srh' (the default) or 'usid'",
    ),
    ("no-usid", edit(drop(("usid",))), "top level: missing key 'usid'"),
    ("usid-a-list", edit(put(("usid",), [])), "usid: must be an object, not a list"),
    (
        "usid-unknown-key",
        edit(put(("usid", "locator"), "x")),
        f"usid: unknown key 'locator' {USID_KEYS}",
    ),
    ("no-block", edit(drop(("usid", "block"))), "usid: missing key 'block'"),
    ("no-mtu", edit(drop(("usid", "mtu"))), "usid: missing key 'mtu'"),
    (
        "block-a-number",
        edit(put(("usid", "block"), 5)),
        "usid.block: must be a string (an IPv6 prefix such as fcbb:bb00::/32), not a number",
    ),
    (
        "block-not-a-prefix",
        edit(put(("usid", "block"), "fcbb")),
        "usid.block: 'fcbb' is not an IPv6 prefix such as fcbb:bb00::/32",
    ),
    (
        "block-host-bits",
        edit(put(("usid", "block"), "fcbb:bb00::1/32")),
        "usid.block: 'fcbb:bb00::1/32' has bits set after its prefix length",
    ),
    (
        "block-a-48",
        edit(put(("usid", "block"), "fcbb:bb00:1::/48")),
        "usid.block: 'fcbb:bb00:1::/48': the block must be a /32 (F3216: a 32-bit block, 16-bit "
        "micro-SIDs)",
    ),
    (
        "block-multicast",
        edit(put(("usid", "block"), "ff00::/32")),
        "usid.block: 'ff00::/32' is not a unicast prefix",
    ),
    ("mtu-small", edit(put(("usid", "mtu"), 1000)), "usid.mtu: must be 1280 to 65535, not 1000"),
    (
        "mtu-a-string",
        edit(put(("usid", "mtu"), "9000")),
        "usid.mtu: must be an integer, not a string",
    ),
    ("mtu-bool", edit(put(("usid", "mtu"), True)), "usid.mtu: must be an integer, not true/false"),
    (
        "table-main",
        edit(put(("usid", "table"), 254)),
        "usid.table: must be 256 to 2147483647, not 254",
    ),
    ("priority-0", edit(put(("usid", "priority"), 0)), "usid.priority: must be 1 to 32765, not 0"),
    (
        "ports-a-number",
        edit(put(("usid", "ports"), 61000)),
        'usid.ports: must be a string such as "61000-65534", not a number',
    ),
    (
        "ports-garbage",
        edit(put(("usid", "ports"), "61000:62000")),
        "usid.ports: '61000:62000' is not a port range such as 61000-65534",
    ),
    (
        "ports-privileged",
        edit(put(("usid", "ports"), "1000-2000")),
        "usid.ports: '1000-2000': LO-HI with 1024 <= LO <= HI <= 65534 (a port below 1024 needs "
        "privileges to bind; the kernel's rules stop at 65534)",
    ),
    (
        "ports-to-65535",
        edit(put(("usid", "ports"), "61000-65535")),
        "usid.ports: '61000-65535': LO-HI with 1024 <= LO <= HI <= 65534 (a port below 1024 needs "
        "privileges to bind; the kernel's rules stop at 65534)",
    ),
    (
        "ports-too-few",
        edit(put(("usid", "ports"), "61000-61002")),
        "usid.ports: 61000-61002 gives each of 2 spine indexes 1 ports, fewer than one connection "
        "binds (2: one per plane)",
    ),
    ("plane-no-leaves", edit(drop(("planes", 1, "leaves"))), "planes[1]: missing key 'leaves'"),
    (
        "plane-empty-leaves",
        edit(put(("planes", 0, "leaves"), [])),
        "planes[0].leaves: must not be empty",
    ),
    (
        "spine-with-a-sid",
        edit(put(("planes", 0, "spines", 1, "sid"), "fc00::1")),
        "planes[0].spines[1]: unknown key 'sid' (known: 'name', 'usid')",
    ),
    (
        "spine-no-usid",
        edit(drop(("planes", 1, "spines", 0, "usid"))),
        "planes[1].spines[0]: missing key 'usid'",
    ),
    (
        "usid-five-digits",
        edit(put(("planes", 0, "spines", 1, "usid"), "18002")),
        f"planes[0].spines[1].usid: '18002' {NOT_USID}",
    ),
    (
        "usid-zero",
        edit(put(("planes", 0, "leaves", 0, "usid"), "0000")),
        f"planes[0].leaves[0].usid: '0000' {NOT_USID}",
    ),
    (
        "usid-not-hex",
        edit(put(("planes", 0, "leaves", 0, "usid"), "4g01")),
        f"planes[0].leaves[0].usid: '4g01' {NOT_USID}",
    ),
    (
        "usid-a-number",
        edit(put(("planes", 0, "leaves", 0, "usid"), 4001)),
        'planes[0].leaves[0].usid: must be a string of 1-4 hex digits ("8101"), not a number',
    ),
    (
        "usid-twice",
        edit(put(("planes", 0, "spines", 0, "usid"), "4002")),
        "planes[0].spines[0].usid: micro-SID 4002 is already planes[0].leaves[1].usid",
    ),
    (
        "usid-twice-across-planes",
        edit(put(("planes", 1, "leaves", 0, "usid"), "4001")),
        "planes[1].leaves[0].usid: micro-SID 4001 is already planes[0].leaves[0].usid",
    ),
    (
        "nic-usid-is-a-spine's",
        edit(put((*NIC0, "usid"), "8001")),
        "hosts[0].nics[0].usid: micro-SID 8001 is already planes[0].spines[0].usid",
    ),
    (
        "nic-usid-twice-any-case",
        edit(put(("hosts", 1, "nics", 1, "usid"), "C001")),
        "hosts[1].nics[1].usid: micro-SID c001 is already hosts[0].nics[0].usid",
    ),
    (
        "leaf-named-like-a-spine",
        edit(put(("planes", 1, "leaves", 1, "name"), "red-s1")),
        "planes[1].leaves[1].name: name red-s1 is already planes[0].spines[0].name",
    ),
    (
        "nic-unknown-key",
        edit(put((*NIC0, "mac"), "x")),
        f"hosts[0].nics[0]: unknown key 'mac' {NIC_KEYS}",
    ),
    ("nic-no-dev", edit(drop((*NIC0, "dev"))), "hosts[0].nics[0]: missing key 'dev'"),
    ("nic-no-gateway", edit(drop((*NIC0, "gateway"))), "hosts[0].nics[0]: missing key 'gateway'"),
    ("nic-no-leaf", edit(drop((*NIC0, "leaf"))), "hosts[0].nics[0]: missing key 'leaf'"),
    ("nic-no-usid", edit(drop((*NIC0, "usid"))), "hosts[0].nics[0]: missing key 'usid'"),
    (
        "nic-leaf-of-another-plane",
        edit(put(("hosts", 0, "nics", 1, "leaf"), "red-l1")),
        "hosts[0].nics[1].leaf: 'red-l1' is not a leaf of plane 1 (blue-l1, blue-l2)",
    ),
    (
        "nic-leaf-a-spine",
        edit(put((*NIC0, "leaf"), "red-s1")),
        "hosts[0].nics[0].leaf: 'red-s1' is not a leaf of plane 0 (red-l1, red-l2)",
    ),
    (
        "nic-leaf-a-number",
        edit(put((*NIC0, "leaf"), 1)),
        "hosts[0].nics[0].leaf: must be a string (a leaf's name), not a number",
    ),
    (
        "nic-dev-with-a-space",
        edit(put((*NIC0, "dev"), "eth 1")),
        "hosts[0].nics[0].dev: 'eth 1' is not an interface name (1-15 letters, digits, '_.+-')",
    ),
    (
        "nic-dev-too-long",
        edit(put((*NIC0, "dev"), "a" * 16)),
        f"hosts[0].nics[0].dev: '{'a' * 16}' is not an interface name (1-15 letters, digits, "
        "'_.+-')",
    ),
    (
        "nic-dev-dotdot",
        edit(put((*NIC0, "dev"), "..")),
        "hosts[0].nics[0].dev: '..' is not an interface name (1-15 letters, digits, '_.+-')",
    ),
    (
        "nic-dev-null",
        edit(put((*NIC0, "dev"), None)),
        "hosts[0].nics[0].dev: must be a string (an interface name), not null",
    ),
    (
        "gateway-scoped",
        edit(put((*NIC0, "gateway"), "fe80::1%eth1")),
        "hosts[0].nics[0].gateway: 'fe80::1%eth1' has a scope; 'dev' says the interface",
    ),
    (
        "gateway-multicast",
        edit(put((*NIC0, "gateway"), "ff02::2")),
        "hosts[0].nics[0].gateway: ff02::2 is a multicast address; give the next hop's unicast "
        "address",
    ),
    (
        "gateway-not-ipv6",
        edit(put((*NIC0, "gateway"), "10.0.0.1")),
        "hosts[0].nics[0].gateway: '10.0.0.1' is not an IPv6 address",
    ),
    (
        "address-in-the-block",
        edit(put((*NIC0, "address"), "fcbb:bb00:1::10")),
        "hosts[0].nics[0].address: fcbb:bb00:1::10 is inside the uSID block fcbb:bb00::/32: give "
        "the NIC's own address",
    ),
    (
        "address-link-local",
        edit(put((*NIC0, "address"), "fe80::10")),
        "hosts[0].nics[0].address: fe80::10 is a link-local address; give a unicast address "
        "routed in the fabric",
    ),
    (
        "nic-missing-plane",
        edit(lambda d: d["hosts"][1]["nics"].pop()),
        "hosts[1].nics: host gpu2 has no NIC in plane 0",
    ),
    (
        "plane-gap",
        edit(put(("planes", 1, "plane"), 2)),
        "planes: plane numbers must be 0..1; plane 1 is missing",
    ),
]


@pytest.mark.parametrize(
    ("doc", "error"), [(d, e) for _i, d, e in BAD], ids=[i for i, _d, _e in BAD]
)
def test_a_mistake_is_one_line_naming_the_field(doc: dict[str, Any], error: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_real_fabric(doc, "fabric file x")
    assert str(caught.value) == f"fabric file x: {error}"


def write(tmp_path: Path, doc: object, name: str = "lab.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def test_the_commands_say_a_mistake_in_one_line(mrc_tools: MrcTools, tmp_path: Path) -> None:
    """mrc-send, mrc-recv and mrc-host-setup: exit 2, one line, no traceback."""
    path = write(tmp_path, edit(put(("usid", "block"), "fcbb:bb00::/48")))
    said = "usid.block: 'fcbb:bb00::/48': the block must be a /32"
    for tool, args in (
        ("mrc-send", ["--size", "1K", "--to", "gpu2", "--fabric", str(path)]),
        ("mrc-recv", ["--discard", "--fabric", str(path)]),
        ("mrc-host-setup", ["--fabric", str(path), "--dry-run"]),
    ):
        res = mrc_tools.run(tool, *args, timeout=60)
        assert res.returncode == 2 and res.stdout == "", res.describe()
        assert res.stderr.startswith(f"{tool}: error: fabric file {path}: {said}"), res.describe()
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.describe()


def test_a_good_file_gives_containers_and_ports_per_path() -> None:
    topo = parse_real_fabric(copy.deepcopy(GOOD), "fabric file lab.json")
    assert isinstance(topo, UsidTopology) and topo.srv6 == "usid" and topo.mtu == 9000
    assert [r.name for r in topo.routers] == [
        *("red-l1", "red-l2", "red-s1", "red-s2"),
        *("blue-l1", "blue-l2", "blue-s1"),
    ]
    assert topo.router("red-s2").sid == "fcbb:bb00:8002::"  # its locator
    assert (topo.spines_per_plane, topo.leaves_per_plane) == (2, 2)
    assert topo.layout.spine_ports == ((61000, 63266), (63267, 65533))
    assert topo.layout.source == "lab.json"
    assert route_overhead(topo) == 40  # an outer IPv6 header, no routing header
    gpu1, gpu2 = topo.host("gpu1"), topo.host("gpu2")
    pairs = [(gpu1.nic(p).address, gpu2.nic(p).address) for p in range(2)]
    routes = fabric_routes(topo, pairs)
    got = [[(r.label, r.srh, r.mark, r.ports) for r in plane] for plane in routes]
    assert got == [
        [("red-s1", None, 0, (61000, 63266)), ("red-s2", None, 0, (63267, 65533))],
        [("blue-s1", None, 0, (61000, 63266))],
    ]
    back = fabric_routes(topo, [(b, a) for a, b in pairs])  # the ACKs' way, from gpu2
    assert [[r.ports for r in plane] for plane in back] == [
        [(61000, 63266), (63267, 65533)],
        [(61000, 63266)],
    ]


def test_a_file_may_choose_ports_table_and_priority() -> None:
    doc = edit(put(("usid",), {"block": "fc00:1::/32", "mtu": 1500, "ports": "40000-40099"}))
    doc["usid"] |= {"table": 300, "priority": 99}
    topo = parse_real_fabric(doc, "fabric file x")
    assert isinstance(topo, UsidTopology)
    assert topo.layout.spine_ports == ((40000, 40049), (40050, 40099))
    lines = hostroutes.ip_lines(hostroutes.plan(topo, "gpu2"))
    assert lines[-2:] == [
        "ip -6 rule add priority 99 ipproto udp sport 40000-40049 table 300",
        "ip -6 rule add priority 99 ipproto udp sport 40050-40099 table 301",
    ]
    assert lines[0] == "ip -6 route replace fc00:1:4002::/48 via fe80::1 dev eth1"
    assert "segs fc00:1:4002:8001:4001:c001:: via fe80::1 dev eth1 table 300 mtu 1524" in lines[2]


EXPECTED_GPU1 = [
    "ip -6 route replace fcbb:bb00:4001::/48 via fe80::1 dev eth1",
    "ip -6 route replace fcbb:bb00:c001::/48 encap seg6local action End.DT6 table local dev eth1",
    "ip -6 route replace 2001:db8:0:2::10/128 encap seg6 mode encap.red segs "
    "fcbb:bb00:4001:8001:4002:c002:: via fe80::1 dev eth1 table 4000 mtu 9024",
    "ip -6 route replace 2001:db8:0:2::10/128 encap seg6 mode encap.red segs "
    "fcbb:bb00:4001:8002:4002:c002:: via fe80::1 dev eth1 table 4001 mtu 9024",
    "ip -6 route replace fcbb:bb00:4101::/48 via fe80::1 dev eth2",
    "ip -6 route replace fcbb:bb00:c101::/48 encap seg6local action End.DT6 table local dev eth2",
    "ip -6 route replace 2001:db8:1:2::10/128 encap seg6 mode encap.red segs "
    "fcbb:bb00:4101:8101:4102:c102:: via fe80::1 dev eth2 table 4000 mtu 9024",
    "ip -6 rule add priority 1000 ipproto udp sport 61000-63266 table 4000",
    "ip -6 rule add priority 1000 ipproto udp sport 63267-65533 table 4001",
]

EXPECTED_GPU1_REMOVE = [
    "ip -6 rule del priority 1000 ipproto udp sport 63267-65533 table 4001",
    "ip -6 rule del priority 1000 ipproto udp sport 61000-63266 table 4000",
    "ip -6 route del 2001:db8:1:2::10/128 via fe80::1 dev eth2 table 4000",
    "ip -6 route del fcbb:bb00:c101::/48 dev eth2",
    "ip -6 route del fcbb:bb00:4101::/48 via fe80::1 dev eth2",
    "ip -6 route del 2001:db8:0:2::10/128 via fe80::1 dev eth1 table 4001",
    "ip -6 route del 2001:db8:0:2::10/128 via fe80::1 dev eth1 table 4000",
    "ip -6 route del fcbb:bb00:c001::/48 dev eth1",
    "ip -6 route del fcbb:bb00:4001::/48 via fe80::1 dev eth1",
]


def test_the_plan_is_these_ip_lines() -> None:
    """Routes first (the plane's containers out of its NIC, its own micro-SID decapsulated, per
    spine a table routing the other host into the path's container), the rules that pick the
    tables last; removal the other way round."""
    topo = parse_real_fabric(copy.deepcopy(GOOD), "fabric file x")
    assert isinstance(topo, UsidTopology)
    steps = hostroutes.plan(topo, "gpu1")
    assert hostroutes.ip_lines(steps) == EXPECTED_GPU1
    assert hostroutes.ip_lines(steps, remove=True) == EXPECTED_GPU1_REMOVE


def test_dry_run_prints_the_plan_without_root(mrc_tools: MrcTools, tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    res = mrc_tools.run(
        "mrc-host-setup", "--fabric", str(path), "--host", "gpu1", "--dry-run", timeout=60
    )
    assert res.returncode == 0 and res.stderr == "", res.describe()
    assert res.stdout.splitlines() == EXPECTED_GPU1
    res = mrc_tools.run(
        "mrc-host-setup",
        *("--fabric", str(path), "--host", "gpu1", "--dry-run", "--remove", "--json"),
        timeout=60,
    )
    assert res.returncode == 0, res.describe()
    obj = res.json
    assert obj["commands"] == EXPECTED_GPU1_REMOVE
    assert (obj["fabric"], obj["host"], obj["action"], obj["dry_run"]) == (
        "lab",
        "gpu1",
        "remove",
        True,
    )


def test_the_set_up_takes_only_a_usid_file(mrc_tools: MrcTools, tmp_path: Path) -> None:
    srh = {
        "name": "lab",
        "planes": [{"plane": 0, "spines": [{"name": "s", "sid": "fc00::1"}]}],
        "hosts": [{"name": "a", "nics": [{"plane": 0, "address": "2001:db8::a"}]}],
    }
    path = write(tmp_path, srh)
    res = mrc_tools.run("mrc-host-setup", "--fabric", str(path), "--dry-run", timeout=60)
    assert res.returncode == 2 and res.stderr == (
        f'mrc-host-setup: error: fabric file {path}: not a uSID fabric (\'"srv6": "usid"\'): an '
        "SRH fabric's hosts need no set-up, and mrc-fabric sets up its own\n"
    ), res.describe()
    good = write(tmp_path, GOOD, "good.json")
    res = mrc_tools.run("mrc-host-setup", "--fabric", str(good), "--host", "gpu3", timeout=60)
    assert res.returncode == 2 and res.stderr == (
        "mrc-host-setup: error: --host gpu3: no such host in fabric 'lab' (gpu1, gpu2)\n"
    ), res.describe()


def test_the_documented_example_and_its_dry_run(tmp_path: Path) -> None:
    """docs/FABRIC.md's uSID example, read as a user would copy it, and the lines it shows
    ``--dry-run`` printing for it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "FABRIC.md").read_text()
    section = text.split("\n### Real uSID fabrics\n", 1)[1]
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "lab.json"
    path.write_text(example)
    topo = load_fabric(str(path))
    assert isinstance(topo, UsidTopology)
    assert [h.name for h in topo.hosts] == ["gpu1", "gpu2"]
    command = "```console\n$ mrc-host-setup --fabric lab.json --host gpu1 --dry-run\n"
    shown = section.split(command, 1)[1].split("```", 1)[0].splitlines()
    assert shown == hostroutes.ip_lines(hostroutes.plan(topo, "gpu1"))
