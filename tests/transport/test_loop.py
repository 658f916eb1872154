"""The event loop: uvloop comes with a plain install, and without it mrc still moves data.

Each case runs in a fresh interpreter, because which loop is used is decided at import; with
``sys.modules["uvloop"] = None`` the import fails as it does where uvloop has no wheel.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

# A WRITE of 1 MiB over loopback through mrc.transport.loop.run(); prints what ran and the hashes.
TRANSFER = """
import sys
if sys.argv[1] == "blocked":
    sys.modules["uvloop"] = None
import asyncio, hashlib, json, os
import mrc
from mrc.transport.loop import loop_name, run

async def main():
    listener = await mrc.listen("::1", 0)
    inbox = bytearray(1 << 20)
    listener.register(inbox, name="inbox")
    conn = await mrc.connect("::1", listener.port, evs=8)
    peer = await listener.accept(timeout=5)
    data = os.urandom(1 << 20)
    await conn.write(data, conn.remote["inbox"], imm=1)
    assert await peer.next_immediate(timeout=10) == 1
    loop = type(asyncio.get_running_loop())
    await conn.close()
    await listener.close()
    return {
        "loop_name": loop_name(),
        "loop_class": loop.__module__ + "." + loop.__name__,
        "sent": hashlib.sha256(data).hexdigest(),
        "placed": hashlib.sha256(inbox).hexdigest(),
    }

print(json.dumps(run(main())))
"""


def _transfer(mode: str) -> dict[str, str]:
    res = subprocess.run(
        [sys.executable, "-c", TRANSFER, mode], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    out: dict[str, str] = json.loads(res.stdout)
    return out


def test_uvloop_is_a_plain_dependency() -> None:
    """`pip install mrc-transport` brings uvloop (where it has wheels), not only an extra."""
    reqs = importlib.metadata.requires("mrc-transport") or []
    uv = [r for r in reqs if r.startswith("uvloop")]
    assert len(uv) == 1 and "extra ==" not in uv[0], reqs


def test_the_default_loop_is_uvloop() -> None:
    pytest.importorskip("uvloop")
    got = _transfer("default")
    assert got["loop_name"] == "uvloop"
    assert got["loop_class"].startswith("uvloop"), got
    assert got["sent"] == got["placed"]


def test_without_uvloop_asyncio_moves_the_data() -> None:
    got = _transfer("blocked")
    assert got["loop_name"] == "asyncio"
    assert got["loop_class"].startswith("asyncio."), got
    assert got["sent"] == got["placed"]
