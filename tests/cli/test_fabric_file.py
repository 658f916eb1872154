"""``--fabric FILE`` with a real-fabric file written by hand (mrc/topology/realfile.py).

Every mistake a user can make in the file is one exact line from the command, exit status 2,
before anything touches the network; a good file becomes the paths spraying uses.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mrc.srv6.evroutes import fabric_routes
from mrc.srv6.srh import decode_srh
from mrc.topology.realfile import load_fabric, parse_real_fabric

if TYPE_CHECKING:
    from conftest import MrcTools, Result

GOOD: dict[str, Any] = {
    "name": "lab",
    "planes": [
        {
            "plane": 0,
            "spines": [
                {"name": "s0a", "sid": "fc00:0:a::1"},
                {"name": "s0b", "sid": "fc00:0:b::1"},
            ],
        },
        {"plane": 1, "spines": [{"name": "s1a", "sid": "fc00:1:a::1"}]},
    ],
    "hosts": [
        {
            "name": "alpha",
            "nics": [
                {"plane": 0, "address": "2001:db8:0::a"},
                {"plane": 1, "address": "2001:db8:1::a"},
            ],
        },
        {
            "name": "beta",
            "nics": [
                {"plane": 1, "address": "2001:db8:1:0::b"},
                {"plane": 0, "address": "2001:db8::b"},
            ],
        },
    ],
}


def edit(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    change(doc)
    return doc


def _set(path: tuple[Any, ...], value: object) -> Callable[[dict[str, Any]], object]:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


KNOWN_TOP = "(known: 'version', 'name', 'srv6', 'planes', 'hosts')"
UNICAST = "give a unicast address routed in the fabric"

# (id, file content: a JSON-able document or raw bytes, the error after "fabric file PATH: ")
BAD_FILES: list[tuple[str, object, str]] = [
    ("not-json", b'{"name": ', "not JSON: Expecting value at line 1 column 10"),
    ("not-utf8", b'{"name": "\xff"}', "not UTF-8 text"),
    ("duplicate-key", b'{"name": "a", "name": "b"}', "not JSON we accept: key 'name' given twice"),
    (
        "a-list",
        [1, 2],
        "neither a real-fabric description (an object with a list of 'planes' and 'hosts', "
        "docs/FABRIC.md) nor an mrc-fabric topology",
    ),
    (
        "planes-a-count",
        edit(_set(("planes",), 2)),
        "neither a real-fabric description (an object with a list of 'planes' and 'hosts', "
        "docs/FABRIC.md) nor an mrc-fabric topology",
    ),
    (
        "bad-topology",
        {"version": 1, "name": "x", "routers": [], "links": []},
        "malformed mrc-fabric topology: 'hosts'",
    ),
    (
        "unknown-top-key",
        edit(_set(("spines",), [])),
        f"top level: unknown key 'spines' {KNOWN_TOP}",
    ),
    ("no-hosts", edit(lambda d: d.pop("hosts")), "top level: missing key 'hosts'"),
    ("version-2", edit(_set(("version",), 2)), "version: 2: this mrc reads version 1"),
    (  # a uSID fabric says more (tests/cli/test_usid_fabric_file.py)
        "usid-routers",
        edit(_set(("srv6",), "usid")),
        "top level: missing key 'usid'",
    ),
    (
        "bad-name",
        edit(_set(("name",), "my lab")),
        "name: 'my lab': use 1-64 letters, digits, '_', '.' or '-'",
    ),
    ("name-number", edit(_set(("name",), 7)), "name: must be a string, not a number"),
    ("no-planes", edit(_set(("planes",), [])), "planes: must not be empty"),
    (
        "plane-an-object",
        edit(_set(("planes", 1), [])),
        "planes[1]: must be an object, not a list",
    ),
    (
        "plane-string",
        edit(_set(("planes", 0, "plane"), "0")),
        "planes[0].plane: must be an integer, not a string",
    ),
    (
        "plane-bool",
        edit(_set(("planes", 0, "plane"), True)),
        "planes[0].plane: must be an integer, not true/false",
    ),
    (
        "plane-negative",
        edit(_set(("planes", 1, "plane"), -1)),
        "planes[1].plane: must be 0 or more, not -1",
    ),
    (
        "plane-twice",
        edit(_set(("planes", 1, "plane"), 0)),
        "planes[1].plane: plane 0 is described twice",
    ),
    (
        "plane-gap",
        edit(_set(("planes", 1, "plane"), 2)),
        "planes: plane numbers must be 0..1; plane 1 is missing",
    ),
    ("no-spines", edit(_set(("planes", 1, "spines"), [])), "planes[1].spines: must not be empty"),
    (
        "spine-unknown-key",
        edit(_set(("planes", 0, "spines", 1, "address"), "fc00::1")),
        "planes[0].spines[1]: unknown key 'address' (known: 'name', 'sid')",
    ),
    (
        "spine-no-sid",
        edit(lambda d: d["planes"][0]["spines"][0].pop("sid")),
        "planes[0].spines[0]: missing key 'sid'",
    ),
    (
        "sid-not-ipv6",
        edit(_set(("planes", 0, "spines", 1, "sid"), "fc00::zz")),
        "planes[0].spines[1].sid: 'fc00::zz' is not an IPv6 address",
    ),
    (
        "sid-ipv4",
        edit(_set(("planes", 0, "spines", 1, "sid"), "10.0.0.1")),
        "planes[0].spines[1].sid: '10.0.0.1' is not an IPv6 address",
    ),
    (
        "sid-link-local",
        edit(_set(("planes", 1, "spines", 0, "sid"), "fe80::1")),
        f"planes[1].spines[0].sid: fe80::1 is a link-local address; {UNICAST}",
    ),
    (
        "sid-multicast",
        edit(_set(("planes", 1, "spines", 0, "sid"), "ff02::1")),
        f"planes[1].spines[0].sid: ff02::1 is a multicast address; {UNICAST}",
    ),
    (
        "sid-null",
        edit(_set(("planes", 1, "spines", 0, "sid"), None)),
        "planes[1].spines[0].sid: must be a string (an IPv6 address), not null",
    ),
    (
        "address-scope",
        edit(_set(("hosts", 0, "nics", 0, "address"), "2001:db8::a%eth0")),
        "hosts[0].nics[0].address: '2001:db8::a%eth0' has a scope; give an address routed "
        "in the fabric",
    ),
    (
        "address-unspecified",
        edit(_set(("hosts", 0, "nics", 0, "address"), "::")),
        f"hosts[0].nics[0].address: :: is the unspecified address; {UNICAST}",
    ),
    (
        "spine-name-twice",
        edit(_set(("planes", 1, "spines", 0, "name"), "s0a")),
        "planes[1].spines[0].name: name s0a is already planes[0].spines[0].name",
    ),
    (
        "host-named-like-a-spine",
        edit(_set(("hosts", 1, "name"), "s1a")),
        "hosts[1].name: name s1a is already planes[1].spines[0].name",
    ),
    (
        "sid-twice",
        edit(_set(("planes", 1, "spines", 0, "sid"), "FC00:0:A:0::1")),
        "planes[1].spines[0].sid: address fc00:0:a::1 is already planes[0].spines[0].sid",
    ),
    (
        "host-address-is-a-sid",
        edit(_set(("hosts", 1, "nics", 0, "address"), "fc00:1:a::1")),
        "hosts[1].nics[0].address: address fc00:1:a::1 is already planes[1].spines[0].sid",
    ),
    (
        "address-twice",
        edit(_set(("hosts", 1, "nics", 1, "address"), "2001:db8::a")),
        "hosts[1].nics[1].address: address 2001:db8::a is already hosts[0].nics[0].address",
    ),
    ("hosts-object", edit(_set(("hosts",), {})), "hosts: must be a list, not an object"),
    ("no-hosts-listed", edit(_set(("hosts",), [])), "hosts: must not be empty"),
    (
        "nic-unknown-key",
        edit(_set(("hosts", 0, "nics", 1, "addr"), "2001:db8::1")),
        "hosts[0].nics[1]: unknown key 'addr' (known: 'plane', 'address')",
    ),
    (
        "nic-missing-plane",
        edit(lambda d: d["hosts"][1]["nics"].pop()),
        "hosts[1].nics: host beta has no NIC in plane 0",
    ),
    (
        "nic-plane-twice",
        edit(_set(("hosts", 0, "nics", 1, "plane"), 0)),
        "hosts[0].nics[1].plane: host alpha has two NICs in plane 0",
    ),
    (
        "nic-unknown-plane",
        edit(_set(("hosts", 0, "nics", 1, "plane"), 5)),
        "hosts[0].nics[1].plane: no plane 5 (planes are 0..1)",
    ),
    ("no-nics", edit(_set(("hosts", 0, "nics"), [])), "hosts[0].nics: must not be empty"),
]


def write(path: Path, content: object) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(json.dumps(content, indent=2))
    return path


def one_error(res: Result, tool: str) -> str:
    assert "Traceback" not in res.stderr, res.describe()
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and res.stdout == "", res.describe()
    assert res.returncode == 2, res.describe()
    prefix = f"{tool}: error: "
    assert lines[0].startswith(prefix), res.describe()
    return lines[0][len(prefix) :]


@pytest.mark.parametrize(
    ("content", "error"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_a_bad_file_is_one_exact_line(
    mrc_tools: MrcTools, tmp_path: Path, content: object, error: str
) -> None:
    path = write(tmp_path / "lab.json", content)
    res = mrc_tools.run(
        "mrc-send", "--size", "1K", "--to", "::1", "--fabric", str(path), timeout=20
    )
    assert one_error(res, "mrc-send") == f"fabric file {path}: {error}"


def test_mrc_recv_reads_the_same_way(mrc_tools: MrcTools, tmp_path: Path) -> None:
    path = write(tmp_path / "lab.json", edit(_set(("hosts", 0, "nics", 0, "address"), "::")))
    res = mrc_tools.run("mrc-recv", "--discard", "--fabric", str(path), timeout=20)
    assert one_error(res, "mrc-recv") == (
        f"fabric file {path}: hosts[0].nics[0].address: :: is the unspecified address; {UNICAST}"
    )


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo.json")
    return tmp_path / "fifo.json"


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    return tmp_path / "a.json"


def _dangling(tmp_path: Path) -> Path:
    (tmp_path / "gone.json").symlink_to(tmp_path / "nothing-here.json")
    return tmp_path / "gone.json"


def _directory(tmp_path: Path) -> Path:
    (tmp_path / "dir.json").mkdir()
    return tmp_path / "dir.json"


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (_fifo, "not a regular file"),  # never blocks waiting for a writer
        (_loop, "cannot open: Too many levels of symbolic links"),
        (_dangling, "cannot open: No such file or directory"),
        (_directory, "not a regular file"),
    ],
    ids=["fifo", "symlink-loop", "dangling-symlink", "directory"],
)
def test_odd_files_are_one_line_too(
    mrc_tools: MrcTools, tmp_path: Path, make: Callable[[Path], Path], error: str
) -> None:
    path = make(tmp_path)
    res = mrc_tools.run(
        "mrc-send", "--size", "1K", "--to", "::1", "--fabric", str(path), timeout=20
    )
    assert one_error(res, "mrc-send") == f"fabric file {path}: {error}"


def test_a_symlink_to_a_good_file_is_read(tmp_path: Path) -> None:
    write(tmp_path / "real.json", GOOD)
    (tmp_path / "lab.json").symlink_to(tmp_path / "real.json")
    assert load_fabric(str(tmp_path / "lab.json")).name == "lab"


def test_a_good_file_gives_one_srv6_path_per_spine(tmp_path: Path) -> None:
    topo = load_fabric(str(write(tmp_path / "lab.json", GOOD)))
    assert (topo.name, topo.planes) == ("lab", 2)
    assert [h.name for h in topo.hosts] == ["alpha", "beta"]
    # NICs ordered by plane, addresses canonical
    assert [n.address for n in topo.host("beta").nics] == ["2001:db8::b", "2001:db8:1::b"]
    assert [(r.name, r.plane, r.sid) for r in topo.routers] == [
        ("s0a", 0, "fc00:0:a::1"),
        ("s0b", 0, "fc00:0:b::1"),
        ("s1a", 1, "fc00:1:a::1"),
    ]
    routes = fabric_routes(
        topo, [("2001:db8::a", "2001:db8::b"), ("2001:db8:1::a", "2001:db8:1::b")]
    )
    got = [
        [(r.label, list(decode_srh(r.srh).segments)) for r in plane if r.srh is not None]
        for plane in routes
    ]
    assert got == [
        [("s0a", ["fc00:0:a::1", "2001:db8::b"]), ("s0b", ["fc00:0:b::1", "2001:db8::b"])],
        [("s1a", ["fc00:1:a::1", "2001:db8:1::b"])],
    ]


def test_a_file_of_the_other_format_is_read_too(tmp_path: Path) -> None:
    """An mrc-fabric topology file given as --fabric FILE (detected by its content)."""
    from mrc.lab.fabric import FabricSpec, plan

    planned = plan(FabricSpec(name="other", planes=2, hosts=2, leaves=1, spines=1))
    path = tmp_path / "other"
    path.mkdir()
    planned.save(path / "topo.json")
    assert load_fabric(str(path / "topo.json")) == planned


def test_the_local_host_must_be_named_among_the_files_hosts(
    mrc_tools: MrcTools, tmp_path: Path
) -> None:
    path = write(tmp_path / "lab.json", GOOD)
    res = mrc_tools.run(
        "mrc-send", "--size", "1K", "--to", "beta", "--fabric", str(path), "--fabric-host", "gamma"
    )
    assert one_error(res, "mrc-send") == "--fabric-host gamma: no such host in 'lab' (alpha, beta)"
    res = mrc_tools.run("mrc-recv", "--discard", "--fabric-host", "alpha")
    assert one_error(res, "mrc-recv") == "--fabric-host needs --fabric"


def test_a_host_whose_addresses_are_not_here_is_refused(
    mrc_tools: MrcTools, tmp_path: Path
) -> None:
    """Exit 1: the file is fine, this machine is not that host (none of 2001:db8:: is local)."""
    path = write(tmp_path / "lab.json", GOOD)
    res = mrc_tools.run("mrc-send", "--size", "1K", "--to", "beta", "--fabric", str(path))
    assert res.returncode == 1 and res.stderr.splitlines() == [
        "mrc-send: error: this process is not on a host of fabric 'lab': no host's plane-0 "
        "address is local here (run it on one, or give the addresses with --from / --listen)"
    ], res.describe()
    res = mrc_tools.run(
        "mrc-send", "--size", "1K", "--to", "beta", "--fabric", str(path), "--fabric-host", "alpha"
    )
    assert res.returncode == 1 and res.stderr.splitlines() == [
        "mrc-send: error: fabric 'lab': host alpha's plane-0 address 2001:db8::a is not an "
        "address of this machine"
    ], res.describe()


def test_the_documented_example_is_a_good_file(tmp_path: Path) -> None:
    """docs/FABRIC.md's example, read as a user would copy it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "FABRIC.md").read_text()
    section = text.split("\n## Real networks\n", 1)[1]
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    topo = load_fabric(str(write(tmp_path / "lab.json", example.encode())))
    assert [h.name for h in topo.hosts] == ["gpu1", "gpu2"]
    assert [r.name for r in topo.routers] == ["red-s1", "red-s2", "blue-s1", "blue-s2"]
    assert topo.host("gpu2").nic(1).address == "2001:db8:1:2::10"


def test_a_file_may_say_its_routers_take_srhs() -> None:
    """``"srv6": "srh"`` is what a file without the key means: SRH routes, one per spine."""
    said = parse_real_fabric(edit(_set(("srv6",), "srh")), "fabric file x")
    assert said == parse_real_fabric(copy.deepcopy(GOOD), "fabric file x")
    assert said.srv6 == "srh"
