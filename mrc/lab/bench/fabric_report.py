"""What bench_fabric prints for people: the table of MRC's goodput next to kernel TCP's and
MPTCP's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mrc.lab.harness.machine import machine_line
from mrc.lab.harness.table import line


def fmt_rate(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:8.1f} Mbit/s"


def _of(fraction: float | None, bps: int | None) -> str:
    """ "12.3% of 10000 Mbit/s", or "-" on an unshaped fabric (no capacity)."""
    return "-" if fraction is None or not bps else f"{fraction:.1%} of {bps / 1e6:.0f} Mbit/s"


def table(out: Mapping[str, Any]) -> str:
    """The human table: a row per MRC combination, one each for TCP, MPTCP and a TCP
    connection per plane, the machine last."""
    f = out["fabric"]

    def row(*cells: str) -> str:
        return line(cells, (34, 16, 24, 11), "<>", ("", "  ", "  "))

    lines = [
        f"MRC over mrc-fabric: {f['planes']} planes x {f['spines']} spines, links {f['rate']}, "
        f"MTU {f['mtu']}, h0 -> h3, {out['size'] >> 20} MiB, median of {out['runs']}",
        row("", "goodput", "of capacity", "retransmits"),
    ]
    cap = out["capacity_bps"]
    bursts = len({m["burst"] for m in out["mrc"]}) > 1
    for m in out["mrc"]:
        lines.append(
            row(
                f"mrc {m['cc']}, window {m['window']}"
                + (f", burst {m['burst'] or 'auto'}" if m["burst"] is not None or bursts else ""),
                fmt_rate(m["goodput_bps"]),
                _of(m["fraction_of_capacity"], cap),
                f"{m['retransmits']:g}",
            )
        )
    if out["tcp"]:
        t = out["tcp"]
        lines.append(
            row(
                "kernel tcp, plane 0",
                fmt_rate(t["goodput_bps"]),
                _of(t["fraction_of_link"], f["rate_bps"]),
                "-",
            )
        )
        lines.append(
            f"mrc / tcp: {out['mrc_over_tcp']}x (planes: {f['planes']}); "
            f"MRC wire ceiling {out['mrc_wire_ceiling']:.1%} of line rate"
        )
    # the multipath references: MPTCP, and a TCP connection per plane
    refs: list[tuple[Mapping[str, Any], str, str]] = []
    if out["mptcp"]:
        runs = out["mptcp"]["runs"]
        flows = sorted({r["subflows"] for r in runs}, key=lambda n: (n is None, n or 0))
        label = f"kernel mptcp, {'/'.join(str(n) for n in flows)} extra subflows"
        refs.append((out["mptcp"], label, f"mrc / mptcp: {out['mrc_over_mptcp']}x"))
    if out.get("tcp_planes"):
        label = f"kernel tcp, one per plane ({f['planes']})"
        ratio = f"mrc / tcp per plane: {out['mrc_over_tcp_planes']}x"
        refs.append((out["tcp_planes"], label, ratio))
    for t, label, ratio in refs:
        lines.append(
            row(label, fmt_rate(t["goodput_bps"]), _of(t["fraction_of_capacity"], cap), "-")
        )
        lines.append(ratio)
    lines.append(machine_line(out["machine"], out["seconds"]))
    return "\n".join(lines)
