"""``--scheduling``: mrc-send and mrc-recv run every thread under SCHED_BATCH unless told
``normal`` (docs/PERFORMANCE.md, "A woken thread waits its turn"); a kernel that refuses
gets one warning line and the transfer goes on."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import MrcTools

_POLICY = {os.SCHED_BATCH: "batch", os.SCHED_OTHER: "normal"}


def _policies(pid: int) -> set[str]:
    """The policy of every thread of process ``pid``, by name."""
    return {
        _POLICY.get(os.sched_getscheduler(int(tid)), "other")
        for tid in os.listdir(f"/proc/{pid}/task")
    }


def _child(body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter (run_command also sets the collector, which this
    process must keep)."""
    return subprocess.run(
        [sys.executable, "-c", body], capture_output=True, text=True, timeout=60, check=False
    )


_BODY = (
    "import asyncio, json, os\n"
    "from mrc.cli.common import run_command\n"
    "async def body():\n"
    "    worker = await asyncio.to_thread(os.sched_getscheduler, 0)\n"
    "    print(json.dumps([os.sched_getscheduler(0), worker]))\n"
    "    return 3\n"
)


@pytest.mark.parametrize(
    ("scheduling", "policy"), [("batch", "SCHED_BATCH"), ("normal", "SCHED_OTHER")]
)
def test_a_command_and_the_threads_it_starts_run_under_its_policy(
    scheduling: str, policy: str
) -> None:
    done = _child(_BODY + f"raise SystemExit(run_command('prog', body(), None, {scheduling!r}))\n")
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout) == [getattr(os, policy)] * 2
    assert done.stderr == ""


def test_a_refused_policy_is_one_warning_and_the_command_runs() -> None:
    refuse = (
        "def refuse(*_args):\n"
        "    raise PermissionError(1, 'Operation not permitted')\n"
        "os.sched_setscheduler = refuse\n"
    )
    done = _child(_BODY + refuse + "raise SystemExit(run_command('prog', body()))\n")
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout) == [os.SCHED_OTHER] * 2  # as inherited
    assert done.stderr.splitlines() == [
        "prog: warning: scheduling policy batch refused (Operation not permitted); "
        "running under the one inherited"
    ]


def test_a_transfer_runs_under_sched_batch_by_default(
    mrc_tools: MrcTools, mrc_port: int, tmp_path: Path
) -> None:
    data = os.urandom((1 << 20) + 11)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(dst))
    recv.wait_listening(mrc_port)
    assert _policies(recv.proc.pid) == {"batch"}
    sent = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}", "--no-progress")
    got = recv.wait(30)
    assert sent.returncode == 0, sent.describe()
    assert got.returncode == 0, got.describe()
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_normal_leaves_the_policy_as_it_was(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--scheduling", "normal"
    )
    recv.wait_listening(mrc_port)
    assert _policies(recv.proc.pid) == {"normal"}


def test_an_unknown_policy_is_a_usage_error(mrc_tools: MrcTools) -> None:
    done = mrc_tools.run("mrc-send", "--size", "1M", "--to", "[::1]:1", "--scheduling", "fifo")
    assert done.returncode == 2
    assert "argument --scheduling: invalid choice: 'fifo'" in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2  # usage line and the error
