"""What the commands and tools print with --json matches docs/schemas/, key for key.

The schemas forbid keys they do not list, so a key added to, renamed in or dropped from a tool's
output without its schema fails here: machines reading the output can trust the documents.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

from mrc.lab.fabric import Fabric
from mrc.lab.fabric.netns import remove as remove_netns
from mrc.lab.fabric.trim import unavailable_reason
from mrc.lab.testbed import leftover_namespaces, netns_available

if TYPE_CHECKING:
    from conftest import MrcTools

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _schema(tool: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{tool}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_a_transfer_matches_both_schemas(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json")
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run("mrc-send", "--size", "2M", "--to", f"[::1]:{mrc_port}", "--json")
    assert sent.returncode == 0, sent.describe()
    got = recv.wait()
    assert got.returncode == 0, got.describe()
    jsonschema.validate(sent.json, _schema("mrc-send"))
    jsonschema.validate(got.json, _schema("mrc-recv"))


def test_the_schemas_reject_what_they_do_not_describe() -> None:
    send = _schema("mrc-send")
    result = {**send["$defs"]["result"], "$defs": send["$defs"]}
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({"version": "0", "ok": True, "surprise": 1}, result)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": "0", "ok": True, "surprise": 1}, send)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": "0", "ok": "yes"}, _schema("mrc-recv"))


@pytest.mark.parametrize("tool", ["mrc-send", "mrc-recv"])
def test_the_schemas_take_a_failure_object_and_nothing_like_it(tool: str) -> None:
    """--json on a failed run prints {version, ok: false, role, error}
    (mrc.cli.common.failure_object); nothing more, nothing less, never ok."""
    from mrc.cli.common import failure_object, versioned

    schema = _schema(tool)
    role = tool.removeprefix("mrc-")
    good = versioned(failure_object(role, "connection refused by [::1]:4791"))
    jsonschema.validate(good, schema)
    for bad in (
        {**good, "ok": True},
        {**good, "role": "recv" if role == "send" else "send"},
        {**good, "error": None},
        {**good, "bytes": 0},
        {k: v for k, v in good.items() if k != "error"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_a_failed_run_matches_both_schemas(mrc_tools: MrcTools, mrc_port: int) -> None:
    """Nobody listening: the sender is refused, the receiver times out; both answer --json."""
    sent = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}", "--json")
    got = mrc_tools.run(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--timeout", "0.2", "--json"
    )
    assert sent.returncode == 1 and got.returncode == 1, sent.describe() + got.describe()
    jsonschema.validate(sent.json, _schema("mrc-send"))
    jsonschema.validate(got.json, _schema("mrc-recv"))
    assert sent.json["ok"] is False and "refused" in str(sent.json["error"])
    assert got.json["error"] == "no sender connected within 0.2 s"


# --- the other commands and tools ------------------------------------------------------------

REPO = SCHEMAS.parents[1]
# schema -> the test that checks real output against it (every file in docs/schemas/ is here)
COVERED = {
    "mrc-send": "test_a_transfer_matches_both_schemas",
    "mrc-recv": "test_a_transfer_matches_both_schemas",
    "mrc-keygen": "test_keygen_matches_its_schema",
    "profile_core": "test_profile_core_matches_its_schema",
    "mrc-fabric-list": "test_fabric_list_matches_its_schema",
    "mrc-fabric-topology": "test_fabric_outputs_match_their_schemas",
    "mrc-fabric-status": "test_fabric_outputs_match_their_schemas",
    "mrc-fabric-paths": "test_fabric_outputs_match_their_schemas",
    "mrc-bench": "tests/bench/test_bench_quick.py",
    "mrc-real-fabric": "test_real_fabric_files_match_their_schema",
    "mrc-host-setup": "test_host_setup_matches_its_schema",
    "failover_demo": "tests/containers/test_failover_demo_containers.py",
    "bench_qp": "test_bench_qp_matches_its_schema",
    "bench_fabric": "test_bench_fabric_matches_its_schema",
    "trim_bench": "test_trim_bench_matches_its_schema",
}


def test_every_schema_is_checked_against_real_output() -> None:
    found = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
    assert found == sorted(COVERED)
    for name in found:
        _schema(name)  # each is a valid 2020-12 schema
    for name, test in COVERED.items():  # and the test named for it exists
        assert (REPO / test).is_file() if "/" in test else callable(globals().get(test)), name


def test_keygen_matches_its_schema(mrc_tools: MrcTools, tmp_path: Path) -> None:
    res = mrc_tools.run("mrc-keygen", str(tmp_path / "k"), "--json", timeout=30)
    assert res.returncode == 0, res.describe()
    jsonschema.validate(res.json, _schema("mrc-keygen"))


def test_profile_core_matches_its_schema() -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "tools" / "profile_core.py"), "--size", "128K", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    jsonschema.validate(json.loads(res.stdout), _schema("profile_core"))


def _fabric(*args: str, parse: bool = True) -> Any:
    """mrc-fabric's JSON (indented over many lines, which mrc_tools does not parse)."""
    res = subprocess.run(
        [sys.executable, "-m", "mrc", "fabric", *args], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, (args, res.stderr)
    return json.loads(res.stdout) if parse else res.stdout


def test_fabric_list_matches_its_schema() -> None:
    jsonschema.validate(_fabric("list", "--json"), _schema("mrc-fabric-list"))


def test_fabric_outputs_match_their_schemas() -> None:
    """up, status, paths and list on a real (tiny) fabric; with trimming when clang is here, so
    status carries its trim counters too."""
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    name = f"t{os.getpid()}j0"  # the fabric tests' naming: a crashed run's fabric is swept
    trim = ["--rate", "50mbit", "--trim"] if shutil.which("clang") else []
    up = ["up", "--name", name, "--planes", "2", "--spines", "2", "--leaves", "1", "--hosts", "2"]
    try:
        topo = _fabric(*up, *trim, "--json")
        jsonschema.validate(topo, _schema("mrc-fabric-topology"))
        assert topo["name"] == name and len(topo["hosts"]) == 2
        status = _fabric("status", "--name", name, "--json")
        jsonschema.validate(status, _schema("mrc-fabric-status"))
        assert len(status["links"]) == len(topo["links"]) and status["trim"] == bool(trim)
        if trim:
            assert set(status["trim_routers"]) == {r["name"] for r in topo["routers"]}
        paths = _fabric("paths", "--name", name, "h0", "h1", "--json")
        jsonschema.validate(paths, _schema("mrc-fabric-paths"))
        assert [p["spine"] for p in paths["paths"]] == ["p0s0", "p0s1", None, "p1s0", "p1s1", None]
        listed = _fabric("list", "--json")
        jsonschema.validate(listed, _schema("mrc-fabric-list"))
        assert listed["fabrics"][name]["namespaces"] == 2 + 2 * 3
    finally:
        assert "removed 8 namespaces" in _fabric("down", "--name", name, parse=False)


def test_real_fabric_files_match_their_schema() -> None:
    """The hand-written file's schema takes the tests' good file and the documented example,
    and refuses what the loader refuses that a schema can see."""
    from cli.test_fabric_file import BAD_FILES, GOOD

    schema = _schema("mrc-real-fabric")
    jsonschema.validate(GOOD, schema)
    text = (REPO / "docs" / "FABRIC.md").read_text().split("\n## Real networks\n", 1)[1]
    jsonschema.validate(json.loads(text.split("```json\n", 1)[1].split("```", 1)[0]), schema)
    refused = {"unknown-top-key", "no-hosts", "no-planes", "no-spines", "spine-unknown-key"}
    refused |= {"nic-unknown-key", "hosts-object", "no-hosts-listed", "bad-name", "version-2"}
    bad = {case: doc for case, doc, _err in BAD_FILES}
    for case in sorted(refused):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad[case], schema)


