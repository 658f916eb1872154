#!/usr/bin/env python3
"""One SHA-256 over every datagram the seeded simulator carries, for a refactor's "no behaviour
change" (issue 41: seeded simulations produce identical datagrams before and after).

Why: a refactor of the sans-IO core (the requester's timers moved into recovery, say) must not
change a single decision. Every datagram a QP hands the simulated wire, with its virtual send
time, EV (32 bits: source port and flow label) and destination, is hashed in order while the
simulator tools run their quick scenarios (tools/sim_cc.py and tools/sim_alltoall.py, fixed
seeds). Run it before and after the change: the digests must be equal. A difference names the
scenario where it first appears.

  .venv/bin/python tools/sim_digest.py            # prints one digest per scenario, then all
  .venv/bin/python tools/sim_digest.py --json
  .venv/bin/python tools/sim_digest.py --backups 0   # QPs without backup EVs (before issue 39)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim_alltoall  # noqa: E402
import sim_cc  # noqa: E402

from mrc.cli.common import emit_json, int_at_least  # noqa: E402
from mrc.lab.sim import SimNetwork  # noqa: E402
from mrc.lab.sim_secrets import seeded_secrets  # noqa: E402

ALLTOALL = ["--steps", "3", "--size", "262144", "--fail-at", "0.02"]

#: (name, tool, arguments): each runs one tool's seeded scenarios quietly
SCENARIOS: list[tuple[str, Callable[[list[str]], int], list[str]]] = [
    ("cc-incast7", sim_cc.main, ["--quick", "--scenarios", "incast7", "--json"]),
    ("cc-fair2", sim_cc.main, ["--quick", "--scenarios", "fair2", "--json"]),
    ("cc-link_down", sim_cc.main, ["--quick", "--scenarios", "link_down", "--json"]),
    ("cc-untold50", sim_cc.main, ["--quick", "--scenarios", "untold50", "--json"]),
    ("cc-incast7-full", sim_cc.main, ["--scenarios", "incast7", "--json"]),
    ("cc-link_down-full", sim_cc.main, ["--scenarios", "link_down", "--json"]),
    ("alltoall-fail", sim_alltoall.main, ALLTOALL),
]


@contextlib.contextmanager
def hashing(h: hashlib._Hash) -> Iterator[None]:
    """Feed every datagram ``SimNetwork._transmit`` sees into ``h`` while inside, with the
    core's secrets drawn from a seeded generator."""
    original = SimNetwork._transmit

    def transmit(self: SimNetwork, data: bytes, ev: int, dst: str) -> None:
        h.update(struct.pack("!dI", self.now, ev))
        h.update(dst.encode())
        h.update(struct.pack("!I", len(data)))
        h.update(data)
        original(self, data, ev, dst)

    SimNetwork._transmit = transmit  # type: ignore[method-assign]
    try:
        with seeded_secrets(1):
            yield
    finally:
        SimNetwork._transmit = original  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.add_argument(
        "--backups",
        type=int_at_least(0),
        help="backup EVs per QP, passed to every tool (default: theirs, as the transport)",
    )
    args = p.parse_args(argv)
    extra = [] if args.backups is None else ["--backups", str(args.backups)]
    total = hashlib.sha256()
    out: dict[str, str] = {}
    for name, tool, tool_args in SCENARIOS:
        h = hashlib.sha256()
        quiet = io.StringIO()
        with hashing(h), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            tool([*tool_args, *extra])
        out[name] = h.hexdigest()
        total.update(h.digest())
        if not args.json:
            print(f"{name:16} {out[name]}", flush=True)
    out["all"] = total.hexdigest()
    if args.json:
        emit_json(dict(out))
    else:
        print(f"{'all':16} {out['all']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
