"""What ``mrc-bench`` prints besides its JSON: the markdown table, the aims, the plots."""

from __future__ import annotations

import os
from typing import Any

from mrc.lab.harness.table import markdown

AIM_LINK_DOWN_FACTOR = 1.5
AIM_INCAST_FACTOR = 1.2


def _find(
    rows: list[dict[str, Any]], workload: str, condition: str, transport: str
) -> dict[str, Any] | None:
    for r in rows:
        if (r["workload"], r["condition"], r["transport"]) == (workload, condition, transport):
            return r
    return None


#: what the table says of an aim ``pass`` leaves None: a run too short to judge any (--quick)
NOT_JUDGED = "not judged (--quick: too short)"


def aims(rows: list[dict[str, Any]], judged: bool = True) -> list[dict[str, Any]]:
    """The issue's targets, checked against this run (``pass`` is None when not measured, and
    for every aim when not ``judged``: a --quick run's three steps and 1 s outage measure
    what the aims name, but too little of it to call one met or not)."""
    out = _aims(rows)
    if not judged:
        for aim in out:
            aim["pass"] = None
    return out


def _aims(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    m = _find(rows, "alltoall", "clean", "mrc")
    t = _find(rows, "alltoall", "clean", "tcp")
    mp = _find(rows, "alltoall", "clean", "mptcp")
    ok = None
    if m and (t or mp) and m["p100_ms"] is not None:
        ok = all(m["p100_ms"] <= x["p100_ms"] for x in (t, mp) if x and x["p100_ms"] is not None)
        ok = ok and m["failed_steps"] == 0
    out.append(
        {
            "aim": "clean alltoall: MRC P100 <= TCP P100 and <= MPTCP P100",
            "measured": {
                "mrc_p100_ms": m and m["p100_ms"],
                "tcp_p100_ms": t and t["p100_ms"],
                "mptcp_p100_ms": mp and mp["p100_ms"],
            },
            "pass": ok,
        }
    )
    ld = _find(rows, "alltoall", "link_down", "mrc")
    ok = None
    if ld and m and m["p100_ms"] and ld["p100_ms"] is not None:
        ok = ld["p100_ms"] <= AIM_LINK_DOWN_FACTOR * m["p100_ms"] and ld["failed_steps"] == 0
    out.append(
        {
            "aim": f"link down mid-run: MRC alltoall P100 <= {AIM_LINK_DOWN_FACTOR}x its clean"
            " P100, no failed step",
            "measured": {
                "mrc_p100_ms": ld and ld["p100_ms"],
                "mrc_clean_p100_ms": m and m["p100_ms"],
                "ratio": round(ld["p100_ms"] / m["p100_ms"], 3)
                if ld and m and m["p100_ms"] and ld["p100_ms"] is not None
                else None,
                "failed_steps": ld and ld["failed_steps"],
            },
            "pass": ok,
        }
    )
    lt = _find(rows, "alltoall", "link_down", "tcp")
    ok = None
    if lt and lt.get("fault"):
        ok = bool(lt["fault"].get("stalled_until_heal"))
    out.append(
        {
            "aim": "link down mid-run: TCP (pinned to plane 0's spine 0) stalls until the heal",
            "measured": {
                "tcp_p100_ms": lt and lt["p100_ms"],
                "outage_ms": lt and (lt.get("fault") or {}).get("outage_ms"),
                "stalled_until_heal": lt and (lt.get("fault") or {}).get("stalled_until_heal"),
            },
            "pass": ok,
        }
    )
    it = _find(rows, "incast", "trim", "mrc")
    ok = None
    if it and it.get("ideal_ms") and it["p100_ms"] is not None:
        ok = it["p100_ms"] <= AIM_INCAST_FACTOR * it["ideal_ms"] and it["failed_steps"] == 0
    out.append(
        {
            "aim": f"incast N-1 -> 1 with trimming: MRC P100 <= {AIM_INCAST_FACTOR}x ideal"
            " (bytes / bottleneck rate)",
            "measured": {
                "mrc_p100_ms": it and it["p100_ms"],
                "ideal_ms": it and it.get("ideal_ms"),
                "ratio": round(it["p100_ms"] / it["ideal_ms"], 3)
                if it and it.get("ideal_ms") and it["p100_ms"] is not None
                else None,
            },
            "pass": ok,
        }
    )
    return out


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


def _extra(r: dict[str, Any]) -> str:
    """A few counters worth seeing next to the times."""
    st = r.get("transport_stats") or {}
    bits = []
    if r["transport"] == "mrc":
        if st.get("retransmits"):
            bits.append(f"rtx {st['retransmits']}")
        if st.get("trims_seen"):
            bits.append(f"trims {st['trims_seen']}")
        bad, false = st.get("evs_assumed_bad") or 0, st.get("evs_assumed_bad_false") or 0
        if bad or false:
            bits.append(_evs_bad(bad, false))
    else:
        if st.get("retrans_segs"):
            bits.append(f"rtx {st['retrans_segs']}")
        sub = st.get("subflows_per_connection")
        if sub:
            vals = sorted({v for d in sub.values() for v in (d or {}).values() if v is not None})
            if vals:
                bits.append("+subflows " + "/".join(str(v) for v in vals))
    if r.get("injected_drops"):
        bits.append(f"dropped {r['injected_drops']}")
    f = r.get("fault")
    if f and f.get("stalled_until_heal"):
        bits.append("stalled until heal")
    return ", ".join(bits)


def _evs_bad(bad: int, false: int) -> str:
    """EV retirements in a series, and those judged false in it. A retirement is judged when
    its first probe is answered, or another EV's packet shows the route worked: possibly in a
    later series (the counters are the series' difference), so more can be judged false than
    were retired, and that many at least were retired before the series."""
    if false <= bad:
        return f"EVs bad {bad}" + (f" ({false} false)" if false else "")
    return (
        f"EVs bad {bad}, {false} judged false ({false - bad}+ of them retired before this series)"
    )


def setup_note(info: dict[str, Any]) -> str:
    """A transport's set-up details as a progress line shows them (``evs_per_qp [40]``,
    ``routes [...]``, ``subflows {...}``: no Python reprs): ``key value, key value``, lists
    joined with ``/``, a mapping as ``k:v`` pairs (one within another in parentheses)."""

    def value(v: Any, nested: bool = False) -> str:
        if isinstance(v, dict):
            pairs = " ".join(f"{k}:{value(x, True)}" for k, x in v.items())
            return f"({pairs})" if nested else pairs
        if isinstance(v, list | tuple):
            return "/".join(value(x) for x in v) or "-"
        return "-" if v is None else str(v)

    return ", ".join(f"{k.replace('_', ' ')} {value(v)}" for k, v in info.items())


def table(doc: dict[str, Any]) -> str:
    head = (
        *("workload", "condition", "transport", "steps", "failed"),
        *("P50 ms", "P99 ms", "P100 ms", "ideal ms", "goodput Mbit/s", "verified MiB"),
        *("SHA-256", "notes"),
    )
    rows = [
        (
            *(str(r[k]) for k in ("workload", "condition", "transport", "steps")),
            *(str(r["failed_steps"]), _fmt(r["p50_ms"]), _fmt(r["p99_ms"])),
            *(f"**{_fmt(r['p100_ms'])}**", _fmt(r.get("ideal_ms"))),
            f"{r['goodput_bps'] / 1e6:.1f}",
            f"{_mib(r['bytes_verified'])}/{_mib(r['bytes_expected'])}",
            "ok" if r["sha256_ok"] else "FAIL",
            _extra(r),
        )
        for r in doc["results"]
    ]
    out = markdown(head, rows) + "\n"
    if doc.get("aims"):
        quick = bool((doc.get("config") or {}).get("quick"))
        unknown = NOT_JUDGED if quick else "not measured"
        judged = []
        for a in doc["aims"]:
            meas = ", ".join(f"{k} {v}" for k, v in a["measured"].items() if v is not None)
            res = {True: "met", False: "NOT met", None: unknown}[a["pass"]]
            judged.append((str(a["aim"]), meas or "-", res))
        out += "\n" + markdown(("aim", "measured", "result"), judged) + "\n"
    if doc.get("skipped"):
        out += (
            "\n"
            + "\n".join(
                f"- condition `{s['condition']}` skipped: {s['reason']}" for s in doc["skipped"]
            )
            + "\n"
        )
    return out


COLORS = {"mrc": "tab:blue", "tcp": "tab:red", "mptcp": "tab:green"}


def plots(doc: dict[str, Any], outdir: str) -> list[str]:
    """Per (workload, condition): step time over the run (failure and heal marked) and the CDF
    of step times, one line per transport. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import ScalarFormatter

    os.makedirs(outdir, exist_ok=True)
    written = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in doc["results"]:
        groups.setdefault((r["workload"], r["condition"]), []).append(r)
    for (workload, condition), rows in groups.items():
        fig, ax = plt.subplots(figsize=(8, 4.2))
        faulted = any(r.get("fault") for r in rows)
        for r in rows:
            if not r["step_ms"]:
                continue
            c = COLORS.get(r["transport"])
            f = r.get("fault")
            # with a link failure, time is counted from the failure, so transports line up
            shift = f["down_s"] if f else 0.0
            x = [
                s + ms / 1e3 - shift for s, ms in zip(r["step_start_s"], r["step_ms"], strict=True)
            ]
            ax.plot(
                x,
                r["step_ms"],
                marker="o",
                ms=3,
                lw=1.2,
                color=c,
                label=f"{r['transport']} (P100 {r['p100_ms']:.0f} ms)",
            )
            bad = r.get("failed_step_indices") or []
            if bad:
                ax.scatter(
                    [x[i] for i in bad],
                    [r["step_ms"][i] for i in bad],
                    marker="x",
                    s=60,
                    color=c,
                    zorder=5,
                    label=f"{r['transport']} failed step",
                )
            if f and f.get("up_s") is not None:
                ax.axvline(f["up_s"] - shift, color=c, ls=":", lw=1.2)
        if faulted:
            ax.axvline(0, color="black", ls="--", lw=1.2, label="link down")
            ax.plot([], [], color="grey", ls=":", label="link healed (per transport)")
        ideal = next((r.get("ideal_ms") for r in rows if r.get("ideal_ms")), None)
        if ideal:
            ax.axhline(ideal, color="black", lw=0.8, ls="-.", label=f"ideal {ideal:.0f} ms")
        ax.set_xlabel(
            "time since the link failed (s), at each step's end"
            if faulted
            else "time since the series started (s), at each step's end"
        )
        ax.set_ylabel("step time (ms)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_title(f"mrc-bench {workload} / {condition}: synchronized step times")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, os.path.join(outdir, f"steps-{workload}-{condition}.png")))

        fig, ax = plt.subplots(figsize=(6, 4))
        for r in rows:
            if not r["step_ms"]:
                continue
            v = np.sort(np.array(r["step_ms"]))
            y = np.arange(1, len(v) + 1) / len(v)
            ax.step(
                np.r_[v[0], v],
                np.r_[0.0, y],
                where="post",
                color=COLORS.get(r["transport"]),
                label=f"{r['transport']} (P50 {r['p50_ms']:.0f}, P100 {r['p100_ms']:.0f} ms)",
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="x", which="minor", labelsize=7)
        ax.set_xlabel("step time (ms)")
        ax.set_ylabel("fraction of steps")
        ax.set_title(f"CDF of step times: {workload} / {condition}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, os.path.join(outdir, f"cdf-{workload}-{condition}.png")))
    return written


def _save(fig: Any, path: str) -> str:  # a matplotlib Figure (matplotlib is untyped here)
    """Lay out, write and close one plot; returns its path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
