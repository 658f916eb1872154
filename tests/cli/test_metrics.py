"""mrc-recv --metrics-port: scraped during a real mrc-send transfer on ::1 and after it.

The transfer is slowed by a small window (``--window 4``: a few MB/s on loopback), so scrapes
land while it runs; the first one is taken once data has started to arrive (a counter above
0, awaited by scraping, not by sleeping), and the next ones must show it growing. mrc-recv
takes two transfers (``--count 2``), so after the first it is still up to be scraped: its
counters must then equal the transfer, and stay there.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from conftest import Running, free_port
from metrics_scrape import Scrape, scrape

if TYPE_CHECKING:
    from conftest import MrcTools

SIZE = 8 << 20


def _until(
    port: int, ok: Callable[[Scrape], bool], what: str, watch: Running, limit: float = 30
) -> Scrape:
    deadline = time.monotonic() + limit
    while True:
        s = scrape(port)
        if ok(s):
            return s
        assert watch.proc.poll() is None, f"exited before {what}: {watch.wait().describe()}"
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)


def test_recv_metrics_during_and_after_a_transfer(mrc_tools: MrcTools, mrc_port: int) -> None:
    mport = free_port()
    recv = mrc_tools.start(
        "mrc-recv",
        "--listen",
        f"[::1]:{mrc_port}",
        "--discard",
        "--count",
        "2",
        "--json",
        "--metrics-port",
        str(mport),
    )
    recv.wait_listening(mrc_port)
    recv.wait_listening(mport)
    idle = scrape(mport)
    assert idle.value("mrc_connections_active") == 0
    assert idle.value("mrc_listener_refused_total", limit="connections") == 0
    assert idle.series("mrc_qp_placed_bytes_total") == []

    send = mrc_tools.start(
        "mrc-send", "--size", str(SIZE), "--window", "4", "--to", f"[::1]:{mrc_port}", "--json"
    )
    placed = "mrc_qp_placed_bytes_total"
    first = _until(mport, lambda s: s.total(placed) > 0, "the first bytes placed", send)
    before = first.total(placed)
    assert before < SIZE, "the transfer ended before a scrape saw it run"
    (labels, _v), *more = first.series(placed)
    assert not more and labels["side"] == "listener" and labels["peer"] == "::1"
    assert first.value("mrc_connections_active") == 1
    assert first.total("mrc_qp_evs", qp=labels["qp"]) >= 16  # every EV in one state
    second = _until(mport, lambda s: s.total(placed) > before, "more bytes placed", send)
    assert second.total("mrc_qp_received_packets_total") > first.total(
        "mrc_qp_received_packets_total"
    )
    assert second.total("mrc_qp_sent_acks_total") >= first.total("mrc_qp_sent_acks_total")
    assert second.total("mrc_endpoint_received_datagrams_total") > first.total(
        "mrc_endpoint_received_datagrams_total"
    )

    sent = send.wait()
    assert sent.returncode == 0, sent.describe()
    # the sender is told "ok" before the receiver closes its end: await the close
    after = _until(
        mport, lambda s: s.value("mrc_connections_finished_total") == 1, "the close", recv
    )
    assert after.value(placed, **labels) == SIZE
    assert after.value("mrc_connections_active") == 0
    assert after.series("mrc_qp_evs") == []  # gauges are for live connections only
    # every data packet the sender sent, less any the kernel dropped on the way
    packets = after.value("mrc_qp_received_packets_total", **labels)
    assert SIZE / sent.json["payload"] <= packets <= sent.json["packets_sent"]
    # the ACKs the sender took were all sent by this receiver
    assert after.value("mrc_qp_sent_acks_total", **labels) >= sent.json["sacks"] > 0

    # the second transfer lets mrc-recv finish; its JSON agrees with what was scraped
    small = mrc_tools.run("mrc-send", "--size", "10K", "--to", f"[::1]:{mrc_port}")
    assert small.returncode == 0, small.describe()
    got = recv.wait()
    assert got.returncode == 0, got.describe()
    big = next(o for o in got.objects if o["bytes"] == SIZE)
    assert big["bytes_placed"] == SIZE
    assert big["packets_received"] == packets


def test_recv_metrics_port_in_use_is_one_line_exit_2(mrc_tools: MrcTools, mrc_port: int) -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as busy:
        busy.bind(("::1", 0))
        busy.listen()
        mport = busy.getsockname()[1]
        res = mrc_tools.run(
            "mrc-recv",
            "--listen",
            f"[::1]:{mrc_port}",
            "--discard",
            "--metrics-port",
            str(mport),
            timeout=20,
        )
    assert res.returncode == 2, res.describe()
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.describe()
    assert lines[0].startswith(f"mrc-recv: error: cannot serve metrics on [::1]:{mport}: ")
    assert "in use" in lines[0]


def test_send_metrics_during_a_transfer(mrc_tools: MrcTools, mrc_port: int) -> None:
    """mrc-send --metrics-port serves its own QP's counters while it sends."""
    mport = free_port()
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json")
    recv.wait_listening(mrc_port)
    send = mrc_tools.start(
        "mrc-send",
        "--size",
        str(SIZE),
        "--window",
        "4",
        "--to",
        f"[::1]:{mrc_port}",
        "--metrics-port",
        str(mport),
    )
    send.wait_listening(mport)
    sent_bytes = "mrc_qp_sent_bytes_total"
    first = _until(mport, lambda s: s.total(sent_bytes) > 0, "the first bytes sent", send)
    (labels, _v), *more = first.series(sent_bytes)
    assert not more and labels["side"] == "connect"
    second = _until(mport, lambda s: s.total(sent_bytes) > first.total(sent_bytes), "more", send)
    assert second.total("mrc_qp_received_acks_total") > 0
    assert send.wait().returncode == 0
    assert recv.wait().returncode == 0
