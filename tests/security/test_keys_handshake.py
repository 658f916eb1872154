"""Key files and the mutual-authentication handshake."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mrc.security import handshake as hs
from mrc.security.keys import KeyFileError, fingerprint, read_key_file, write_key_file


def test_key_file_round_trip_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "k"
    key = write_key_file(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_key_file(str(path)) == key and len(key) == 32
    assert len(fingerprint(key)) == 16 and fingerprint(key) != fingerprint(bytes(32))


def test_key_file_never_replaces_or_follows_links(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    with pytest.raises(KeyFileError, match="exists"):
        write_key_file(str(victim))
    link = tmp_path / "link"
    link.symlink_to(victim)
    with pytest.raises(KeyFileError):
        write_key_file(str(link))
    assert victim.read_text() == "precious"
    key_path = tmp_path / "k"
    write_key_file(str(key_path))
    link2 = tmp_path / "link2"
    link2.symlink_to(key_path)
    with pytest.raises(KeyFileError, match="symbolic link"):
        read_key_file(str(link2))


def test_a_fifo_key_file_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until someone writes: mrc-recv hung at start. The
    refusal comes from a child process, so a regression fails the test instead of hanging it."""
    fifo = tmp_path / "key"
    os.mkfifo(fifo, 0o600)
    code = "import sys; from mrc.security.keys import read_key_file; read_key_file(sys.argv[1])"
    try:
        res = subprocess.run(
            [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a FIFO as a key file blocked")
    assert res.returncode == 1 and "is not a regular file" in res.stderr, res.stderr


@pytest.mark.parametrize(
    "content, mode, message",
    [
        (b"mrc-key-v1 AAAA\n", 0o600, "has 3 bytes"),
        (b"hello world\n", 0o600, "not an mrc key file"),
        (b"mrc-key-v1 !!!!\n", 0o600, "not valid base64"),
        (b"mrc-key-v1 " + b"A" * 5000, 0o600, "not an mrc key file"),
        (b"", 0o644, "readable by others"),
    ],
)
def test_bad_key_files(tmp_path: Path, content: bytes, mode: int, message: str) -> None:
    path = tmp_path / "k"
    path.write_bytes(content)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match=message):
        read_key_file(str(path))


def test_proofs_bind_key_role_and_exchange() -> None:
    key, other = os.urandom(32), os.urandom(32)
    nc, ns = hs.new_nonce(), hs.new_nonce()
    t = hs.transcript(nc, ns, b"qpn=1,qpn=2")
    p = hs.proof(key, "receiver", t)
    assert hs.check_proof(key, "receiver", t, p)
    assert not hs.check_proof(key, "sender", t, p)  # a reflected proof is useless
    assert not hs.check_proof(other, "receiver", t, p)
    assert not hs.check_proof(key, "receiver", hs.transcript(nc, hs.new_nonce(), b"qpn=1,qpn=2"), p)
    assert not hs.check_proof(key, "receiver", hs.transcript(nc, ns, b"qpn=1,qpn=3"), p)


def test_session_keys_are_fresh_and_per_direction() -> None:
    key = os.urandom(32)
    t1 = hs.transcript(hs.new_nonce(), hs.new_nonce(), b"")
    t2 = hs.transcript(hs.new_nonce(), hs.new_nonce(), b"")
    fwd, back = hs.session_keys(key, t1)
    assert hs.session_keys(key, t1) == (fwd, back)
    assert fwd.header_key != back.header_key and fwd.payload_key != fwd.header_key
    assert hs.session_keys(key, t2)[0].payload_key != fwd.payload_key
    with pytest.raises(ValueError):
        hs.transcript(b"short", hs.new_nonce(), b"")
