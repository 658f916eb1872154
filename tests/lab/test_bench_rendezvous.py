"""A launched mrc-bench's rendezvous: launcher variables, plane discovery, rank 0's hellos.

The hello tests use real TCP connections on loopback to rank 0's real control listener, and
send what a stranger or a confused rank would: garbage, wrong tokens, impossible ranks,
duplicates. Each is refused and counted, and the real ranks still get in.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mrc.errors import UsageError
from mrc.lab.bench import launched
from mrc.lab.bench.planes import find, from_addrs, from_nics, local_ipv6
from mrc.lab.bench.rendezvous import (
    DEFAULT_PORT,
    RANK,
    RANK0,
    Rendezvous,
    detect,
    from_env,
    from_slurm,
    listen_addrs,
    proof,
    proves,
)

BIN = Path(sys.executable).parent

IF_INET6 = """\
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 80     eth1
fd000000000000000000000000000003 04 40 00 c0     eth1
fd010000000000000000000000000002 05 40 00 80     eth2
fe8000000000000000fc00fffe000001 04 40 20 80     eth1
fd020000000000000000000000000002 06 40 00 40     eth3
"""


@pytest.fixture
def inet6(tmp_path: Path) -> str:
    p = tmp_path / "if_inet6"
    p.write_text(IF_INET6)
    return str(p)


# ---- launcher variables ---------------------------------------------------------------------


def test_torchrun_variables_give_rank_world_and_rank0() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "[fd00::1]", "MASTER_PORT": "29600"}
    rv = from_env(env)
    assert (rv.launcher, rv.rank, rv.world) == ("env", 2, 4)
    assert rv.coordinator == [("fd00::1", 29600)] and rv.listen_port == 29600


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"WORLD_SIZE": "4", "MASTER_ADDR": "h"}, "RANK is not set"),
        ({"RANK": "x", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}, "not a number"),
        ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}, "not below the world size"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h"}, "at least 2 ranks"),
        ({"RANK": "-1", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}, "negative"),
        ({"RANK": "0", "WORLD_SIZE": "4"}, "MASTER_ADDR is not set"),
        ({"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "port"),
    ],
)
def test_bad_launcher_variables_are_one_line_usage_errors(env: dict[str, str], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        from_env(env)


def test_slurm_ranks_with_a_given_master_and_the_default_port() -> None:
    rv = from_slurm({"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "MASTER_ADDR": "node01"})
    assert (rv.rank, rv.world, rv.coordinator) == (1, 3, [("node01", DEFAULT_PORT)])


def test_slurm_without_scontrol_or_master_says_what_is_missing() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[01-02]"}
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        from_slurm(env)  # no scontrol on this machine, so no first node to fall back on


def test_auto_detects_the_launcher_from_its_variables() -> None:
    assert detect({"PMI_RANK": "0"}) == "mpi"
    assert detect({"OMPI_COMM_WORLD_RANK": "0"}) == "mpi"
    assert detect({"SLURM_PROCID": "0"}) == "slurm"
    assert detect({"RANK": "0"}) == "env"
    with pytest.raises(UsageError, match="no launcher found"):
        detect({})


def test_rank0_listens_on_the_family_and_address_master_addr_names() -> None:
    """An address literal is bound as it is, in its own family (an IPv4 MASTER_ADDR once got
    a v6-only socket on [::]); a name only tells the families, whose wildcards are bound."""
    v4, v6 = int(socket.AF_INET), int(socket.AF_INET6)
    assert listen_addrs(["127.0.0.1"]) == [(v4, "127.0.0.1", True)]
    assert listen_addrs(["fd00::2", "fd01::2"]) == [(v6, "fd00::2", True), (v6, "fd01::2", True)]
    assert listen_addrs(["0.0.0.0", "127.0.0.1"]) == [(v4, "0.0.0.0", False)]
    assert listen_addrs(["localhost"]) and all(
        addr in ("0.0.0.0", "::") and not exact for _, addr, exact in listen_addrs(["localhost"])
    )


# ---- plane addresses ------------------------------------------------------------------------


def test_nics_give_their_first_usable_global_address(inet6: str) -> None:
    # ::1 is host scope, fe80:: link scope, fd00::3 and eth3's only address still tentative
    assert local_ipv6(inet6) == {"eth1": ["fd00::2"], "eth2": ["fd01::2"]}
    planes = from_nics(["eth2", "eth1"], inet6)
    assert planes.addrs == ("fd01::2", "fd00::2") and planes.nics == ("eth2", "eth1")
    with pytest.raises(UsageError, match="eth3 has no global IPv6 address"):
        from_nics(["eth1", "eth3"], inet6)  # its only address is tentative


def test_addrs_must_be_this_hosts(inet6: str) -> None:
    planes = from_addrs(["[fd00::2]", "fd01:0::2"], inet6)
    assert planes.addrs == ("fd00::2", "fd01::2") and planes.nics == ("eth1", "eth2")
    with pytest.raises(UsageError, match="not an address of this host"):
        from_addrs(["fd00::9"], inet6)
    with pytest.raises(UsageError, match="not an IP address"):
        from_addrs(["eth1"], inet6)


def test_exactly_one_way_to_find_the_planes() -> None:
    with pytest.raises(UsageError, match="exactly one of"):
        find(None, None, None)
    with pytest.raises(UsageError, match="--nics and --addrs"):
        find(["eth1"], ["fd00::2"], None)


def test_net_admin_is_read_from_the_effective_capabilities(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000001000\n")
    assert launched.has_net_admin(str(status))
    status.write_text("Name:\tx\nCapEff:\t0000000000000400\n")
    assert not launched.has_net_admin(str(status))
    assert not launched.has_net_admin(str(tmp_path / "missing"))


# ---- rank 0's hellos -----------------------------------------------------------------------


def _line(obj: object) -> bytes:
    return (json.dumps(obj) + "\n").encode()


async def _hello(
    port: int,
    rank: object,
    world: object = 3,
    token: str = "secret",
    raw: bytes | None = None,
    rank0_token: str = "secret",
    **body: object,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A rank's hello, as the protocol has it (or ``raw`` bytes instead of its first line):
    rank 0's challenge, and its answer to the rest of the hello (None when it never came).
    The challenge's proof is checked here, so every admitted rank saw rank 0 prove the token."""
    reader, writer = await asyncio.open_connection("::1", port)
    nonce = secrets.token_hex(16)
    writer.write(
        raw
        if raw is not None
        else _line({"hello": 2, "rank": rank, "world": world, "nonce": nonce})
    )
    if raw == b"":
        writer.write_eof()
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 5)
    challenge = json.loads(line) if line else None
    answer = None
    if challenge and challenge["ok"]:
        assert isinstance(rank, int)
        if rank0_token:
            assert proves(rank0_token, challenge["proof"], RANK0, nonce, challenge["nonce"], rank)
        mine = {"name": f"r{rank}", "addrs": ["fd00::2"], "mtus": [1500], "net_admin": False}
        mine |= {"pid": 1, "proof": proof(token, RANK, challenge["nonce"], nonce, rank), **body}
        writer.write(_line(mine))
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5)
        answer = json.loads(line) if line else None
    writer.close()
    return challenge, answer


