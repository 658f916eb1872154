"""``--checksum`` on mrc-send (what it offers) and mrc-recv (what it takes), on loopback: the
JSON of both names the checksum the two agreed on and carries its digest of the data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from digests import expected_digest

if TYPE_CHECKING:
    from conftest import MrcTools


def test_both_sides_verify_with_the_checksum_they_name(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    data = os.urandom(3 * (1 << 20) + 7)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json", "--checksum", "xxh3-128"
    )
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run(
        "mrc-send", str(src), "--to", f"[::1]:{mrc_port}", "--json", "--checksum", "xxh3-128"
    )
    got = recv.wait(30)
    assert sent.returncode == 0, sent.describe()
    assert got.returncode == 0, got.describe()
    out, rcv = sent.json, got.json
    assert out["ok"] and rcv["ok"] and out["bytes"] == rcv["bytes"] == len(data)
    assert out["checksum"] == rcv["checksum"] == "xxh3-128"
    digest = expected_digest(data, "xxh3-128")
    assert out["digest"] == out["digest_receiver"] == rcv["digest"] == rcv["digest_sender"]
    assert out["digest"] == digest


def test_the_text_line_names_the_checksum(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    data = os.urandom(100_000)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard")
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}", "--no-progress")
    got = recv.wait(30)
    assert sent.returncode == 0, sent.describe()
    assert got.returncode == 0, got.describe()
    short = expected_digest(data, "blake3")[:16]  # the default, unkeyed without --key-file
    assert f"; blake3 {short}..." in sent.stdout
    assert f"; blake3 {short}... verified" in got.stdout


def test_no_checksum_in_common_fails_the_sender_in_one_line(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--checksum", "blake3"
    )
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run(
        "mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}", "--checksum", "xxh3-128"
    )
    assert sent.returncode == 1, sent.describe()
    assert sent.stdout == ""
    assert sent.stderr.count("\n") == 1, sent.stderr
    assert sent.stderr.startswith("mrc-send: error: ")
    assert sent.stderr.rstrip().endswith(
        "no end-to-end checksum in common: the sender offers xxh3-128, this receiver takes blake3"
    )


@pytest.mark.parametrize("tool", ["mrc-send", "mrc-recv"])
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("md5", "--checksum: 'md5' is not a checksum mrc knows (blake3, xxh3-128, sha256)"),
        ("blake3,blake3", "--checksum: 'blake3,blake3' names a checksum twice"),
        (",", "--checksum: name at least one checksum"),
    ],
)
def test_a_checksum_mrc_does_not_know_is_a_one_line_usage_error(
    mrc_tools: MrcTools, tool: str, value: str, says: str
) -> None:
    where = ["--size", "1M", "--to", "[::1]:9"] if tool == "mrc-send" else ["--discard"]
    res = mrc_tools.run(tool, *where, f"--checksum={value}")
    assert res.returncode == 2, res.describe()
    assert res.stdout == ""
    assert res.stderr == f"{tool}: error: argument {says} (see {tool} --help)\n"
