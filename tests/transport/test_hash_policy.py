"""Hash steps give their core way (mrc.app.hashpolicy): where a command allows it, each piece
of a step runs under SCHED_IDLE unless its digest has been awaited for GRACE seconds or the
hash lags LAG bytes; the worker's own policy is back when the step ends; the digests are
those of the data; and a process that could not leave SCHED_IDLE never enters it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from digests import expected_digest
from nobody import NOBODY, why_nobody_cannot_run_mrc

from mrc.app import checksum, hashpolicy
from mrc.app.checksum import PIECE, Checksum, PrefixHasher
from mrc.app.stream import BufferSource, StreamHasher

pytestmark = pytest.mark.skipif(
    not hashpolicy.can_leave_idle(), reason="needs root or CAP_SYS_NICE to leave SCHED_IDLE"
)


class Recording:
    """A BLAKE3 hash object that notes its thread's policy at each update."""

    def __init__(self) -> None:
        self._hash = Checksum("blake3").new()
        self.policies: list[int] = []

    def update(self, data: memoryview | bytes, /) -> object:
        self.policies.append(os.sched_getscheduler(0))
        return self._hash.update(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def copy(self) -> Recording:
        return self  # (StreamHasher copies for each digest; the record is what counts)


@pytest.fixture
def allowed() -> Iterator[None]:
    assert hashpolicy.allow(True)
    yield
    hashpolicy.allow(False)


def _data(n: int) -> bytes:
    return os.urandom(n)


async def _worker_policy() -> int:
    return await asyncio.to_thread(os.sched_getscheduler, 0)


async def test_pieces_give_way_and_the_worker_gets_its_policy_back(allowed: None) -> None:
    data = _data(3 * PIECE + 5)
    rec = Recording()
    prefix = PrefixHasher(memoryview(data), rec)
    assert await prefix.digest() == expected_digest(data, "blake3")
    assert rec.policies == [os.SCHED_IDLE] * 4  # within GRACE of the digest being awaited
    assert await _worker_policy() == os.SCHED_OTHER


async def test_an_overdue_digest_stops_the_giving_way(
    allowed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hashpolicy, "GRACE", 0.0)
    data = _data(2 * PIECE)
    rec = Recording()
    prefix = PrefixHasher(memoryview(data), rec)
    assert await prefix.digest() == expected_digest(data, "blake3")
    assert rec.policies == [os.SCHED_OTHER] * 2


async def test_a_lagging_hash_stops_giving_way(
    allowed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handed more than LAG bytes at once (the digest never overdue): the pieces more than
    LAG behind the end run under the worker's own policy, the rest give way."""
    monkeypatch.setattr(hashpolicy, "LAG", 2 * PIECE)
    monkeypatch.setattr(hashpolicy, "GRACE", 1e9)
    data = _data(4 * PIECE)
    rec = Recording()
    prefix = PrefixHasher(memoryview(data), rec)
    assert await prefix.digest() == expected_digest(data, "blake3")
    assert rec.policies == [os.SCHED_OTHER, os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_IDLE]


async def test_the_sender_s_hash_gives_way_too(allowed: None) -> None:
    data = _data(2 * PIECE + 1)

    class Check(Checksum):
        def new(self) -> checksum.Hasher:
            return rec

    rec = Recording()
    hasher = StreamHasher(BufferSource(memoryview(data)), Check("blake3"))
    assert await hasher.digest() == expected_digest(data, "blake3")
    assert rec.policies == [os.SCHED_IDLE] * 3
    assert await _worker_policy() == os.SCHED_OTHER


async def test_not_allowed_nothing_changes() -> None:
    assert not hashpolicy.allowed()
    data = _data(2 * PIECE)
    rec = Recording()
    prefix = PrefixHasher(memoryview(data), rec)
    assert await prefix.digest() == expected_digest(data, "blake3")
    assert rec.policies == [os.SCHED_OTHER]  # one update, as before


def test_a_command_allows_it_under_batch_only() -> None:
    code = (
        "import sys\n"
        "from mrc.app import hashpolicy\n"
        "from mrc.cli.common import run_command\n"
        "async def body():\n"
        "    print(hashpolicy.allowed())\n"
        "    return 0\n"
        "raise SystemExit(run_command('prog', body(), None, sys.argv[1]))\n"
    )
    for scheduling, shown in (("batch", "True"), ("normal", "False")):
        done = subprocess.run(
            [sys.executable, "-c", code, scheduling],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == shown


def test_a_process_that_could_not_leave_idle_never_enters_it() -> None:
    why = why_nobody_cannot_run_mrc()
    if why is not None:
        pytest.skip(why)
    code = (
        "import resource\n"
        "from mrc.app import hashpolicy\n"
        "print(hashpolicy.can_leave_idle(), hashpolicy.allow(True), hashpolicy.allowed())\n"
    )
    done = subprocess.run(
        ["prlimit", "--nice=0:0", *NOBODY, sys.executable, "-c", code],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]