def test_rank0_refuses_forged_and_confused_hellos_and_admits_the_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launched, "HELLO_TIMEOUT", 0.5)

    async def main() -> tuple[
        list[tuple[dict[str, Any] | None, dict[str, Any] | None]], launched.Gathering
    ]:
        gathering = launched.Gathering(Rendezvous("env", 0, 3), "secret")
        port = await gathering.open(0)
        answers = []
        for rank, kw in (
            (1, {"raw": b"GET / HTTP/1.0\r\n\r\n"}),  # not JSON
            (1, {"raw": b"[1, 2, 3]\n"}),  # JSON, not a hello
            (1, {"raw": _line({"hello": 1, "rank": 1, "world": 3, "token": "secret"})}),  # v1
            (1, {"token": "guess"}),
            (1, {"world": 4}),
            (0, {}),  # rank 0 is the listener itself
            (7, {}),
            ("1", {}),
            (True, {}),  # a boolean is not rank 1
            (1, {"addrs": []}),
            (1, {"raw": b""}),  # connects, says nothing
        ):
            answers.append(await _hello(port, rank, **kw))
        assert not gathering.all_here.is_set()
        answers.append(await _hello(port, 1))
        answers.append(await _hello(port, 1))  # the same rank twice
        answers.append(await _hello(port, 2))
        await gathering.wait(5)
        await gathering.close()
        return answers, gathering

    answers, gathering = asyncio.run(main())
    refusals = answers[:11] + [answers[12]]
    for challenge, answer in refusals:  # refused at the challenge or at the answer
        assert (challenge is None or challenge["ok"] is False) or (
            answer is not None and answer["ok"] is False
        )
    assert answers[11][1] == {"ok": True} and answers[13][1] == {"ok": True}
    assert sorted(gathering.links) == [1, 2]
    assert gathering.links[1].hello["name"] == "r1" and "proof" not in gathering.links[1].hello
    assert gathering.refused == 12
    joined = " | ".join(gathering.refusals.reasons)
    for words in (
        "not a JSON line",
        "not an mrc-bench hello of protocol 2 (it speaks 1)",
        "wrong job token",
        "counts 4 ranks",
        "no rank 0",
        "no rank 7",
        'rank must be an integer, not "1"',
        "rank must be an integer, not true",
        "addrs must have 1..16 items, not 0",
        "rank 1 twice",
    ):
        assert words in joined, joined


