"""Serve a listener's counters as Prometheus metrics and scrape them as Prometheus would.

A receiver listens and serves its metrics on ::1; a sender WRITEs 2 MiB into it; the program
then GETs /metrics over HTTP, parses the text with prometheus_client's parser and prints the
bytes the receiver's QP placed, as the metric says and as the connection says (equal).
"""

import asyncio
import os

from prometheus_client.parser import text_string_to_metric_families

import mrc
from mrc.metrics import serve_metrics


async def http_get(port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection("::1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    response = await reader.read()  # the server closes after one answer
    writer.close()
    return response.partition(b"\r\n\r\n")[2].decode()


async def main() -> None:
    listener = await mrc.listen("::1", 0)
    listener.register(bytearray(4 << 20), name="inbox")
    metrics = await serve_metrics(listener, host="::1", port=0)
    conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=16))
    peer = await listener.accept(timeout=5)
    await conn.write(os.urandom(2 << 20), conn.remote["inbox"], imm=1)
    assert await peer.next_immediate(timeout=5) == 1

    text = await http_get(metrics.port, "/metrics")
    placed = {
        sample.labels["qp"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mrc_qp_placed_bytes_total"
    }
    scraped = int(placed[f"0x{peer.qpn:06x}"])
    print(f"mrc_qp_placed_bytes_total {scraped}, connection says {peer.bytes_placed}")

    await conn.close()
    await metrics.close()
    await listener.close()


if __name__ == "__main__":
    asyncio.run(main())
