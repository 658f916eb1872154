"""mrc-send -> mrc-recv as real processes on loopback, verified end to end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from digests import expected_digest

if TYPE_CHECKING:
    from conftest import MrcTools

MiB = 1 << 20


def check_pair(send: dict[str, Any], recv: dict[str, Any], size: int) -> None:
    """Both sides agree the transfer of ``size`` bytes was verified."""
    assert send["ok"] is True and recv["ok"] is True
    assert send["bytes"] == size and recv["bytes"] == size
    assert send["checksum"] == recv["checksum"] == "blake3"  # what both take by default
    assert send["digest"] == send["digest_receiver"] == recv["digest"] == recv["digest_sender"]
    assert recv["bytes_placed"] == size
    assert recv["error"] is None
    assert recv["dropped_by_reason"] == {}


def check_spray(send: dict[str, Any], evs: int, min_used: int) -> None:
    """At least ``min_used`` EVs carried data and none more than 3x its fair share (plus two
    bursts)."""
    rows = send["evs"]
    counts = [e["packets"] for e in rows]
    # ``evs`` active EVs, then the backup pool that replaces EVs found bad
    assert len(counts) >= evs
    assert [e["state"] for e in rows[evs:]] == ["GOOD (backup)"] * (len(rows) - evs)
    assert len({e["value"] for e in rows}) == len(rows)  # every EV has a 32-bit value of its own
    used = [c for c in counts if c]
    # a round of the spray gives each EV one burst: fewer bursts than EVs use fewer EVs
    assert len(used) >= min(min_used, send["bursts"]), (counts, send["bursts"])
    fair = sum(counts) / evs
    # an EV takes a whole burst at a time (NSCC sizes them; 1 packet while spraying singly)
    burst = send["data_packets"] / send["bursts"]
    assert 1 <= burst <= 16
    assert max(counts) <= 3 * fair + 2 * burst, (max(counts), fair, burst)
    assert sum(counts) >= send["data_packets"]


def transfer(
    mrc_tools: MrcTools, port: int, recv_args: list[str], send_args: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{port}", "--json", *recv_args)
    recv.wait_listening(port)
    send = mrc_tools.run("mrc-send", "--to", f"[::1]:{port}", "--json", *send_args)
    r = recv.wait(30)
    assert send.returncode == 0, send.describe()
    assert r.returncode == 0, r.describe()
    assert "Traceback" not in send.stderr + r.stderr
    return send.json, r.json


def test_64mib_sprayed_over_128_evs_into_a_file(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    size = 64 * MiB
    out = tmp_path / "out.bin"
    send, recv = transfer(
        mrc_tools, mrc_port, ["--out", str(out)], ["--size", "64M", "--payload", "8192"]
    )
    check_pair(send, recv, size)
    assert out.stat().st_size == size
    assert not (tmp_path / "out.bin.part").exists()
    assert expected_digest(out.read_bytes(), send["checksum"]) == send["digest"]
    assert recv["out"] == str(out)
    assert send["payload"] == 8192 and send["planes"] == 1
    # + the zero-length DONE WRITE_IMM, and a MARK_IMM after each of the first three 16 MiB
    # (the receiver hashes what they mark while the rest arrives)
    assert send["data_packets"] == size // 8192 + 1 + 3
    assert recv["packets_received"] >= send["data_packets"]
    check_spray(send, evs=128, min_used=64)


@pytest.mark.parametrize(
    "size",
    [0, 1, 8192, 3 * MiB + 4321],
    ids=["empty", "one-byte", "one-payload", "not-a-multiple"],
)
def test_file_transfer(mrc_tools: MrcTools, mrc_port: int, tmp_path: Path, size: int) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(size))
    out = tmp_path / "sub" / "copy.bin"
    out.parent.mkdir()
    send, recv = transfer(
        mrc_tools, mrc_port, ["--out", str(out)], [str(src), "--payload", "8192", "--evs", "32"]
    )
    check_pair(send, recv, size)
    assert send["source"] == str(src)
    assert send["digest"] == expected_digest(src.read_bytes(), send["checksum"])
    assert out.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["copy.bin"]  # no .part left
    assert send["data_packets"] == -(-size // 8192) + 1


def test_size_not_a_multiple_of_the_payload_default_payload(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    """Loopback's MTU (65,536) leaves room for the largest default payload, 8 KiB (it was
    1400 bytes, whatever the path: six times the packets and the per-packet work)."""
    size = 8192 * 197 + 13
    send, recv = transfer(mrc_tools, mrc_port, ["--discard"], ["--size", str(size)])
    check_pair(send, recv, size)
    assert recv["out"] is None
    assert send["payload"] == 8192
    assert send["data_packets"] == 198 + 1
    check_spray(send, evs=128, min_used=128)


def test_count_two_transfers_numbered_files(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    srcs = []
    for i, size in enumerate((100_000, 250_001)):
        p = tmp_path / f"src{i}"
        p.write_bytes(os.urandom(size))
        srcs.append(p)
    recv = mrc_tools.start(
        "mrc-recv",
        "--listen",
        f"[::1]:{mrc_port}",
        "--json",
        "--count",
        "2",
        "--out",
        str(tmp_path / "got{n}.bin"),
    )
    recv.wait_listening(mrc_port)
    for p in srcs:
        res = mrc_tools.run("mrc-send", str(p), "--to", f"[::1]:{mrc_port}", "--json")
        assert res.returncode == 0, res.describe()
    r = recv.wait(30)
    assert r.returncode == 0, r.describe()
    assert [o["ok"] for o in r.objects] == [True, True]
    assert (tmp_path / "got1.bin").read_bytes() == srcs[0].read_bytes()
    assert (tmp_path / "got2.bin").read_bytes() == srcs[1].read_bytes()
