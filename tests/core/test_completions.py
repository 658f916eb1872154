"""Per-request completions: every posted WRITE ends with a status, as a verbs work completion.

Before, a failed QP failed every pending write with the same error: all-or-nothing. Now the
core emits a WriteFailed per work request not completed, in posting order, before QPFailed:
the one whose packet made the QP fail carries the cause (remote access error, retry exceeded,
remote operation error), every other one is FLUSHED. Seeded simulator runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from mrc.core import (
    MemoryRegion,
    QPConfig,
    QPFailed,
    QueuePair,
    WCStatus,
    WriteCompleted,
    WriteFailed,
)
from mrc.errors import TooManyImmediates
from mrc.lab.sim import Faults, SimNetwork

REGION = 200_000


def _pair(**cfg: Any) -> tuple[SimNetwork, QueuePair, MemoryRegion]:
    net = SimNetwork(seed=5, faults=Faults(delay=0.0005, jitter=0.0001))
    net.add_host("a")
    net.add_host("b")
    config = QPConfig(payload_size=1000, max_outstanding=16, cc="fixed", **cfg)
    qa, qb = net.connect("a", "b", evs=8, config=config)
    mr = qb.pd.register(bytearray(REGION))
    return net, qa, mr


def _ends(net: SimNetwork) -> list[tuple[str, int, str]]:
    """(kind, wr_id, status) of the sender's completions and failure, in order."""
    out = []
    for e in net.hosts["a"].events:
        if isinstance(e, WriteCompleted):
            out.append(("done", e.wr_id, "success"))
        elif isinstance(e, WriteFailed):
            out.append(("failed", e.wr_id, e.status.value))
        elif isinstance(e, QPFailed):
            out.append(("qp", -1, e.reason.split(":")[0]))
    return out


def test_a_refused_write_carries_the_remote_access_error_and_later_ones_are_flushed() -> None:
    net, qa, mr = _pair()
    first = qa.post_write(bytes(50_000), mr.addr, mr.rkey)
    assert net.run(lambda: bool(_ends(net)), max_time=5)  # the first completes on its own
    bad = qa.post_write(bytes(5_000), mr.addr + REGION - 1_000, mr.rkey)  # runs off the end
    later = qa.post_write(bytes(5_000), mr.addr, mr.rkey)
    assert net.run(lambda: qa.failed, max_time=5)
    assert _ends(net) == [
        ("done", first, "success"),
        ("failed", bad, "remote access error"),
        ("failed", later, "flushed"),
        ("qp", -1, "remote access error"),
    ]


def test_retries_exhausted_fail_the_write_of_the_packet_and_flush_the_rest() -> None:
    net, qa, mr = _pair(max_timeout_retries=2, initial_rto=0.01, min_rto=0.01)
    wrs = [qa.post_write(bytes(20_000), mr.addr + i * 20_000, mr.rkey) for i in range(3)]
    net.faults.dead_evs.update(qa.evs.values)  # nothing a gets out arrives any more
    assert net.run(lambda: qa.failed, max_time=30)
    ends = _ends(net)
    assert ends[-1][0] == "qp" and ends[-1][2].startswith("retry budget exhausted")
    failed = [(wr, status) for kind, wr, status in ends if kind == "failed"]
    assert [wr for wr, _s in failed] == wrs  # each once, in posting order
    assert [s for _wr, s in failed].count(WCStatus.RETRY_EXCEEDED.value) == 1
    assert failed[0] == (wrs[0], "retry exceeded")  # the oldest packet's write ran out
    assert {s for _wr, s in failed[1:]} == {"flushed"}


def test_write_imms_beyond_the_cap_are_refused_until_one_completes() -> None:
    """mrc.h caps the WRITE_IMMs a QP has outstanding (MRC_QP_MAX_WIMM): here
    ``max_imm_outstanding``. One more is refused with a line that says so; plain WRITEs
    are not counted; a completion makes room again."""
    net, qa, mr = _pair(max_imm_outstanding=3)
    imms = [qa.post_write(bytes(1_000), mr.addr + i * 1_000, mr.rkey, imm=i) for i in range(3)]
    plain = qa.post_write(bytes(1_000), mr.addr + 10_000, mr.rkey)
    with pytest.raises(TooManyImmediates, match=r"^3 WRITE_IMMs are outstanding already"):
        qa.post_write(bytes(1_000), mr.addr + 20_000, mr.rkey, imm=9)
    assert qa.requester.imms_outstanding == 3
    assert net.run(lambda: len(_ends(net)) == 4, max_time=5)
    assert [wr for _k, wr, _s in _ends(net)] == [*imms, plain]
    assert qa.requester.imms_outstanding == 0
    again = qa.post_write(bytes(1_000), mr.addr + 20_000, mr.rkey, imm=9)
    assert net.run(lambda: len(_ends(net)) == 5, max_time=5)
    assert _ends(net)[-1] == ("done", again, "success")


def test_failed_write_imms_give_their_room_back() -> None:
    net, qa, mr = _pair(
        max_imm_outstanding=2, max_timeout_retries=1, initial_rto=0.01, min_rto=0.01
    )
    for i in range(2):
        qa.post_write(bytes(1_000), mr.addr + i * 1_000, mr.rkey, imm=i)
    net.faults.dead_evs.update(qa.evs.values)
    assert net.run(lambda: qa.failed, max_time=30)
    assert [s for k, _wr, s in _ends(net) if k == "failed"] == ["retry exceeded", "flushed"]
    assert qa.requester.imms_outstanding == 0


def test_the_cap_is_checked() -> None:
    with pytest.raises(ValueError, match="max_imm_outstanding must be 1.."):
        QPConfig(max_imm_outstanding=0).validate()
