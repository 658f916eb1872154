"""mrc-recv's output files and stalled peers: every defect here was seen on an earlier main.

- a second hello during a transfer reopened the live FILE.part with O_TRUNC (SIGBUS);
- FILE.part was opened through a symlink, and an existing --out silently replaced;
- an existing directory as --out got an "ok" verdict, then a traceback;
- a full disk killed the receiver with SIGBUS;
- a sender that connected and then stopped (SIGSTOP, or never sent) held the receiver forever
  (one that never sends is now the listener's --start-timeout: tests/cli/test_recv_limits.py);
- SIGTERM left FILE.part behind;
- SIGKILL left FILE.part behind forever, and later receivers never said so.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import free_port

if TYPE_CHECKING:
    from conftest import MrcTools

IDLE_SENDER = """
import asyncio, sys, mrc
async def main():
    conn = await mrc.connect("::1", int(sys.argv[1]), evs=4, request_size=int(sys.argv[2]))
    if int(sys.argv[3]):  # start: some data first, so the receiver takes this transfer
        await conn.write(bytes(int(sys.argv[3])), conn.requested)
    print("connected", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parts(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".part"))


def _idle_sender(port: int, size: int, start: int = 0) -> subprocess.Popen[str]:
    """A sender that connects asking for ``size`` bytes, writes ``start`` bytes, then idles."""
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE_SENDER, str(port), str(size), str(start)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the hello was answered
    assert line.strip() == "connected", proc.stderr.read() if proc.stderr else ""
    return proc


def test_existing_output_is_refused_unless_force(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"precious")
    res = mrc_tools.run("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out))
    assert res.returncode == 2 and "exists" in res.stderr and res.stderr.count("\n") == 1
    assert out.read_bytes() == b"precious"

    src = tmp_path / "src"
    src.write_bytes(os.urandom(300_000))
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--force", "--json"
    )
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}")
    assert sent.returncode == 0, sent.describe()
    assert recv.wait().returncode == 0
    assert _sha(out) == _sha(src) and _parts(tmp_path) == []


def test_directory_and_symlink_outputs(mrc_tools: MrcTools, mrc_port: int, tmp_path: Path) -> None:
    d = tmp_path / "adir"
    d.mkdir()
    res = mrc_tools.run("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(d), "--force")
    assert res.returncode == 2 and "is a directory" in res.stderr

    # --force replaces a link at --out by the file; what the link named is never written
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "link.bin"
    link.symlink_to(victim)
    src = tmp_path / "src"
    src.write_bytes(os.urandom(100_000))
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(link), "--force"
    )
    recv.wait_listening(mrc_port)
    assert mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}").returncode == 0
    assert recv.wait().returncode == 0
    assert victim.read_bytes() == b"keep"
    assert not link.is_symlink() and _sha(link) == _sha(src)


def test_second_hello_during_a_transfer_is_refused(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    """--count 1: the first sender gets the only region; a second is refused at once with a
    reason, and the first transfer lands whole (it used to be truncated under its mmap)."""
    out = tmp_path / "out.bin"
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--idle-timeout", "20"
    )
    recv.wait_listening(mrc_port)
    first = _idle_sender(mrc_port, 1 << 20, 1000)  # holds the slot, its part file exists
    try:
        assert len(_parts(tmp_path)) == 1
        src = tmp_path / "src"
        src.write_bytes(os.urandom(200_000))
        second = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}")
        assert second.returncode == 1
        assert "has them all" in second.stderr, second.describe()
        assert len(_parts(tmp_path)) == 1  # the refused sender allocated nothing
    finally:
        first.kill()
        first.wait()
    res = recv.wait(timeout=30)
    assert res.returncode == 1 and "sender went away" in res.stderr, res.describe()
    assert _parts(tmp_path) == [] and not out.exists()


def test_idle_sender_times_out_and_leaves_nothing(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    out = tmp_path / "out.bin"
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--idle-timeout", "1"
    )
    recv.wait_listening(mrc_port)
    sender = _idle_sender(mrc_port, 4 << 20, 1000)  # started, then stalls
    try:
        t0 = time.monotonic()
        res = recv.wait(timeout=20)
        assert time.monotonic() - t0 < 10
    finally:
        sender.kill()
        sender.wait()
    assert res.returncode == 1
    assert "no data from the sender for 1 s" in res.stderr, res.describe()
    assert _parts(tmp_path) == [] and not out.exists()


