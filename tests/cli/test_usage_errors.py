"""Mistakes caught before the network, one line each naming the flag, exit status 2; and with
--json, whatever ends the run, one JSON object on stdout that the schema takes.

Each case here once reached the network (or a traceback) first: a receiver listening into a
directory that is not there, a port read as an IPv4 address, a directory mmap'ed, a --from
this host does not have, a mistyped flag reported as a clash of two others.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

if TYPE_CHECKING:
    from conftest import MrcTools, Result

    from mrc.lab.testbed import TwoHosts

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def usage_error(res: Result, tool: str) -> str:
    """The one line of stderr of a usage error (exit status 2, nothing on stdout)."""
    assert res.returncode == 2, res.describe()
    assert "Traceback" not in res.stderr, res.describe()
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), res.describe()
    assert res.stdout == "", res.describe()
    return lines[0]


def schema(tool: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((SCHEMAS / f"{tool}.schema.json").read_text())
    return loaded


# --- mrc-recv --out ---------------------------------------------------------------------------


def test_out_in_a_missing_directory_is_refused_before_listening(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    out = tmp_path / "missing-dir" / "x.bin"
    res = mrc_tools.run("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), timeout=20)
    line = usage_error(res, "mrc-recv")
    assert line == (
        f"mrc-recv: error: --out {out}: the directory {out.parent} does not exist "
        "(see mrc-recv --help)"
    )


def test_out_under_a_missing_directory_with_n_is_refused(
    mrc_tools: MrcTools, tmp_path: Path
) -> None:
    out = tmp_path / "missing-dir" / "{n}" / "x.bin"
    res = mrc_tools.run("mrc-recv", "--out", str(out), "--count", "2", timeout=20)
    line = usage_error(res, "mrc-recv")
    assert f"--out {out}: the directory {tmp_path / 'missing-dir'} does not exist" in line


def test_out_where_nothing_can_be_created_is_refused(mrc_tools: MrcTools) -> None:
    res = mrc_tools.run("mrc-recv", "--out", "/proc/mrc-test.bin", timeout=20)
    line = usage_error(res, "mrc-recv")
    assert line.startswith(
        "mrc-recv: error: --out /proc/mrc-test.bin: cannot create files in /proc"
    )


def test_out_in_a_read_only_directory_is_refused(mrc_tools: MrcTools, tmp_path: Path) -> None:
    """Read-only for this user (mode 0555), or, as root (who may write there anyway), a
    read-only bind mount in a mount namespace of its own."""
    where = tmp_path / "ro"
    where.mkdir()
    out = where / "x.bin"
    if os.geteuid() != 0:
        where.chmod(0o555)
        try:
            res = mrc_tools.run("mrc-recv", "--out", str(out), timeout=20)
        finally:
            where.chmod(0o755)
        assert "Permission denied" in usage_error(res, "mrc-recv")
        return
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only directory")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 99; shift; exec "$@"'
    tool = str(Path(mrc_tools.argv("mrc-recv", [])[0]))
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
        + [str(where), tool, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode == 99:
        pytest.skip(f"cannot mount read-only here: {done.stderr.strip()}")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (
        f"mrc-recv: error: --out {out}: cannot create files in {where}: Read-only file system "
        "(see mrc-recv --help)\n"
    )


# --- addresses --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "says"),
    [
        (
            "mrc-recv",
            ["--discard", "--listen", "4791"],
            "argument --listen: '4791' is a port alone, not an address: write [ADDR]:4791",
        ),
        (
            "mrc-recv",
            ["--discard", "--listen", "::1:4791"],
            "argument --listen: '::1:4791': an IPv6 address with a port needs brackets: "
            "[::1]:4791 (or [::1:4791] if all of it is the address)",
        ),
        (
            "mrc-send",
            ["--size", "1M", "--to", "4791"],
            "argument --to: '4791' is a port alone, not an address: write [ADDR]:4791",
        ),
        (
            "mrc-send",
            ["--size", "1M", "--to", "fd00::2:4791"],
            "argument --to: 'fd00::2:4791': an IPv6 address with a port needs brackets: "
            "[fd00::2]:4791",
        ),
    ],
    ids=["recv-bare-port", "recv-ipv6-port", "send-bare-port", "send-ipv6-port"],
)
def test_addresses_that_read_two_ways_are_refused(
    mrc_tools: MrcTools, tool: str, args: list[str], says: str
) -> None:
    assert usage_error(mrc_tools.run(tool, *args, timeout=20), tool).startswith(
        f"{tool}: error: {says}"
    )


def test_addresses_that_read_one_way_are_taken() -> None:
    from mrc.cli.common import parse_endpoint
    from mrc.wire import DEFAULT_PORT

    assert parse_endpoint("[::1]:4791") == ("::1", 4791)
    assert parse_endpoint("::1") == ("::1", DEFAULT_PORT)
    assert parse_endpoint(":4791") == ("::", 4791)
    assert parse_endpoint("fd00::12") == ("fd00::12", DEFAULT_PORT)  # "fd00:" is no address
    assert parse_endpoint("fd00:0:0:0:0:0:2:4791") == ("fd00:0:0:0:0:0:2:4791", DEFAULT_PORT)
    assert parse_endpoint("fd00::2:ab") == ("fd00::2:ab", DEFAULT_PORT)  # hex: no port
    assert parse_endpoint("10.0.0.1:4791") == ("10.0.0.1", 4791)


def test_from_that_is_not_this_hosts_is_refused(mrc_tools: MrcTools) -> None:
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", "::1", "--from", "fd00:dead::7")
    assert usage_error(res, "mrc-send") == (
        "mrc-send: error: --from fd00:dead::7: not an address of this host (no interface here "
        "has it) (see mrc-send --help)"
    )


def test_from_of_the_other_family_is_refused(mrc_tools: MrcTools) -> None:
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", "[::1]:4791", "--from", "127.0.0.1")
    assert usage_error(res, "mrc-send") == (
        "mrc-send: error: --from 127.0.0.1: an IPv4 address, but --to [::1]:4791 is IPv6: give "
        "--from addresses of --to's family (see mrc-send --help)"
    )


# --- what to send -----------------------------------------------------------------------------


def test_a_directory_to_send_is_refused(mrc_tools: MrcTools, tmp_path: Path) -> None:
    res = mrc_tools.run("mrc-send", str(tmp_path), "--to", "::1", timeout=20)
    assert usage_error(res, "mrc-send") == (
        f"mrc-send: error: FILE {tmp_path}: a directory; mrc-send sends one file (--size or "
        "--time send generated data) (see mrc-send --help)"
    )


def test_a_fifo_to_send_is_refused(mrc_tools: MrcTools, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    res = mrc_tools.run("mrc-send", str(fifo), "--to", "::1", timeout=20)
    assert usage_error(res, "mrc-send") == (
        f"mrc-send: error: FILE {fifo}: not a regular file; mrc-send maps the file it sends "
        "(--size or --time send generated data)"
    )


# --- mistyped options -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "typo", "meant"),
    [
        ("mrc-send", ["--size", "1M", "--too", "::1"], "--too", "--to"),
        ("mrc-send", ["--size", "1M", "--to", "::1", "--form", "::1"], "--form", "--from"),
        ("mrc-send", ["--size", "1M", "--to", "::1", "--jsno"], "--jsno", "--json"),
        ("mrc-recv", ["--discard", "--lisen", "[::1]:4791"], "--lisen", "--listen"),
        ("mrc-recv", ["--ot=x.bin"], "--ot", "--out"),
    ],
)
def test_a_mistyped_option_is_named_with_the_one_meant(
    mrc_tools: MrcTools, tool: str, args: list[str], typo: str, meant: str
) -> None:
    assert usage_error(mrc_tools.run(tool, *args, timeout=20), tool) == (
        f"{tool}: error: unrecognized arguments: {typo} (did you mean {meant}?) (see {tool} --help)"
    )


def test_an_option_like_none_is_named_alone(mrc_tools: MrcTools) -> None:
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", "::1", "--zzzzzz", timeout=20)
    assert usage_error(res, "mrc-send") == (
        "mrc-send: error: unrecognized arguments: --zzzzzz (see mrc-send --help)"
    )


def test_abbreviations_still_work() -> None:
    from mrc.cli.send import build_parser

    args = build_parser().parse_args(["--si", "1M", "--to", "::1", "--js"])
    assert args.size == 1 << 20 and args.json is True


# --- --json always answers --------------------------------------------------------------------


def _failure(res: Result, tool: str, status: int) -> dict[str, Any]:
    """The failure object of a failed --json run: valid, and saying what stderr says."""
    assert res.returncode == status, res.describe()
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.describe()
    obj = res.json
    jsonschema.validate(obj, schema(tool))
    assert set(obj) == {"version", "ok", "role", "error"} and obj["ok"] is False
    assert obj["role"] == tool.removeprefix("mrc-")
    assert obj["error"] in lines[0]
    return obj


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["--size", "1M", "--too", "::1", "--json"], 2, "did you mean --to?"),
        (["--size", "1M", "--to", "::1", "--from", "127.0.0.1", "--js"], 2, "--from 127.0.0.1"),
        (["--size", "1M", "--to", "::1", "--json", "--encrypt"], 2, "--encrypt needs --key-file"),
        (["--size", "1M", "--to", "[::1]:{port}", "--json"], 1, "connection refused"),
    ],
    ids=["argparse", "after-parsing", "in-the-body", "refused"],
)
def test_send_json_answers_every_failure(
    mrc_tools: MrcTools, mrc_port: int, args: list[str], status: int, says: str
) -> None:
    args = [a.replace("{port}", str(mrc_port)) for a in args]
    obj = _failure(mrc_tools.run("mrc-send", *args, timeout=20), "mrc-send", status)
    assert says in str(obj["error"])


def test_a_result_answers_for_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    """A transfer that fails prints its full result (ok false) and then fails the run: no
    second object. Without --json nothing is printed."""
    from mrc.cli.common import JsonAnswer, run_main
    from mrc.errors import MRCError

    answer = JsonAnswer("send", True)

    def body() -> int:
        answer.emit({"ok": False, "role": "send", "error": "BLAKE3 mismatch"})
        raise MRCError("BLAKE3 mismatch")

    assert run_main("mrc-send", body, answer=answer) == 1
    out, err = capsys.readouterr()
    assert [json.loads(line)["error"] for line in out.splitlines()] == ["BLAKE3 mismatch"]
    assert err == "mrc-send: error: BLAKE3 mismatch\n"
    quiet = JsonAnswer("send", False)
    assert run_main("mrc-send", body, answer=quiet) == 1
    assert capsys.readouterr().out.count("{") == 1  # body's emit only, no failure object


def test_a_failure_object_to_a_reader_gone_fails_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from mrc.cli.common import JsonAnswer

    read, write = os.pipe()
    os.close(read)
    gone = os.fdopen(write, "w")
    monkeypatch.setattr("sys.stdout", gone)
    answer = JsonAnswer("recv", True)
    answer.fail("interrupted")  # EPIPE: not raised
    assert answer.answered
    with contextlib.suppress(BrokenPipeError):
        gone.close()


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["--out", "/nonexistent/x.bin", "--json"], 2, "does not exist"),
        (["--discard", "--listen", "::1:4791", "--json"], 2, "needs brackets"),
        (["--discard", "--listen", "[::1]:{port}", "--timeout", "0.3", "--json"], 1, "no sender"),
    ],
    ids=["out-dir", "argparse", "timeout"],
)
def test_recv_json_answers_every_failure(
    mrc_tools: MrcTools, mrc_port: int, args: list[str], status: int, says: str
) -> None:
    args = [a.replace("{port}", str(mrc_port)) for a in args]
    obj = _failure(mrc_tools.run("mrc-recv", *args, timeout=20), "mrc-recv", status)
    assert says in str(obj["error"])


def test_recv_json_answers_when_interrupted(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json")
    recv.wait_listening(mrc_port)
    os.kill(recv.proc.pid, signal.SIGTERM)
    res = recv.wait(20)
    assert res.stderr == "mrc-recv: interrupted\n", res.describe()
    assert res.returncode == 130
    obj = res.json
    jsonschema.validate(obj, schema("mrc-recv"))
    assert obj["ok"] is False and obj["error"] == "interrupted"


def test_without_json_a_failure_prints_nothing_on_stdout(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}", timeout=20)
    assert res.returncode == 1 and res.stdout == "", res.describe()


# --- planes and EVs ---------------------------------------------------------------------------


def test_the_result_line_counts_the_evs_asked_for(mrc_tools: MrcTools, mrc_port: int) -> None:
    """128 EVs asked for, 32 backups beside them: the line says 128."""
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard")
    recv.wait_listening(mrc_port)
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}")
    assert res.returncode == 0, res.describe()
    assert re.search(r"^ok: sent 1\.0 MiB in .* over 128 EVs, ", res.stdout), res.stdout
    assert recv.wait(30).returncode == 0


@pytest.mark.netns
def test_a_two_plane_receiver_and_a_one_plane_sender_are_named(
    two_hosts: TwoHosts, mrc_tools: MrcTools
) -> None:
    h = two_hosts
    port = 4791
    listen = ["--listen", f"[{h.b_addrs[0]}]:{port}", "--listen", f"[{h.b_addrs[1]}]:{port}"]
    for local in ([], ["--from", h.a_addrs[0], "--from", h.a_addrs[1]]):
        recv = mrc_tools.start("mrc-recv", *listen, "--discard", ns=h.b)
        recv.wait_listening(port)
        res = mrc_tools.run(
            "mrc-send", "--size", "1M", "--to", f"[{h.b_addrs[0]}]:{port}", *local, ns=h.a
        )
        assert res.returncode == 0, res.describe()
        assert recv.wait(30).returncode == 0
        if local:
            assert res.stderr == "", res.stderr
            continue
        assert res.stderr == (
            f"mrc-send: warning: the receiver offers 2 planes ([{h.b_addrs[0]}], "
            f"[{h.b_addrs[1]}]); this sender uses 1: give --from once per plane (this host's "
            "address on each) to use them all\n"
        )
        assert " over 128 EVs, " in res.stdout


# --- help -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "groups"),
    [
        ("mrc-send", ["what to send (one of):", "where to:", "transport:", "security:"]),
        ("mrc-recv", ["where to listen:", "where the data goes", "transfers:", "limits"]),
    ],
)
def test_help_is_grouped_with_examples(mrc_tools: MrcTools, tool: str, groups: list[str]) -> None:
    res = mrc_tools.run(tool, "--help", timeout=20)
    assert res.returncode == 0, res.describe()
    for group in [*groups, "output:", "paths:"]:
        assert re.search(rf"^{re.escape(group)}", res.stdout, re.M), group
    examples = res.stdout.split("\nexamples", 1)[1]
    assert examples.count(f"\n  {tool} ") >= 4
    # the cipher as mrc/security uses it: 128-bit keys per connection (AES_KEY_LEN)
    from mrc.security.handshake import AES_KEY_LEN

    assert AES_KEY_LEN == 16 and "AES-128-GCM" in " ".join(res.stdout.split())
    assert "AES-256-GCM under" not in res.stdout
