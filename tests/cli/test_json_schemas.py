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
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mrc.testbed import netns_available

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _schema(tool: str) -> dict[str, object]:
    schema = json.loads((SCHEMAS / f"{tool}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_a_transfer_matches_both_schemas(mrc_tools, mrc_port: int) -> None:
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
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({"version": "0", "ok": True, "surprise": 1}, send)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": "0", "ok": "yes"}, _schema("mrc-recv"))


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
    "failover_demo": "tests/containers/test_failover_demo_containers.py",
}


def test_every_schema_is_checked_against_real_output() -> None:
    found = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
    assert found == sorted(COVERED)
    for name in found:
        _schema(name)  # each is a valid 2020-12 schema


def test_keygen_matches_its_schema(mrc_tools, tmp_path: Path) -> None:
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
    from test_fabric_file import BAD_FILES, GOOD

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
