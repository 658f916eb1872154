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
from typing import TYPE_CHECKING, Any

from mrc.transport.messages import Hello, RegionRequest

if TYPE_CHECKING:
    from conftest import MrcTools


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parts(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".part"))


class RawPeer:
    """A side-channel client driven by hand, with a blocking socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("::1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def hello(self, size: int) -> dict[str, Any]:
        hello = Hello(1, 0, 9, ("::1",), 4, request=RegionRequest(size, "idle"))
        self.sock.sendall(json.dumps(hello.to_json()).encode() + b"\n")
        return self.line()

    def line(self) -> dict[str, Any]:
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


def test_an_idle_hello_does_not_keep_the_only_slot(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
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
        assert abort == {  # numbered, as every side-channel message after set-up is
            "n": 0,
            "m": {"error": "no data from the sender within 1 s of set-up; connection dropped"},
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
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
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
        assert idle.line()["m"]["error"].startswith("no data from the sender")
    finally:
        idle.close()
    sent = mrc_tools.run("mrc-send", str(second), "--to", f"[::1]:{mrc_port}", timeout=30)
    assert sent.returncode == 0, sent.describe()
    res = recv.wait(timeout=30)
    assert res.returncode == 0, res.describe()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("f"))
    assert names == ["f2.bin", "f3.bin"]
    assert _sha(tmp_path / "f2.bin") == _sha(first) and _sha(tmp_path / "f3.bin") == _sha(second)


def test_max_total_and_max_setups_refuse_with_the_limit(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
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
            "once are in use (--max-total raises it)" in big.stderr
        ), big.describe()
        fits = mrc_tools.run("mrc-send", "--size", "200K", "--to", f"[::1]:{mrc_port}")
        assert fits.returncode == 0, fits.describe()
        # a connection that says nothing takes the only set-up slot, and gives way to the next
        # sender (it used to keep every sender out until it timed out)
        quiet = RawPeer(mrc_port)
        late = mrc_tools.run("mrc-send", "--size", "1K", "--to", f"[::1]:{mrc_port}")
        assert late.returncode == 0, late.describe()
        dropped = quiet.line()
        assert dropped["ok"] is False and dropped["error"] == (
            "set-up dropped for a newer connection: all 1 set-up slots were taken and this one "
            "had not yet said its hello or proved the key (--max-setups raises it)"
        )
    finally:
        holder.close()
        if quiet is not None:
            quiet.close()
        recv.kill()


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no MemTotal")


def test_a_hello_without_a_key_cannot_take_the_machines_memory(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    """Issue 21: each hello could make a --discard receiver map (and, up to 4 GiB, pre-fault)
    what it asked for, up to 64 GiB together on a machine with 24. Now a transfer larger than
    --discard-window is granted that window only (it streams through it), and what --discard
    holds in memory is bounded by --max-memory, by default a quarter of the machine's memory:
    a hello whose window does not fit is refused before anything is mapped, naming the flag."""
    half = _mem_total() // 2  # never mapped: at most a window of it is
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--count", "2"
    )  # fmt: skip
    recv.wait_listening(mrc_port)
    stranger = RawPeer(mrc_port)
    try:
        welcome = stranger.hello(half)
        assert welcome["ok"] is True, welcome
        regions = welcome["regions"]
        assert isinstance(regions, list) and len(regions) == 1, welcome
        assert regions[0]["length"] == 64 << 20, welcome  # the default --discard-window
    finally:
        stranger.close()
    # and a real transfer still fits
    sent = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}")
    assert sent.returncode == 0, sent.describe()
    recv.kill()


def test_a_window_beyond_max_memory_is_refused(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--max-memory", "40M"
    )  # fmt: skip
    recv.wait_listening(mrc_port)
    stranger = RawPeer(mrc_port)
    try:
        refused = stranger.hello(1 << 30)
        assert refused["ok"] is False, refused
        error = str(refused["error"])
        window = 64 << 20  # the memory a 1 GiB transfer takes: its window, not its size
        assert error.startswith(f"cannot grant {window} bytes of memory: 0 of the "), error
        assert error.endswith("bytes of memory this receiver grants at once are in use "
                              "(--max-memory raises it)"), error  # fmt: skip
    finally:
        stranger.close()
    sent = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}")
    assert sent.returncode == 0, sent.describe()
    assert recv.wait(30).returncode == 0


def test_max_memory_above_the_machines_memory_is_a_usage_error(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    res = mrc_tools.run(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--max-memory",
        str(4 * _mem_total()),
    )  # fmt: skip
    assert res.returncode == 2, res.describe()
    assert "is more than this machine's memory" in res.stderr, res.describe()