def test_host_setup_matches_its_schema(mrc_tools: MrcTools, tmp_path: Path) -> None:
    """--dry-run (any user may) and --remove with it print the result object; a file it
    refuses prints the failure object; each validates, and the commands are the plan's."""
    from cli.test_usid_fabric_file import GOOD
    from mrc.srv6 import hostroutes
    from mrc.topology.realfile import UsidTopology, parse_real_fabric

    schema = _schema("mrc-host-setup")
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(GOOD))
    topo = parse_real_fabric(GOOD)
    assert isinstance(topo, UsidTopology)
    plan = hostroutes.plan(topo, "gpu1")
    for extra, action in (([], "setup"), (["--remove"], "remove")):
        res = mrc_tools.run(
            "mrc-host-setup", "--fabric", str(path), "--host", "gpu1", "--dry-run", "--json",
            *extra, timeout=30,
        )  # fmt: skip
        assert res.returncode == 0, res.describe()
        jsonschema.validate(res.json, schema)
        assert res.json["action"] == action and res.json["dry_run"] is True
        assert res.json["commands"] == hostroutes.ip_lines(plan, remove=action == "remove")
    path.write_text("{}")
    res = mrc_tools.run("mrc-host-setup", "--fabric", str(path), "--dry-run", "--json")
    assert res.returncode == 2, res.describe()
    jsonschema.validate(res.json, schema)
    assert res.json["ok"] is False and res.json["role"] == "host-setup"
    assert res.stderr == f"mrc-host-setup: error: {res.json['error']}\n", res.describe()


