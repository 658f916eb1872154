"""mrc-send / mrc-recv: one line on stderr and the documented exit status for every failure."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import MrcTools, Result


def one_line(res: Result, tool: str) -> str:
    """The single line of stderr, which must be '<tool>: error: ...' and no traceback."""
    assert "Traceback" not in res.stderr, res.describe()
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.describe()
    assert lines[0].startswith(f"{tool}: error: "), res.describe()
    assert res.stdout == "", res.describe()
    return lines[0]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--size", "1M"], r"--to"),
        (["--size", "12Q", "--to", "::1"], r"12Q"),
        (["--size", "1M", "--to", "[::1]:99999"], r"bad port"),
        (["--size", "1M", "--to", "[::1:4791"], r"missing '\]'"),
        (["--to", "::1"], r"FILE --size"),
        (["some.file", "--size", "1M", "--to", "::1"], r"not allowed"),
        (["--size", "1M", "--to", "::1", "--payload", "0"], r"--payload"),
        (["--size", "1M", "--to", "::1", "--payload", "70000"], r"payload size"),
        (["--size", "1M", "--to", "::1", "--evs", "x"], r"--evs"),
        (["--size", "1M", "--to", "::1", "--bogus"], r"--bogus"),
    ],
    ids=[
        "no-to",
        "bad-size",
        "bad-port",
        "bad-bracket",
        "no-source",
        "file-and-size",
        "payload-0",
        "payload-huge",
        "evs-nan",
        "unknown-flag",
    ],
)
def test_send_usage_errors(mrc_tools: MrcTools, args: list[str], pattern: str) -> None:
    res = mrc_tools.run("mrc-send", *args, timeout=20)
    assert res.returncode == 2, res.describe()
    assert re.search(pattern, one_line(res, "mrc-send")), res.stderr


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--out", "x", "--discard"], r"not allowed"),
        ([], r"--out --discard|one of the arguments"),
        (["--count", "2", "--out", "x.bin"], r"\{n\}"),
        (["--discard", "--listen", "[::1]:99999"], r"bad port"),
        (["--discard", "--listen", "[::1]:4000", "--listen", "[::2]:4001"], r"same port"),
        (["--discard", "--count", "0"], r"--count"),
        (["--discard", "--max-size", "lots"], r"lots"),
        (["--discard", "--metrics-port", "70000"], r"--metrics-port: must be a port"),
        (["--discard", "--metrics-port", "x"], r"--metrics-port: not an integer"),
        (["--discard", "--metrics-addr", "::"], r"--metrics-addr needs --metrics-port"),
    ],
    ids=[
        "out-and-discard",
        "no-output",
        "count-without-n",
        "bad-port",
        "ports-differ",
        "count-0",
        "bad-max-size",
        "metrics-port-huge",
        "metrics-port-nan",
        "metrics-addr-alone",
    ],
)
def test_recv_usage_errors(mrc_tools: MrcTools, args: list[str], pattern: str) -> None:
    res = mrc_tools.run("mrc-recv", *args, timeout=20)
    assert res.returncode == 2, res.describe()
    assert re.search(pattern, one_line(res, "mrc-recv")), res.stderr


def test_send_connection_refused(mrc_tools: MrcTools, mrc_port: int) -> None:
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}", timeout=20)
    assert res.returncode == 1, res.describe()
    assert "refused" in one_line(res, "mrc-send")


def test_send_missing_input_file(mrc_tools: MrcTools, mrc_port: int, tmp_path: Path) -> None:
    missing = tmp_path / "nope.bin"
    res = mrc_tools.run("mrc-send", str(missing), "--to", f"[::1]:{mrc_port}", timeout=20)
    assert res.returncode == 1, res.describe()
    line = one_line(res, "mrc-send")
    assert str(missing) in line and "No such file" in line


def test_send_unresolvable_host(mrc_tools: MrcTools) -> None:
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", "no-such-host.invalid:4791", timeout=30)
    assert res.returncode == 1, res.describe()
    assert "cannot resolve 'no-such-host.invalid'" in one_line(res, "mrc-send")


def test_send_json_failure_still_one_line(mrc_tools: MrcTools, mrc_port: int) -> None:
    """--json: the one error line on stderr, and on stdout the failure object (the schema's
    shape is checked in test_usage_errors.py)."""
    res = mrc_tools.run(
        "mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}", "--json", timeout=20
    )
    assert res.returncode == 1, res.describe()
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrc-send: error: "), res.describe()
    assert res.json["ok"] is False and res.json["role"] == "send"
    assert lines[0] == f"mrc-send: error: {res.json['error']}"


def test_recv_timeout_without_sender(mrc_tools: MrcTools, mrc_port: int) -> None:
    t0 = time.monotonic()
    res = mrc_tools.run(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--timeout", "0.5", timeout=20
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == 1, res.describe()
    assert "no sender connected within 0.5 s" in one_line(res, "mrc-recv")
    assert 0.5 <= elapsed < 5


def test_recv_port_in_use(mrc_tools: MrcTools, mrc_port: int) -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as busy:
        busy.bind(("::1", mrc_port))
        res = mrc_tools.run(
            "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--timeout", "0.5", timeout=20
        )
    assert res.returncode == 1, res.describe()
    assert "in use" in one_line(res, "mrc-recv")


def test_recv_output_gone_fails_the_sender_and_says_so(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    """--out's directory is checked at start (test_usage_errors.py); one removed later fails
    each sender with the reason, and the receiver says so: once per refusal, and in its
    error line when --timeout ends the wait."""
    where = tmp_path / "later-gone"
    where.mkdir()
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(where / "x.bin"), "--timeout", "3"
    )
    recv.wait_listening(mrc_port)
    where.rmdir()
    send = mrc_tools.run("mrc-send", "--size", "10K", "--to", f"[::1]:{mrc_port}", timeout=20)
    assert send.returncode == 1, send.describe()
    assert "cannot create" in one_line(send, "mrc-send")
    # the receiver refused that sender and keeps waiting for a good one until its timeout
    res = recv.wait(20)
    assert res.returncode == 1, res.describe()
    assert "Traceback" not in res.stderr
    warning, error = res.stderr.splitlines()
    assert warning.startswith("mrc-recv: warning: refused a sender: cannot create "), warning
    assert error.startswith(
        "mrc-recv: error: no transfer started within 3 s: 1 sender(s) refused, the last "
        "because: cannot create "
    ), error


def test_recv_refuses_oversized_transfer(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start(
        "mrc-recv",
        "--listen",
        f"[::1]:{mrc_port}",
        "--discard",
        "--max-size",
        "1M",
        "--timeout",
        "3",
    )
    recv.wait_listening(mrc_port)
    send = mrc_tools.run("mrc-send", "--size", "2M", "--to", f"[::1]:{mrc_port}", timeout=20)
    assert send.returncode == 1, send.describe()
    assert "exceeds --max-size" in one_line(send, "mrc-send")
    recv.kill()


SEND_FLAGS = [
    "--idle-timeout",
    "--scheduling",
    "--size",
    "--time",
    "--interval",
    "--parallel",
    "--to",
    "--evs",
    "--payload",
    "--window",
    "--from",
    "--json",
    "--no-progress",
    "--help",
    "file",
    "--fabric",
    "--fabric-host",
    "--deny",
    "--ev-log",
    "--ports",
    "--key-file",
    "--encrypt",
    "--checksum",
    "--burst",
    "--spray",
    "--cc",
    "--qp",
    "--wait",
    "--metrics-port",
    "--metrics-addr",
    "--version",
    "-v",
    "--verbose",
    "-q",
    "--quiet",
]
RECV_FLAGS = [
    "--listen",
    "--out",
    "--discard",
    "--discard-window",
    "--count",
    "--evs",
    "--max-size",
    "--force",
    "--max-total",
    "--max-memory",
    "--max-setups",
    "--start-timeout",
    "--idle-timeout",
    "--scheduling",
    "--timeout",
    "--metrics-port",
    "--metrics-addr",
    "--json",
    "--no-progress",
    "--help",
    "--fabric",
    "--fabric-host",
    "--deny",
    "--ev-log",
    "--ports",
    "--qp",
    "--key-file",
    "--encrypt",
    "--checksum",
    "--version",
    "-v",
    "--verbose",
    "-q",
    "--quiet",
]


@pytest.mark.parametrize(("tool", "flags"), [("mrc-send", SEND_FLAGS), ("mrc-recv", RECV_FLAGS)])
def test_help_mentions_every_flag(mrc_tools: MrcTools, tool: str, flags: list[str]) -> None:
    res = mrc_tools.run(tool, "--help", timeout=20)
    assert res.returncode == 0, res.describe()
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", res.stdout), flag
    assert "Exit status" in res.stdout
    # and the parser has no flag the list above forgets
    declared = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", res.stdout))
    assert declared <= set(flags), declared - set(flags)
