"""What bench_qp prints for people: the table of MRC next to its references."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mrc.lab.harness.table import render

#: the references run beside MRC (mrc.lab.harness.peers) and their keys in a result row
PEER_KEYS = {"raw": "raw_udp", "gso": "gso_udp", "tcp": "tcp", "aioquic": "aioquic"}
PEER_HELP = {
    "raw": "a Python loop of one send/recv per datagram",
    "gso": "GSO sends and GRO receives of the same datagrams",
    "tcp": "kernel TCP, 1 MiB per send, on the first link",
    "aioquic": "one aioquic stream of the MRC transfer's size, hashed, on the first link",
}
#: the references that report each side's CPU seconds per GiB, shown beside their Gbit/s
CPU_KINDS = ("tcp", "aioquic")


def table(out: Mapping[str, Any]) -> str:
    """The human table: a row per (links, payload), MRC (and the checksum it verified with)
    next to each reference, with the CPU per GiB of tcp and aioquic on each side, and MRC's
    (both sides') as a multiple of TCP's (``CPU/tcp``); below, when there are several, the
    cost of each security mode and each checksum's goodput and CPU per GiB on each side
    against the first."""
    compare = out["config"]["compare"]
    # a "|" column between the groups: " | " with the columns' " "
    head = ["links", "payload", "|", "checksum", "MRC Gbit/s", "MRC kpps", "rtx"]
    head.append("CPU s/GiB snd/rcv")
    widths = [5, 7, 1, 8, 10, 8, 5, 17]
    for kind in compare:
        head += ["|", kind + " Gbit/s", "MRC/" + kind]
        widths += [1, 11, 8]
        if kind in CPU_KINDS:  # its CPU per GiB beside MRC's
            head.append(kind + " CPU snd/rcv")
            widths.append(len(head[-1]))
        if kind == "tcp":
            head.append("CPU/tcp")
            widths.append(7)

    def f(v: float | None, scale: float, fmt: str) -> str:
        return "-" if v is None else format(v / scale, fmt)

    rows = []
    for r in out["results"]:
        m = r["mrc"]
        cells = [str(r["links"]), str(r["payload"]), "|", m.get("checksum") or "-"]
        cells.append(f(m["goodput_bps_median"], 1e9, ".3f"))
        cells += [f(m["pps_median"], 1e3, ".1f"), f(m["retransmits_median"], 1, ".0f")]
        cells.append(
            f"{f(m['send_cpu_s_per_gib_median'], 1, '8.2f')}/"
            f"{f(m['recv_cpu_s_per_gib_median'], 1, '<8.2f')}"
        )
        for kind in compare:
            ref = r[PEER_KEYS[kind]]
            cells += ["|", f(ref["payload_bps_median"], 1e9, ".3f")]
            cells.append(f(r["mrc_vs_" + kind], 1, ".3f"))
            if kind in CPU_KINDS:  # "snd/rcv", as wide as the head
                half = (len(kind + " CPU snd/rcv") - 1) // 2
                cells.append(
                    f"{f(ref['send_cpu_s_per_gib_median'], 1, f'{half}.2f')}/"
                    f"{f(ref['recv_cpu_s_per_gib_median'], 1, f'<{half}.2f')}"
                )
            if kind == "tcp":
                cells.append(f(r["mrc_cpu_vs_tcp"], 1, ".2f"))
        rows.append(cells)
    lines = [render(rows, ">", sep=" ", widths=widths, head=head, rule=True)]
    keyed = [
        (r, mode, v)
        for r in out["results"]
        for mode, v in r["security"].items()
        if len(r["security"]) > 1
    ]
    if keyed:
        costs = [
            (
                *(str(r["links"]), str(r["payload"]), "|", mode),
                f(v["goodput_bps_median"], 1e9, ".3f"),
                "-" if v["cost_vs_none"] is None else f"{v['cost_vs_none'] * 100:5.1f}%",
            )
            for r, mode, v in keyed
        ]
        head = ["links", "payload", "|", "security", "Gbit/s", "cost"]
        cost_table = render(costs, ">", sep=" ", widths=(5, 7, 1, 9, 8, 6), head=head)
        lines += ["", cost_table]
    lines += checksum_table(out["results"])
    c = out["config"]
    lines.append(
        f"(medians of {c['runs']} run(s), interleaved; MRC {c['size']} bytes per transfer; "
        f"references {c['duration']:g} s each, in payload Gbit/s: "
        + "; ".join(f"{k} = {PEER_HELP[k]}" for k in compare)
        + ("; CPU/tcp = MRC's CPU s/GiB, snd + rcv, over TCP's" if "tcp" in compare else "")
        + f"; loop {out['machine']['event_loop']})"
    )
    return "\n".join(lines)


def checksum_table(results: list[Mapping[str, Any]]) -> list[str]:
    """The lines (a blank one first) of the per-checksum table, when a row has several
    checksums: each one's goodput and what it costs against the first listed, and the CPU
    seconds per GiB of mrc-send and of mrc-recv, with the difference from the first's (+:
    more); none otherwise."""
    rows = []
    first = ""
    for r in results:
        checks = r.get("checksum") or {}
        if len(checks) < 2:
            continue
        first = first or next(iter(checks))
        for name, v in checks.items():
            cells = [str(r["links"]), str(r["payload"]), "|", name, _num(v["goodput_bps_median"])]
            cells.append(_pct(v["cost_vs_first"]))
            for side in ("send", "recv"):
                cells += ["|", _num(v[f"{side}_cpu_s_per_gib_median"], 1, ".2f")]
                cells.append(_num(v[f"{side}_cpu_s_per_gib_vs_first"], 1, "+.2f"))
            rows.append(cells)
    if not rows:
        return []
    head = ["links", "payload", "|", "checksum", "Gbit/s", "cost", "|", "snd CPU s/GiB"]
    head += ["snd +/-", "|", "rcv CPU s/GiB", "rcv +/-"]
    widths = (5, 7, 1, 8, 8, 6, 1, 13, 7, 1, 13, 7)
    return [
        "",
        *render(rows, ">", sep=" ", widths=widths, head=head).splitlines(),
        f"(cost: goodput lost against {first}; CPU s/GiB: each process's CPU seconds per "
        f"GiB moved; +/-: more than {first}'s)",
    ]


def _num(v: float | None, scale: float = 1e9, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v / scale, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:5.1f}%"


# ---- arguments ---------------------------------------------------------------------------