def test_real_usid_fabric_files_match_their_schema() -> None:
    """The uSID form of the same schema: the tests' good file and FABRIC.md's example pass;
    what the loader refuses that a schema can see is refused; and each object's keys are the
    loader's own (mrc.topology.realfile), so the two cannot drift apart."""
    from cli.test_usid_fabric_file import BAD, GOOD
    from mrc.topology import realfile as rf

    schema = _schema("mrc-real-fabric")
    jsonschema.validate(GOOD, schema)
    text = (REPO / "docs" / "FABRIC.md").read_text().split("\n### Real uSID fabrics\n", 1)[1]
    jsonschema.validate(json.loads(text.split("```json\n", 1)[1].split("```", 1)[0]), schema)
    refused = {"srv6-unknown", "usid-unknown-key", "block-a-number", "block-a-48", "no-usid"}
    refused |= {"mtu-a-string", "mtu-small", "mtu-bool", "table-main", "ports-a-number"}
    refused |= {"ports-garbage", "plane-empty-leaves", "spine-with-a-sid", "spine-no-usid"}
    refused |= {"usid-five-digits", "usid-zero", "usid-not-hex", "usid-a-number", "priority-0"}
    refused |= {"nic-unknown-key", "nic-leaf-a-number", "nic-dev-with-a-space", "nic-no-dev"}
    refused |= {"nic-dev-too-long", "nic-dev-null", "plane-no-leaves", "nic-no-gateway"}
    refused |= {"nic-no-leaf", "nic-no-usid", "usid-a-list", "no-block", "no-mtu"}
    bad = {case: doc for case, doc, _err in BAD}
    assert refused <= set(bad), sorted(refused - set(bad))
    for case in sorted(refused):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad[case], schema)
    defs: dict[str, Any] = schema["$defs"]

    def keys(obj: dict[str, Any]) -> dict[str, bool]:
        return {k: k in obj["required"] for k in obj["properties"]}

    assert keys(schema) == {**rf._USID_TOP_KEYS, "usid": False}  # required in "then"
    assert schema["then"]["required"] == ["usid"]
    assert keys(defs["usid_params"]) == rf._USID_KEYS
    assert keys(defs["usid_plane"]) == rf._USID_PLANE_KEYS
    assert keys(defs["usid_router"]) == rf._USID_ROUTER_KEYS
    assert keys(defs["usid_nic"]) == rf._USID_NIC_KEYS
    assert keys(defs["srh_plane"]) == rf._PLANE_KEYS
    assert keys(defs["srh_spine"]) == rf._SPINE_KEYS
    assert keys(defs["srh_nic"]) == rf._NIC_KEYS
    assert keys(defs["srh_host"]) == keys(defs["usid_host"]) == rf._HOST_KEYS


# --- the benchmarks, each in its quickest mode -----------------------------------------------


def _needs_netns() -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)


