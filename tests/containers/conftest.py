"""The mrc image, built once per test session from this tree by docker/build.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PODMAN_CONF = ROOT / "docker" / "podman.conf"


@pytest.fixture(scope="session")
def mrc_image() -> Iterator[str]:
    """Name of an image with this tree's mrc installed; skips when no engine can run here."""
    if os.geteuid() != 0:
        pytest.skip("containers are built as root")
    env = {k: v for k, v in os.environ.items() if k != "CONTAINERS_CONF"}
    proc = subprocess.run(
        ["bash", str(ROOT / "docker" / "build.sh")],
        capture_output=True,
        text=True,
        env={**env, "MRC_IMAGE": f"localhost/mrc:test{os.getpid()}"},
        timeout=900,
    )
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    image = proc.stdout.strip().splitlines()[-1]
    # what docker/engine.sh chose for podman, for the engine calls of the tests themselves
    saved = os.environ.get("CONTAINERS_CONF")
    if saved is None and shutil.which("podman") and shutil.which("runc"):
        os.environ["CONTAINERS_CONF"] = str(PODMAN_CONF)
    try:
        yield image
    finally:
        for engine in ("podman", "docker"):
            if shutil.which(engine):
                subprocess.run([engine, "rmi", "--force", image], capture_output=True)
        if saved is None:
            os.environ.pop("CONTAINERS_CONF", None)
