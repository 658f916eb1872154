"""The directory a fabric's host containers share with the host (``share-<name>``).

``down`` must remove it by the fabric's name alone, with whatever the containers left in it,
when there is no topology file (after a crash), and never follow a symlink in its place.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mrc.lab.fabric import containers, teardown
from mrc.topology.model import topology_path


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MRC_FABRIC_DIR", str(tmp_path))
    return tmp_path


def test_share_dir_is_world_writable_sticky_and_down_removes_it(run_dir: Path) -> None:
    name = f"shr{os.getpid()}"
    share = containers.make_share(name)
    assert share == containers.share_dir(name) == run_dir / f"share-{name}"
    assert stat.S_IMODE(share.stat().st_mode) == 0o1777
    (share / "results").mkdir()
    (share / "results" / "recv.json").write_text("{}")
    assert containers.make_share(name) == share  # idempotent: keeps what is there
    assert (share / "results" / "recv.json").exists()
    assert not topology_path(name).exists()

    teardown.down(name)
    assert not share.exists()
    assert teardown.down(name) == []  # again: nothing to do, no error


def test_down_does_not_follow_a_symlink_in_place_of_the_share_dir(run_dir: Path) -> None:
    name = f"shl{os.getpid()}"
    victim = run_dir / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    containers.share_dir(name).symlink_to(victim)
    assert containers.remove_share(name) is False
    teardown.down(name)
    assert (victim / "keep").read_text() == "x"