def _run_tool(argv: list[str], timeout: float, left_by: Callable[[int], list[str]]) -> Any:
    """Run a benchmark and return its JSON. ``left_by(pid)`` removes and returns what the run
    left behind (there must be nothing). A run past ``timeout`` gets SIGTERM, on which bench_qp
    and bench_fabric take their namespaces down, and fails."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            pytest.fail(f"{argv[1:3]} did not finish within {timeout} s")
    finally:
        left = left_by(proc.pid)
    assert proc.returncode == 0, (argv, err)
    assert left == [], f"{argv[1:3]} left behind {left}"
    return json.loads(out)


def _namespaces_of_bench_qp(pid: int) -> list[str]:
    left = leftover_namespaces(f"bq{pid}")
    for ns in left:
        remove_netns(ns)
    return left


@pytest.mark.netns
def test_bench_qp_matches_its_schema() -> None:
    """--quick: one 32 MiB MRC transfer and the three references, one run each (< 20 s)."""
    _needs_netns()
    tool = [sys.executable, str(REPO / "tools" / "bench_qp.py"), "--quick", "--json"]
    out = _run_tool(tool, 120, _namespaces_of_bench_qp)
    jsonschema.validate(out, _schema("bench_qp"))
    (row,) = out["results"]
    assert out["config"]["quick"] and row["mrc"]["all_ok"], row["mrc"]["errors"]
    assert [r["bytes"] for r in row["mrc"]["runs"]] == [32 << 20]
    assert {k for k in row if k.startswith("mrc_vs_")} == {"mrc_vs_raw", "mrc_vs_gso", "mrc_vs_tcp"}
    # kernel TCP's CPU per GiB on each side, and MRC's against it (issue 38's CPU aim)
    tcp = row["tcp"]
    (tcp_run,) = tcp["runs"]
    for side in ("send", "recv"):
        assert tcp_run[f"{side}_cpu_s_per_gib"] > 0
        assert tcp[f"{side}_cpu_s_per_gib_median"] == tcp_run[f"{side}_cpu_s_per_gib"]
    assert tcp_run["bytes"] > 0 and tcp_run["send_bytes"] >= tcp_run["bytes"]
    assert row["mrc_cpu_vs_tcp"] > 0


@pytest.mark.netns
def test_bench_fabric_matches_its_schema() -> None:
    """--quick (16 MiB, one run) on the smallest fabric it builds, 2 planes of 1 spine; with
    TCP, MPTCP and a TCP connection per plane, so their objects are checked too."""
    _needs_netns()
    name = f"t{os.getpid()}j1"  # the fabric tests' naming: a crashed run's fabric is swept
    tool = [sys.executable, str(REPO / "tools" / "bench_fabric.py"), "--quick", "--json"]
    tool += ["--quiet", "--planes", "2", "--spines", "1", "--name", name]
    out = _run_tool(tool, 120, lambda _pid: Fabric.down(name))
    jsonschema.validate(out, _schema("bench_fabric"))
    (row,) = out["mrc"]
    (run,) = row["runs"]
    assert run["packets_per_route"].keys() == {"p0s0", "p1s0"}  # both planes carried data
    assert out["tcp"] is not None and len(out["tcp"]["runs"]) == 1
    (mptcp,) = out["mptcp"]["runs"]
    assert mptcp["subflows"] == 1  # plane 1 joined: the baseline really is multipath
    (planes,) = out["tcp_planes"]["runs"]
    # a connection per plane, each held to its plane's shaped rate: together more than one
    # link's rate only if both planes carried one
    assert len(planes["flows"]) == 2
    assert sum(planes["flows"]) > 1.2 * out["fabric"]["rate_bps"]


@pytest.mark.netns
@pytest.mark.parametrize("trim", [True, False], ids=["trim", "no-trim"])
def test_trim_bench_matches_its_schema(trim: bool) -> None:
    """The trimming benchmark for 0.2 s (it has no --quick), with trimming and without: three
    senders into one 50 Mbit/s port, so the routers trim, or drop."""
    _needs_netns()
    why = unavailable_reason() if trim else None
    if why is not None:
        pytest.skip(f"trimming unavailable: {why}")
    tool = [sys.executable, "-m", "mrc.lab.bench.trim", "--seconds", "0.2"]
    tool += [] if trim else ["--no-trim"]
    out = _run_tool(tool, 90, lambda pid: Fabric.down(f"tb{pid}"))  # its fabric is tb<pid>
    jsonschema.validate(out, _schema("trim_bench"))
    assert out["trim"] is trim and out["whole"] + out["trimmed"] == out["arrived"]
    if trim:
        assert out["trimmed"] > 0 and out["trims_per_s"] > 0
    else:
        assert out["trimmed"] == 0 and out["router_tbf_drops"] > 0
