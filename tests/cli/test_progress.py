"""Progress bars: one line per transfer, however many run at once, on a terminal only.

What a terminal would show is worked out from the bytes written (a small screen model that
applies carriage returns, line feeds, cursor-up and erase-line, the only moves rich's live
display makes), so the tests check the picture a user sees, not the calls made to rich.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import BIN
from rich.console import Console

from mrc.cli.progress import Progress, ProgressBoard

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


@pytest.fixture(autouse=True)
def _a_real_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests draw on a terminal of their own: whatever TERM the suite runs under (dumb,
    from a bare chroot or a CI runner), rich would draw no live display on it."""
    monkeypatch.setenv("TERM", "xterm-256color")


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after ``raw`` (colours dropped, trailing blanks removed)."""
    lines = [""]
    row = col = 0
    pos = 0
    while pos < len(raw):
        m = _CSI.match(raw, pos)
        if m:
            arg, cmd = m.group(1), m.group(2)
            n = int(arg) if arg.isdigit() else 1
            if cmd == "A":
                row = max(0, row - n)
            elif cmd == "B":
                row += n
            elif cmd == "G":
                col = n - 1
            elif cmd == "K":
                lines[row] = "" if arg == "2" else lines[row][:col]
            pos = m.end()
            while row >= len(lines):
                lines.append("")
            continue
        ch = raw[pos]
        pos += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            col = 0
            while row >= len(lines):
                lines.append("")
        elif ch == "\x1b":
            continue
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + ch + line[col + 1 :]
            col += 1
    shown = [line.rstrip() for line in lines]
    while shown and not shown[-1]:
        shown.pop()
    return shown


def _board() -> tuple[ProgressBoard, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=110, color_system="standard")
    return ProgressBoard(console, enabled=True), out


def test_concurrent_transfers_each_keep_their_own_line() -> None:
    board, out = _board()
    labels = [f"fd00::{i} -> out{i}.bin" for i in range(3)]
    bars = [Progress(4096 * (i + 1), label, True, board) for i, label in enumerate(labels)]
    assert board.active == 3
    for step in range(1, 4):  # interleaved, as concurrent transfers report
        for i, bar in enumerate(bars):
            bar.update(step * 1024 * (i + 1), force=True)
    shown = screen(out.getvalue())
    assert len(shown) == 3, shown
    for line, label in zip(shown, labels, strict=True):
        assert line.startswith(label), shown
        assert " 75%" in line, shown  # 3 of 4 KiB each

    bars[1].finish()  # the middle one ends first: its final line is kept, above the others
    assert board.active == 2
    bars[0].update(4096, force=True)
    shown = screen(out.getvalue())
    assert len(shown) == 3, shown
    assert shown[0].startswith(labels[1]) and " 75%" in shown[0]
    assert shown[1].startswith(labels[0]) and "100%" in shown[1]
    assert shown[2].startswith(labels[2]) and " 75%" in shown[2]

    bars[2].finish()
    bars[0].finish()
    assert board.active == 0
    shown = screen(out.getvalue())
    assert [line.split(" ")[0] for line in shown] == ["fd00::1", "fd00::2", "fd00::0"]
    assert "\x1b[?25h" in out.getvalue()[-20:]  # the cursor is shown again
    bars[0].finish()  # twice: nothing more happens
    assert screen(out.getvalue()) == shown


def test_a_board_restarts_for_the_next_transfer() -> None:
    board, out = _board()
    first = Progress(100, "first", True, board)
    first.update(100, force=True)
    first.finish()
    second = Progress(100, "second", True, board)
    second.update(50, force=True)
    assert board.active == 1
    shown = screen(out.getvalue())
    assert len(shown) == 2 and shown[0].startswith("first") and shown[1].startswith("second")
    second.finish()


def test_disabled_progress_draws_and_creates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    board, out = _board()
    off = Progress(100, "hidden", False, board)
    off.update(50, force=True)
    off.finish()
    assert out.getvalue() == "" and board.active == 0
    quiet_board = ProgressBoard(Console(file=io.StringIO(), force_terminal=True), enabled=False)
    assert quiet_board.add(100, "x") is None
    # without a terminal on stderr, the default is off
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert Progress(100, "default").enabled is False


def _recv_on_a_terminal(args: list[str], senders: list[list[str]]) -> tuple[str, str, int]:
    """Run mrc-recv with stderr on a pseudo-terminal (stdout a pipe) while ``senders`` run
    at once; returns (what the terminal got, stdout, mrc-recv's exit status)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "150", "LINES": "40"}
    recv = subprocess.Popen(
        [str(BIN / "mrc-recv"), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
        text=True,
        start_new_session=True,
    )
    os.close(slave)
    got: list[bytes] = []

    def drain() -> None:  # a pty's buffer is small: keep reading or mrc-recv blocks
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                return
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: mrc-recv closed its end
                return
            if not chunk:
                return
            got.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sends = []
    try:
        port = args[args.index("--listen") + 1].rsplit(":", 1)[1]
        _wait_port(recv, int(port))
        sends = [
            subprocess.Popen(
                [str(BIN / "mrc-send"), *s],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for s in senders
        ]
        for s in sends:
            out, err = s.communicate(timeout=60)
            assert s.returncode == 0, err
        stdout, _ = recv.communicate(timeout=60)
    finally:
        for p in (recv, *sends):
            if p.poll() is None:
                p.kill()
                p.communicate()
        reader.join(10)
        os.close(master)
    return b"".join(got).decode(errors="replace"), stdout, recv.returncode


def _wait_port(proc: subprocess.Popen[str], port: int) -> None:
    import time

    deadline = time.monotonic() + 10
    want = f":{port:04X} "
    while time.monotonic() < deadline:
        assert proc.poll() is None, "mrc-recv exited early"
        for name in ("tcp6", "tcp"):
            text = Path(f"/proc/{proc.pid}/net/{name}").read_text()
            if any(
                (line.split()[1] + " ").endswith(want) and line.split()[3] == "0A"
                for line in text.splitlines()[1:]
            ):
                return
        time.sleep(0.01)
    raise AssertionError(f"mrc-recv not listening on {port}")


def test_recv_draws_a_line_per_concurrent_transfer(mrc_port: int, tmp_path: Path) -> None:
    to = f"[::1]:{mrc_port}"
    sender = ["--size", "3M", "--window", "4", "--to", to, "--no-progress"]
    term, stdout, status = _recv_on_a_terminal(
        ["--listen", to, "--count", "2", "--out", str(tmp_path / "{n}.bin")],
        [sender, sender],
    )
    assert status == 0, term
    shown = screen(term)
    files = [str(tmp_path / "1.bin"), str(tmp_path / "2.bin")]
    bars = [line for line in shown if line.startswith("::1 -> ")]
    assert sorted(line.split(" ")[2] for line in bars) == files, shown
    assert all("100%" in line and "3.0/3.0 MiB" in line for line in bars), shown
    # the results stay on stdout (a pipe here), not drawn onto the terminal
    assert stdout.count("ok: received 3.0 MiB from ::1") == 2
    assert "ok: received" not in term


def test_recv_draws_nothing_with_json(mrc_port: int, tmp_path: Path) -> None:
    to = f"[::1]:{mrc_port}"
    term, stdout, status = _recv_on_a_terminal(
        ["--listen", to, "--discard", "--json"],
        [["--size", "1M", "--to", to, "--no-progress"]],
    )
    assert status == 0, term
    assert term == "", repr(term)
    assert stdout.startswith("{")


# --- phases and the time left -----------------------------------------------------------------


def test_a_line_names_its_phase_until_bytes_move_and_after() -> None:
    from mrc.cli.progress import CONNECTING, START_BYTES, STARTING

    board, out = _board()
    total = 4 << 30  # a hundredth is more than START_BYTES
    bar = Progress(total, "sending", True, board, phase=CONNECTING)
    assert screen(out.getvalue())[-1].startswith("sending (connecting)")
    bar.phase(STARTING)
    bar.update(START_BYTES - 1, force=True)  # a trickle: still starting, no rate, no ETA
    line = screen(out.getvalue())[-1]
    assert line.startswith("sending (starting)") and line.endswith("- -:--:--"), line
    bar.update(START_BYTES, force=True)
    assert screen(out.getvalue())[-1].startswith("sending ━"), screen(out.getvalue())
    bar.update(total, force=True)  # every byte there: the hashes are being swapped
    assert screen(out.getvalue())[-1].startswith("sending (verifying)")
    bar.finish("verified")
    (line,) = screen(out.getvalue())
    assert line.startswith("sending (verified)") and "100%" in line, line


def test_a_small_transfer_leaves_its_start_at_a_hundredth() -> None:
    board, out = _board()
    bar = Progress(1000, "x", True, board)
    bar.update(9, force=True)
    assert screen(out.getvalue())[-1].startswith("x (starting)")
    bar.update(10, force=True)
    assert screen(out.getvalue())[-1].startswith("x ━")
    bar.finish("failed")
    assert screen(out.getvalue())[-1].startswith("x (failed)")


def test_no_rate_and_no_eta_for_a_second_then_a_smoothed_one() -> None:
    from mrc.cli.progress import RateEstimate

    r = RateEstimate()
    r.add(0.0, 0)  # nothing moved yet: no start
    r.add(10.0, 1_000)  # the first bytes, at t=10
    for t in (10.25, 10.5, 10.75):
        r.add(t, 1_000 + int((t - 10.0) * 1e6))
        assert r.rate is None and r.eta(0, 10**9) is None
    r.add(11.0, 1_001_000)  # a second of 1 MB/s
    assert r.rate == pytest.approx(1e6)
    assert r.eta(1_001_000, 11_001_000) == pytest.approx(10.0)
    r.add(11.1, 9_999_999)  # samples closer than RATE_SAMPLE are not taken apart
    assert r.rate == pytest.approx(1e6)
    r.add(11.5, 3_001_000)  # a burst of 4 MB/s moves the estimate part of the way only
    assert r.rate is not None and 1e6 < r.rate < 2.5e6
    assert r.eta(5, 5) is None


def test_a_slow_start_never_shows_hours_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case of the issue: 2 GiB whose first seconds trickle (a receiver faulting its
    memory in) then flow at 500 MB/s. The start phase holds the ETA back until the flow."""
    import time

    from mrc.cli.progress import START_BYTES

    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    board, _out = _board()
    total = 2 << 30
    bar = Progress(total, "x", True, board)
    etas = []
    done = 0
    while done < total:
        clock[0] += 0.1
        done = min(total, done + (50_000 if clock[0] < 4 else 50_000_000))
        bar.update(done)
        if START_BYTES <= done < total:
            etas.append(bar.rate.eta(done, total))
    shown = [e for e in etas if e is not None]
    assert shown and max(shown) < 10, max(shown)
    assert etas[0] is None  # the first second after the start: no ETA yet


def test_a_transfer_that_never_started_leaves_no_line() -> None:
    from mrc.cli.progress import CONNECTING

    board, out = _board()
    bar = Progress(1 << 20, "sending", True, board, phase=CONNECTING)
    bar.finish("failed", keep=bar.done > 0)  # refused: the error line says why
    assert screen(out.getvalue()) == [] and board.active == 0
