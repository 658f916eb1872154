"""mrc-keygen: a key file both ends can read, and one-line refusals."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from mrc.security.keys import fingerprint, read_key_file


def _keygen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrc.cli.keygen", *args], capture_output=True, text=True, timeout=60
    )


def test_keygen_writes_a_private_key(tmp_path: Path) -> None:
    path = tmp_path / "mrc.key"
    res = _keygen(str(path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["fingerprint"] == fingerprint(read_key_file(str(path)))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_keygen_refuses_to_replace_or_follow(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "link").symlink_to(victim)
    for target in (victim, tmp_path / "link", tmp_path / "no" / "dir"):
        res = _keygen(str(target))
        assert res.returncode == 2
        assert res.stderr.startswith("mrc-keygen: error: ") and res.stderr.count("\n") == 1
    assert victim.read_text() == "keep me"