def test_rank0_names_the_ranks_that_never_came(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        gathering = launched.Gathering(Rendezvous("env", 0, 4), "")
        port = await gathering.open(0)
        _, answer = await _hello(port, 2, world=4, token="", rank0_token="")
        assert answer == {"ok": True}
        try:
            await gathering.wait(0.3)
        finally:
            await gathering.close()

    with pytest.raises(Exception, match="ranks 1, 3 did not reach rank 0"):
        asyncio.run(main())


# ---- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "words"),
    [
        (["--launcher", "env", "--hosts", "8"], {}, "--hosts does not apply to a launched run"),
        (["--nics", "eth1"], {}, "--nics is for a launched run"),
        (["--launcher", "env", "--conditions", "lossy"], {}, "lossy need mrc-bench's own fabric"),
        (["--launcher", "env", "--fault-cmd", "true"], {}, "go together"),
        (["--launcher", "env", "--conditions", "link_down"], {}, "needs --fault-cmd"),
        (["--launcher", "env", "--nics", "lo"], {}, "RANK is not set"),
        (
            ["--launcher", "env", "--nics", "nosuch0", "--fault-rank", "1"],
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "::1"},
            "nosuch0 has no global IPv6 address",
        ),
        (
            ["--launcher", "env", "--nics", "lo", "--fault-rank", "5"],
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "::1"},
            "--fault-rank 5: there are only 2 ranks",
        ),
        (  # anyone who reached the control port could run them: a token is a must
            ["--launcher", "env", "--nics", "lo", "--fault-cmd", "true", "--heal-cmd", "true"],
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "::1"},
            "--fault-cmd and --heal-cmd need MRC_BENCH_TOKEN",
        ),
        (
            ["--launcher", "slurm", "--nics", "lo", "--fault-cmd", "true", "--heal-cmd", "true"],
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "::1"},
            "--fault-cmd and --heal-cmd need MRC_BENCH_TOKEN",
        ),
        (  # with the token the commands are fine (the plane NIC is what is wrong here)
            ["--launcher", "env", "--nics", "nosuch0", "--fault-cmd", "true", "--heal-cmd", "x"],
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "::1", "MRC_BENCH_TOKEN": "s"},
            "nosuch0 has no global IPv6 address",
        ),
        (
            ["--launcher", "env", "--nics", "lo", *["--qp", "ack_every=2"] * 62],
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "::1"},
            "a launched run takes at most 61 --qp settings",
        ),
    ],
)
def test_launched_usage_errors_are_one_line_exit_2(
    argv: list[str], env: dict[str, str], words: str
) -> None:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    proc = subprocess.run(
        [str(BIN / "mrc-bench"), *argv],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("mrc-bench: error: "), proc.stderr
    assert words in lines[0], lines[0]
    assert proc.stdout == ""
