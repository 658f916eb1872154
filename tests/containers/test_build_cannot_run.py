"""docker/build.sh where the engine is there but cannot start a container (a chroot without a
cgroup mount, a runtime missing): one line and exit 3, "cannot run", so that the container
tests skip instead of failing. It exited 1 there before, with nothing said: the probe of the
base image's Python read no line and ``set -e`` ended the script."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_an_engine_that_cannot_start_a_container_is_cannot_run(
    mrc_image: str, tmp_path: Path
) -> None:
    """Real podman, told (containers.conf) to use ``false`` as its OCI runtime: its image
    commands work, ``podman run`` fails. The base is the session's mrc image, so it is here."""
    if shutil.which("podman") is None:
        pytest.skip("needs podman (the runtime is chosen by containers.conf)")
    conf = tmp_path / "containers.conf"
    false = shutil.which("false")
    assert false is not None
    conf.write_text(f'[engine]\nruntime = "mrcfalse"\n[engine.runtimes]\nmrcfalse = ["{false}"]\n')
    image = f"localhost/mrc:never{os.getpid()}"
    env = {**os.environ, "MRC_ENGINE": "podman", "MRC_BASE": mrc_image, "MRC_IMAGE": image}
    proc = subprocess.run(
        ["bash", str(ROOT / "docker" / "build.sh")],
        capture_output=True,
        text=True,
        env={**env, "CONTAINERS_CONF": str(conf)},
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last == f"[docker] cannot run: podman cannot run python3 in a container of {mrc_image} here"
    )
    assert proc.stdout == ""  # no image name: nothing was built
    gone = subprocess.run(["podman", "image", "exists", image], env=env, capture_output=True)
    assert gone.returncode == 1