def test_sigterm_removes_the_part_file(mrc_tools: MrcTools, mrc_port: int, tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out))
    recv.wait_listening(mrc_port)
    sender = _idle_sender(mrc_port, 4 << 20)
    try:
        assert len(_parts(tmp_path)) == 1
        recv.proc.send_signal(signal.SIGTERM)
        res = recv.wait(timeout=20)
    finally:
        sender.kill()
        sender.wait()
    assert res.returncode == 130, res.describe()
    assert "Traceback" not in res.stderr
    assert _parts(tmp_path) == [] and not out.exists()


def test_a_part_file_is_private_and_the_result_follows_the_umask(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    """Partial data is readable by its owner only (it was 0644, whatever the umask said); the
    verified file gets the mode the user's umask gives a new file."""
    out = tmp_path / "out{n}.bin"
    old = os.umask(0o027)
    try:
        recv = mrc_tools.start(
            "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--count", "2"
        )
    finally:
        os.umask(old)
    recv.wait_listening(mrc_port)
    sender = _idle_sender(mrc_port, 1 << 20)
    try:
        (part,) = _parts(tmp_path)
        assert os.stat(tmp_path / part).st_mode & 0o777 == 0o600
    finally:
        sender.kill()
        sender.wait()
    src = tmp_path / "src"
    src.write_bytes(os.urandom(100_000))
    sent = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}", timeout=30)
    assert sent.returncode == 0, sent.describe()
    recv.proc.send_signal(signal.SIGTERM)
    recv.wait(timeout=20)
    (done,) = [p for p in tmp_path.iterdir() if p.name.startswith("out") and p.suffix == ".bin"]
    assert _sha(done) == _sha(src)
    assert os.stat(done).st_mode & 0o777 == 0o640


def test_part_files_of_a_killed_receiver_are_named_at_the_next_start(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    """SIGKILL leaves the part file (nothing can remove it then); the next receiver with the
    same --out names it with the command that removes it, and never names the part file of a
    receiver that is still alive."""
    out = tmp_path / "out{n}.bin"
    killed = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--count", "2"
    )
    killed.wait_listening(mrc_port)
    sender = _idle_sender(mrc_port, 4 << 20)
    try:
        left = _parts(tmp_path)
        assert len(left) == 1 and left[0].startswith("out1.bin.")
        killed.proc.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=20).returncode == -signal.SIGKILL
    finally:
        sender.kill()
        sender.wait()
    assert _parts(tmp_path) == left  # still there: a killed process deletes nothing

    # a live receiver holding a part file of its own, beside the stale one
    port2 = free_port()
    alive = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{port2}", "--out", str(out))
    alive.wait_listening(port2)
    sender = _idle_sender(port2, 4 << 20)
    try:
        assert len(_parts(tmp_path)) == 2
        port3 = free_port()
        third = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{port3}", "--out", str(out))
        third.wait_listening(port3)  # it looks for stale part files before it listens
        third.proc.send_signal(signal.SIGTERM)
        res = third.wait(timeout=20)
    finally:
        sender.kill()
        sender.wait()
    warnings = [line for line in res.stderr.splitlines() if "part file" in line]
    stale = tmp_path / left[0]
    assert warnings == [
        f"mrc-recv: warning: 1 part file(s) left by a receiver that is gone (their transfers"
        f" never completed); remove with: rm -- {stale}"
    ], res.stderr
    assert stale.exists()  # named, not removed


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (root only)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_a_refusal_before_data_moves(
    mrc_tools: MrcTools, mrc_port: int, small_disk: Path
) -> None:
    out = small_disk / "out.bin"
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out))
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run("mrc-send", "--size", "8M", "--to", f"[::1]:{mrc_port}")
    assert sent.returncode == 1
    assert f"no space for {8 << 20} bytes" in sent.stderr, sent.describe()
    recv.kill()
    assert _parts(small_disk) == [] and not out.exists()
