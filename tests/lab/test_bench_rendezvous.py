"""A launched mrc-bench's rendezvous: launcher variables, plane discovery, rank 0's hellos.

The hello tests use real TCP connections on loopback to rank 0's real control listener, and
send what a stranger or a confused rank would: garbage, wrong tokens, impossible ranks,
duplicates. Each is refused and counted, and the real ranks still get in.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mrc.errors import UsageError
from mrc.lab.bench import launched
from mrc.lab.bench.planes import find, from_addrs, from_nics, local_ipv6
from mrc.lab.bench.rendezvous import DEFAULT_PORT, Rendezvous, detect, from_env, from_slurm

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
def test_bad_launcher_variables_are_one_line_usage_errors(env: dict, words: str) -> None:
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


def _hello(rank: object, world: object = 3, token: str = "secret", **kw: object) -> bytes:
    msg = {"hello": 1, "rank": rank, "world": world, "token": token, "name": f"r{rank}"}
    msg.update({"addrs": ["fd00::2"], "mtus": [1500], "net_admin": False, **kw})
    return (json.dumps(msg) + "\n").encode()


async def _say(port: int, data: bytes) -> dict | None:
    reader, writer = await asyncio.open_connection("::1", port)
    writer.write(data)
    if not data.endswith(b"\n"):
        writer.write_eof()
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return json.loads(line) if line else None


def test_rank0_refuses_forged_and_confused_hellos_and_admits_the_ranks(monkeypatch) -> None:
    monkeypatch.setattr(launched, "HELLO_TIMEOUT", 0.5)

    async def main() -> tuple[list[dict | None], launched.Gathering]:
        gathering = launched.Gathering(Rendezvous("env", 0, 3), "secret")
        port = await gathering.open(0)
        answers = []
        for data in (
            b"GET / HTTP/1.0\r\n\r\n",  # not JSON
            b"[1, 2, 3]\n",  # JSON, not a hello
            b'{"hello": 2}\n',  # another protocol's version
            _hello(1, token="guess"),
            _hello(1, world=4),
            _hello(0),  # rank 0 is the listener itself
            _hello(7),
            _hello("1"),
            _hello(1, addrs=[]),
            b"",  # connects, says nothing: timed out
        ):
            answers.append(await _say(port, data))
        assert not gathering.all_here.is_set()
        answers.append(await _say(port, _hello(1)))
        answers.append(await _say(port, _hello(1)))  # the same rank twice
        answers.append(await _say(port, _hello(2)))
        await gathering.wait(5)
        await gathering.close()
        return answers, gathering

    answers, gathering = asyncio.run(main())
    refusals = answers[:10] + [answers[11]]
    assert all(a is None or a["ok"] is False for a in refusals), refusals
    assert answers[10] == {"ok": True} and answers[12] == {"ok": True}
    assert sorted(gathering.links) == [1, 2]
    assert len(gathering.refused) == 11
    joined = " | ".join(gathering.refused)
    for words in ("wrong job token", "counts 4 ranks", "no rank 0", "no rank 7", "rank 1 twice"):
        assert words in joined, joined


def test_rank0_names_the_ranks_that_never_came(monkeypatch) -> None:
    async def main() -> None:
        gathering = launched.Gathering(Rendezvous("env", 0, 4), "")
        port = await gathering.open(0)
        await _say(port, _hello(2, world=4, token=""))
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
    ],
)
def test_launched_usage_errors_are_one_line_exit_2(argv: list[str], env: dict, words: str) -> None:
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
