"""Transfers much larger than any buffer: mrc-send --size and mrc-recv --discard keep their
memory bounded, and the first byte leaves as soon for 8 GiB as for 1 MiB.

Each side's peak memory is the kernel's high-water mark of the process's own memory (VmHWM in
/proc/PID/status), read until it exits. Not ``ru_maxrss`` from ``wait4``: exec keeps the
high-water mark of the memory it replaces, so a child forked from a pytest process of 270 MiB
reported 270 MiB whatever it used. The first byte is when mrc-recv notes (``-v``) that data
arrived.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import MrcTools

MiB = 1 << 20


class Watched:
    """A started command whose stderr lines are timestamped as they arrive, and whose peak
    resident memory the kernel reports when it is reaped."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.stdout: list[str] = []
        self.stderr: list[tuple[float, str]] = []
        self._reaped: list[tuple[int, int]] = []  # (exit status, peak resident bytes)
        self._peak = 0  # the latest VmHWM read, bytes
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, False), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, True), daemon=True),
        ]
        self._readers.append(threading.Thread(target=self._watch_memory, daemon=True))
        for reader in self._readers:
            reader.start()

    def _watch_memory(self) -> None:
        """VmHWM only grows; read it until the process has exited (then it is gone)."""
        status = Path(f"/proc/{self.proc.pid}/status")
        while True:
            try:
                text = status.read_text()
            except OSError:
                return
            hwm = [line.split()[1] for line in text.splitlines() if line.startswith("VmHWM:")]
            if not hwm:  # a zombie: its memory is gone, the last reading stands
                return
            self._peak = max(self._peak, int(hwm[0]) * 1024)
            time.sleep(0.01)

    def _read(self, stream: IO[str], timed: bool) -> None:
        for line in stream:
            with self._changed:
                if timed:
                    self.stderr.append((time.monotonic(), line))
                else:
                    self.stdout.append(line)
                self._changed.notify_all()

    def when(self, text: str, nth: int = 1, timeout: float = 120.0) -> float:
        """When the ``nth`` stderr line containing ``text`` arrived (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                hits = [at for at, line in self.stderr if text in line]
                if len(hits) >= nth:
                    return hits[nth - 1]
                left = deadline - time.monotonic()
                assert left > 0 and self.alive(), (text, self.describe())
                self._changed.wait(min(left, 1.0))

    def alive(self) -> bool:
        """Not exited yet (asked without reaping it: its peak memory goes with the reaping)."""
        if self._reaped:
            return False
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.proc.pid, flags) is None

    def wait(self, timeout: float = 120.0) -> tuple[int, int]:
        """Exit status and peak resident bytes; killed after ``timeout``."""
        reaped = self._reaped
        if reaped:
            return reaped[0]

        def reap() -> None:
            os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
            self._readers[-1].join()  # the memory watcher has seen the last of it
            _pid, status = os.waitpid(self.proc.pid, 0)
            reaped.append((os.waitstatus_to_exitcode(status), self._peak))

        reaper = threading.Thread(target=reap, daemon=True)
        reaper.start()
        reaper.join(timeout)
        if not reaped:
            self.kill()
            reaper.join()
        self.proc.returncode = reaped[0][0]
        for reader in self._readers[:2]:
            reader.join(10)
        return reaped[0]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def describe(self) -> str:
        err = "".join(line for _at, line in self.stderr)
        return (
            f"{' '.join(self.argv)}\nstdout: {''.join(self.stdout)[:2000]}\nstderr: {err[-2000:]}"
        )


def test_1_gib_through_a_16_mib_window_in_bounded_memory(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    """Each side stays under a quarter of what it moved. (With 256 MiB and a bound of half, a
    full CI run once saw mrc-send peak at 128.7 MiB, against 84-86 MiB in every run alone:
    a bound with room for that, and a transfer large enough that it still means something.)"""
    size = 1024 * MiB
    recv = Watched(
        mrc_tools.argv(
            "mrc-recv",
            ["--listen", f"[::1]:{mrc_port}", "--discard", "--discard-window", "16M", "--json"],
        )
    )
    send = None
    try:
        _wait_listening(recv, mrc_port)
        send = Watched(
            mrc_tools.argv(
                "mrc-send",
                ["--size", "1G", "--to", f"[::1]:{mrc_port}", "--payload", "8192", "--json"],
            )
        )
        (send_status, send_rss), (recv_status, recv_rss) = send.wait(), recv.wait()
        assert send_status == 0, send.describe()
        assert recv_status == 0, recv.describe()
        out, got = json.loads(send.stdout[-1]), json.loads(recv.stdout[-1])
        assert out["ok"] and got["ok"]
        assert out["bytes"] == got["bytes"] == size
        assert out["checksum"] == got["checksum"] == "blake3"  # each round's digest too
        assert out["digest"] == out["digest_receiver"] == got["digest"] == got["digest_sender"]
        # neither side holds the transfer: each stays under a quarter of what it moved
        print(f"peak RSS: mrc-send {send_rss >> 20} MiB, mrc-recv {recv_rss >> 20} MiB")
        assert send_rss < size // 4, f"mrc-send peaked at {send_rss >> 20} MiB"
        assert recv_rss < size // 4, f"mrc-recv peaked at {recv_rss >> 20} MiB"
    finally:
        for w in (send, recv):
            if w is not None:
                w.kill()


def test_the_first_byte_leaves_as_soon_for_8_gib_as_for_1_mib(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    """Nothing at start-up grows with the size: not the data (a bounded generated stream),
    not the receiver's memory (a window, made off its event loop)."""
    recv = Watched(
        mrc_tools.argv(
            "mrc-recv",
            ["--listen", f"[::1]:{mrc_port}", "--discard", "--count", "2", "-v"]
            + ["--max-size", "8G", "--max-total", "8G"],
        )
    )
    senders: list[Watched] = []
    try:
        _wait_listening(recv, mrc_port)
        to = ["--to", f"[::1]:{mrc_port}", "--payload", "8192", "--json"]
        small = Watched(mrc_tools.argv("mrc-send", ["--size", "1M", *to]))
        senders.append(small)
        small_first = recv.when("transfer from", 1) - small.start
        assert small.wait()[0] == 0, small.describe()
        big = Watched(mrc_tools.argv("mrc-send", ["--size", "8G", *to]))
        senders.append(big)
        big_first = recv.when("transfer from", 2) - big.start
        print(f"first byte: {small_first:.2f} s for 1 MiB, {big_first:.2f} s for 8 GiB")
        assert big_first < 2 * small_first + 2.0, (big_first, small_first)
        assert "8.0 GiB into a window of 64.0 MiB" in recv.describe()
    finally:
        for w in (*senders, recv):
            w.kill()
            w.wait()


def _wait_listening(recv: Watched, port: int) -> None:
    """Wait until ``recv`` listens on ``port`` (as conftest's Running does)."""
    want = f":{port:04X} "
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert recv.alive(), recv.describe()
        for name in ("tcp6", "tcp"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{recv.proc.pid}/net/{name}").read_text().splitlines()[1:]:
                    cols = line.split()
                    if len(cols) > 3 and (cols[1] + " ").endswith(want) and cols[3] == "0A":
                        return
        time.sleep(0.01)
    raise AssertionError(f"not listening on {port}: {recv.describe()}")
