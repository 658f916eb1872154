"""What bench_qp prints for people: the table of MRC next to its references."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the references run beside MRC (mrc.lab.harness.peers) and their keys in a result row
PEER_KEYS = {"raw": "raw_udp", "gso": "gso_udp", "tcp": "tcp"}
PEER_HELP = {
    "raw": "a Python loop of one send/recv per datagram",
    "gso": "GSO sends and GRO receives of the same datagrams",
    "tcp": "kernel TCP, 1 MiB per send, on the first link",
}


def table(out: Mapping[str, Any]) -> str:
    """The human table: a row per (links, payload), MRC next to each reference; the cost of
    each security mode below when there are several."""
    compare = out["config"]["compare"]
    head = f"{'links':>5} {'payload':>7} | {'MRC Gbit/s':>10} {'MRC kpps':>8} {'rtx':>5}"
    head += f" {'CPU s/GiB snd/rcv':>17}"
    for kind in compare:
        head += f" | {kind + ' Gbit/s':>11} {'MRC/' + kind:>8}"
    lines = [head, "-" * len(head)]

    def f(v: float | None, scale: float, fmt: str) -> str:
        return "-" if v is None else format(v / scale, fmt)

    for r in out["results"]:
        m = r["mrc"]
        line = (
            f"{r['links']:>5} {r['payload']:>7} | {f(m['goodput_bps_median'], 1e9, '10.3f')} "
            f"{f(m['pps_median'], 1e3, '8.1f')} {f(m['retransmits_median'], 1, '5.0f')} "
            f"{f(m['send_cpu_s_per_gib_median'], 1, '8.2f')}/"
            f"{f(m['recv_cpu_s_per_gib_median'], 1, '<8.2f')}"
        )
        for kind in compare:
            ref = r[PEER_KEYS[kind]]
            line += (
                f" | {f(ref['payload_bps_median'], 1e9, '11.3f')} "
                f"{f(r['mrc_vs_' + kind], 1, '8.3f')}"
            )
        lines.append(line)
    keyed = [
        (r, mode, v)
        for r in out["results"]
        for mode, v in r["security"].items()
        if len(r["security"]) > 1
    ]
    if keyed:
        lines.append("")
        lines.append(f"{'links':>5} {'payload':>7} | {'security':>9} {'Gbit/s':>8} {'cost':>6}")
        for r, mode, v in keyed:
            cost = "-" if v["cost_vs_none"] is None else f"{v['cost_vs_none'] * 100:5.1f}%"
            lines.append(
                f"{r['links']:>5} {r['payload']:>7} | {mode:>9} "
                f"{f(v['goodput_bps_median'], 1e9, '8.3f')} {cost:>6}"
            )
    c = out["config"]
    lines.append(
        f"(medians of {c['runs']} run(s), interleaved; MRC {c['size']} bytes per transfer; "
        f"references {c['duration']:g} s each, in payload Gbit/s: "
        + "; ".join(f"{k} = {PEER_HELP[k]}" for k in compare)
        + f"; loop {out['machine']['event_loop']})"
    )
    return "\n".join(lines)


# ---- arguments ---------------------------------------------------------------------------
