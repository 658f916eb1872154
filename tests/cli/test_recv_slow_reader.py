"""mrc-recv whose stdout nobody reads yet: its result lines must not stop its transfers.

Seen on an earlier main: a harness that read ``mrc-recv --count 256 --json`` only at the end
filled the 64 KiB pipe with result lines; the receiver then blocked in ``write()`` on its event
loop, every transfer still running stalled, and their senders gave up. Here the pipe holds one
page: the results of 16 small transfers overflow it, and a later sender must still be served.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import threading
from typing import TYPE_CHECKING

from conftest import BIN, wait_listening

if TYPE_CHECKING:
    from conftest import MrcTools

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in the module only from Python 3.10 on Linux


def _read_all(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as f:
        into.append(f.read())


def test_results_nobody_reads_yet_do_not_stall_later_transfers(
    mrc_tools: MrcTools, mrc_port: int
) -> None:
    small, streams = "64K", 16
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    recv = subprocess.Popen(
        [str(BIN / "mrc-recv"), "--listen", f"[::1]:{mrc_port}", "--discard"]
        + ["--count", str(streams + 1), "--json", "--no-progress"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    os.close(write_end)
    got: list[bytes] = []
    try:
        assert wait_listening(recv, mrc_port, timeout=60), "mrc-recv did not start listening"
        first = mrc_tools.run(
            "mrc-send",
            *("--to", f"[::1]:{mrc_port}", "--parallel", str(streams), "--size", small),
            *("--evs", "4", "--json", "--no-progress"),
            timeout=120,
        )
        assert first.returncode == 0, first.describe()
        # the receiver has more result lines than its stdout holds, and nobody has read one
        later = mrc_tools.run(
            "mrc-send",
            *("--to", f"[::1]:{mrc_port}", "--size", "4M", "--evs", "4", "--json"),
            timeout=120,
        )
        assert later.returncode == 0, later.describe()
        assert later.json["ok"] and later.json["digest"] == later.json["digest_receiver"]
        reader = threading.Thread(target=_read_all, args=(read_end, got))
        reader.start()
        assert recv.wait(timeout=60) == 0, recv.stderr.read() if recv.stderr else ""
        reader.join(timeout=60)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
        if recv.stderr is not None:
            recv.stderr.close()
    results = [json.loads(line) for line in got[0].decode().splitlines()]
    assert len(results) == streams + 1
    assert all(r["ok"] and r["digest"] == r["digest_sender"] for r in results)
    assert sorted(r["bytes"] for r in results) == [65536] * streams + [4 << 20]
    assert sum(len(line) + 1 for line in got[0].decode().splitlines()) > 4096
