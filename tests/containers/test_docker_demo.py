"""docker/demo.sh: a verified two-plane transfer between two real containers.

It builds the image from this tree (no registry needed: a Debian base image is made with
debootstrap when none can be pulled) and runs docker/compose.yaml with Docker or Podman. The test
skips, with demo.sh's reason, only when no container engine can run here (exit 3).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SIZE = 16 << 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="containers are built as root")


def _engine_lists(engine: str, what: str, project: str) -> list[str]:
    args = [engine, what, "ls"] if what == "network" else [engine, "ps", "-a"]
    out = subprocess.run(
        [*args, "--format", "{{.Name}}" if what == "network" else "{{.Names}}"],
        capture_output=True,
        text=True,
        env={**os.environ, "CONTAINERS_CONF": str(ROOT / "docker" / "podman.conf")},
    )
    return [name for name in out.stdout.split() if project in name]


def test_demo_prints_a_verified_two_plane_transfer() -> None:
    project = "mrctest" + secrets.token_hex(3)
    env = {**os.environ, "MRC_SIZE": str(SIZE), "MRC_PROJECT": project}
    env.pop("CONTAINERS_CONF", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "docker" / "demo.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    schema = json.loads((ROOT / "docs" / "schemas" / "mrc-send.schema.json").read_text())
    jsonschema.validate(result, schema)
    assert result["ok"] is True
    assert result["bytes"] == SIZE
    assert result["digest"] == result["digest_receiver"]
    assert result["planes"] == 2
    assert {ev["plane"] for ev in result["evs"] if ev["packets"] > 0} == {0, 1}
    assert "verified" in proc.stderr
    engine = "docker" if "(docker," in proc.stderr else "podman"
    assert _engine_lists(engine, "container", project) == []
    assert _engine_lists(engine, "network", project) == []
