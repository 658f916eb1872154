"""What a peer without a key can make a listener hold in memory: bounded by a small share of
the machine's memory, never more than the machine has (issue 21, "Memory a stranger controls").

Seen before the budget: each hello could ask for up to 4 GiB (pre-faulted at once) and the
granted total defaulted to 64 GiB on a machine with 24; two hellos of 4 GiB took a receiver from
47 MB to 8.2 GB, and in a 3 GiB memory cgroup two hellos of 2 GiB got it OOM-killed. Here the
factories only note what they were asked for, so no test allocates what it asks for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mrc
from mrc.transport import memory
from mrc.transport.limits import Ledger, LimitError, Limits
from mrc.transport.messages import Hello, RegionRequest

HOST = "::1"


def mem_total() -> int:
    """MemTotal from /proc/meminfo, in bytes (read here, not through the code under test)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no MemTotal")


class Asked:
    """A region_factory that records the sizes it was asked for and makes a token buffer."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, size: int, _request: dict[str, object]) -> bytearray:
        self.sizes.append(size)
        return bytearray(1)


async def hello(port: int, size: int) -> dict[str, object]:
    """Say a keyless hello asking for ``size`` bytes; the listener's answer."""
    import asyncio

    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        line = Hello(1, 0, 9, (HOST,), 4, request=RegionRequest(size, "x")).to_json()
        writer.write(json.dumps(line).encode() + b"\n")
        answer = json.loads(await asyncio.wait_for(reader.readline(), 10))
        assert isinstance(answer, dict)
        return answer
    finally:
        writer.close()


async def test_a_stranger_cannot_ask_for_the_machines_memory() -> None:
    """By default a listener grants in-memory regions up to a quarter of the machine's memory
    at once: a hello asking for half of it is refused before the factory is called, with the
    limit named; one that fits is granted."""
    asked = Asked()
    half = mem_total() // 2
    async with await mrc.listen(
        HOST, 0, mrc.ListenerConfig(region_factory=asked, evs=4)
    ) as listener:
        refused = await hello(listener.port, half)
        assert refused["ok"] is False, refused
        assert str(refused["error"]).startswith(f"cannot grant {half} bytes of memory: 0 of the ")
        assert asked.sizes == []
        budget = listener.limits.max_memory_bytes
        assert budget is not None and budget <= mem_total() // 4
        assert (await hello(listener.port, 1 << 20))["ok"] is True
        assert asked.sizes == [1 << 20]
        assert listener.usage()["refused_memory_bytes"] == 1


async def test_regions_that_are_not_memory_are_not_counted_against_it() -> None:
    """A factory whose regions live elsewhere (mrc-recv's --out: a file's own pages) says so
    with ``region_memory``; its size is then bounded by max_granted_bytes alone."""
    asked = Asked()
    big = mem_total() // 2
    async with await mrc.listen(
        HOST, 0, mrc.ListenerConfig(region_factory=asked, region_memory=lambda _size: 0, evs=4)
    ) as listener:
        assert (await hello(listener.port, big))["ok"] is True
        assert asked.sizes == [big] and listener.usage()["memory_bytes"] == 0
        assert listener.usage()["granted_bytes"] == big


async def test_a_budget_above_the_machines_memory_is_refused() -> None:
    with pytest.raises(mrc.MRCError, match=r"more than this machine's memory"):
        await mrc.listen(HOST, 0, mrc.ListenerConfig(max_memory_bytes=2 * mem_total()))


def test_the_ledger_counts_memory_apart_and_names_the_flag() -> None:
    ledger = Ledger(
        Limits(
            max_granted_bytes=1000,
            max_memory_bytes=100,
            hints=(("memory_bytes", "--max-memory raises it"),),
        )
    )
    a = ledger.admit(80, memory_bytes=80)
    with pytest.raises(LimitError) as info:
        ledger.admit(30, memory_bytes=30)
    assert str(info.value) == (
        "cannot grant 30 bytes of memory: 80 of the 100 bytes of memory this receiver grants "
        "at once are in use (--max-memory raises it)"
    )
    b = ledger.admit(500, memory_bytes=0)  # not memory: only the granted total counts it
    a.release()
    b.release()
    assert ledger.usage()["memory_bytes"] == 0 and ledger.usage()["granted_bytes"] == 0


def fake_root(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> str:
    """A tree of /proc and /sys files as mrc.transport.memory reads them."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       8388608 kB\nMemAvailable:   6291456 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_cgroup_v2_limit_of_an_ancestor_bounds_the_budget(tmp_path: Path) -> None:
    root = fake_root(
        tmp_path,
        "0::/jobs/recv\n",
        "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        {
            "sys/fs/cgroup/jobs/memory.max": f"{3 << 30}\n",
            "sys/fs/cgroup/jobs/recv/memory.max": "max\n",
        },
    )
    assert memory.meminfo(root)["MemTotal"] == 8 << 30
    assert memory.cgroup_limit(root) == 3 << 30
    assert memory.usable_memory(root) == 3 << 30
    assert memory.default_budget(root) == (3 << 30) // 4  # 768 MiB in a 3 GiB cgroup


def test_a_cgroup_v1_limit_and_the_available_memory(tmp_path: Path) -> None:
    unlimited = "9223372036854771712\n"
    root = fake_root(
        tmp_path,
        "5:cpu,cpuacct:/\n4:memory:/box\n0::/\n",
        "31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        {
            "sys/fs/cgroup/memory/memory.limit_in_bytes": unlimited,
            "sys/fs/cgroup/memory/box/memory.limit_in_bytes": unlimited,
        },
    )
    assert memory.cgroup_limit(root) is None  # v1's "no limit" is a huge number
    # no cgroup limit: a quarter of 8 GiB, under half of the 6 GiB available
    assert memory.default_budget(root) == 2 << 30
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 2097152 kB\n")
    assert memory.default_budget(root) == 1 << 30  # a busy machine: half of what is left


def test_without_proc_the_memory_is_unknown(tmp_path: Path) -> None:
    assert memory.usable_memory(str(tmp_path)) is None
    assert memory.default_budget(str(tmp_path)) is None
