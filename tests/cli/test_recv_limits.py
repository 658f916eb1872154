"""mrc-recv's limits against hostile or broken peers, on real processes and loopback sockets.

The defect (issue 9): one idle valid hello took the only ``--count 1`` slot; the receiver then
waited forever and the real sender failed after 30 s with an empty reason. Now a hello whose
data never starts is dropped after --start-timeout (with an abort naming the reason), its part
file deleted and its slot kept for a real sender; a sender arriving meanwhile is refused at once
with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

from mrc.transport.messages import Hello, RegionRequest


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parts(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".part"))


class RawPeer:
    """A side-channel client driven by hand, with a blocking socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("::1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def hello(self, size: int) -> dict[str, object]:
        hello = Hello(1, 0, 9, ("::1",), 4, request=RegionRequest(size, "idle"))
        self.sock.sendall(json.dumps(hello.to_json()).encode() + b"\n")
        return self.line()

    def line(self) -> dict[str, object]:
        raw = self.file.readline()
        assert raw.endswith(b"\n"), f"no whole line: {raw!r}"
        obj = json.loads(raw)
        assert isinstance(obj, dict)
        return obj

    def at_eof(self) -> bool:
        try:
            return self.file.read() == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def test_an_idle_hello_does_not_keep_the_only_slot(mrc_tools, mrc_port, tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--start-timeout", "1"
    )
    recv.wait_listening(mrc_port)
    idle = RawPeer(mrc_port)
    try:
        assert idle.hello(1 << 20)["ok"] is True
        assert len(_parts(tmp_path)) == 1  # its region (a part file) was granted
        src = tmp_path / "src"
        src.write_bytes(os.urandom(500_000))
        # meanwhile a real sender is refused at once, with the reason
        t0 = time.monotonic()
        early = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}", timeout=20)
        assert time.monotonic() - t0 < 5
        assert early.returncode == 1 and "has them all" in early.stderr, early.describe()
        # the idle one is told why and hung up on; its part file goes
        abort = idle.line()
        assert abort == {
            "error": "no data from the sender within 1 s of set-up; connection dropped"
        }
        assert idle.at_eof()
    finally:
        idle.close()
    assert _parts(tmp_path) == []
    # and the slot is still there: the real sender's transfer lands, verified
    sent = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}", timeout=30)
    assert sent.returncode == 0, sent.describe()
    res = recv.wait(timeout=30)
    assert res.returncode == 0, res.describe()
    assert _sha(out) == _sha(src) and _parts(tmp_path) == []


def test_a_released_transfer_number_is_never_given_again(
    mrc_tools, mrc_port, tmp_path: Path
) -> None:
    """An idle hello took number 1, a real transfer number 2; when the idle one was dropped its
    number went back, and the next sender got number 2 again: refused because f2.bin exists
    (the receiver then never finished), or, with --force, a verified file replaced."""
    out = tmp_path / "f{n}.bin"
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--count", "2",
        "--start-timeout", "1",
    )  # fmt: skip
    recv.wait_listening(mrc_port)
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_bytes(os.urandom(300_000))
    second.write_bytes(os.urandom(200_000))
    idle = RawPeer(mrc_port)
    try:
        assert idle.hello(1 << 20)["ok"] is True  # number 1
        sent = mrc_tools.run("mrc-send", str(first), "--to", f"[::1]:{mrc_port}", timeout=30)
        assert sent.returncode == 0, sent.describe()  # number 2
        assert idle.line()["error"].startswith("no data from the sender")  # type: ignore[union-attr]
    finally:
        idle.close()
    sent = mrc_tools.run("mrc-send", str(second), "--to", f"[::1]:{mrc_port}", timeout=30)
    assert sent.returncode == 0, sent.describe()
    res = recv.wait(timeout=30)
    assert res.returncode == 0, res.describe()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("f"))
    assert names == ["f2.bin", "f3.bin"]
    assert _sha(tmp_path / "f2.bin") == _sha(first) and _sha(tmp_path / "f3.bin") == _sha(second)


def test_max_total_and_max_setups_refuse_with_the_limit(mrc_tools, mrc_port, tmp_path) -> None:
    recv = mrc_tools.start(
        "mrc-recv",
        "--listen",
        f"[::1]:{mrc_port}",
        "--discard",
        "--count",
        "3",
        "--max-total",
        "1M",
        "--max-setups",
        "1",
    )
    recv.wait_listening(mrc_port)
    holder = RawPeer(mrc_port)
    quiet: RawPeer | None = None
    try:
        assert holder.hello(800 << 10)["ok"] is True
        big = mrc_tools.run("mrc-send", "--size", "500K", "--to", f"[::1]:{mrc_port}")
        assert big.returncode == 1, big.describe()
        assert big.stderr.count("\n") == 1
        assert (
            "cannot grant 512000 bytes: 819200 of the 1048576 bytes this receiver grants at "
            "once are in use" in big.stderr
        ), big.describe()
        fits = mrc_tools.run("mrc-send", "--size", "200K", "--to", f"[::1]:{mrc_port}")
        assert fits.returncode == 0, fits.describe()
        # a connection that says nothing holds the only set-up slot: the next is refused
        quiet = RawPeer(mrc_port)
        busy = mrc_tools.run("mrc-send", "--size", "1K", "--to", f"[::1]:{mrc_port}")
        assert busy.returncode == 1
        assert "too many set-ups in progress (limit 1)" in busy.stderr, busy.describe()
    finally:
        holder.close()
        if quiet is not None:
            quiet.close()
        recv.kill()
