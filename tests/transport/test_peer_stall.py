"""A receiver that stops for a moment (SIGSTOP: a busy or preempted host) must cost the
sender a moment, not the transfer.

Seen before: a 0.3 s stop of mrc-recv on ::1 timed out the sender's whole fixed window; it was
resent whole, the receiver answered each duplicate at once (twice), fell behind, and the resend
of the oldest packet waited in its socket behind them past the next RTO, again and again: a
256 MiB transfer still crawled minutes later. Now a flight that met silence (nothing new
acknowledged since it left) resends only its oldest packet and blames no EV
(``Requester.handle_timer``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import MrcTools

SIZE = 128 << 20


def test_a_receiver_stopped_for_a_moment_costs_a_moment(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json", "-v",
        "--idle-timeout", "60",
    )  # fmt: skip
    recv.wait_listening(mrc_port)
    send = mrc_tools.start(
        "mrc-send", "--to", f"[::1]:{mrc_port}", "--size", str(SIZE), "--cc", "fixed",
        "--json", "--no-progress", "--idle-timeout", "60",
    )  # fmt: skip
    assert recv.proc.stderr is not None
    for line in recv.proc.stderr:  # -v: the sender's first datagram has arrived
        if "transfer from" in line:
            break
    os.kill(recv.proc.pid, signal.SIGSTOP)
    time.sleep(0.3)  # the stop under test (a host that does not run the receiver)
    os.kill(recv.proc.pid, signal.SIGCONT)
    sent, got = send.wait(90), recv.wait(30)
    assert sent.returncode == 0 and got.returncode == 0, sent.describe() + got.describe()
    out, back = sent.json, got.json
    assert out["digest"] == out["digest_receiver"] == back["digest"]
    assert out["bytes"] == back["bytes"] == SIZE
    # the stop landed mid-transfer and was taken for silence, not for dead paths
    assert out["silent_timeouts"] >= 1, out
    assert out["planes_lost"] == 0, out
    # the window was not resent again and again: at most a few windows of duplicates
    assert back["duplicates"] <= 4 * 512, (back["duplicates"], out["retransmits_timeout"])
