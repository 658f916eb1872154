"""What the failover demo shows: the table on stdout and the goodput plot (``--plot``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mrc.lab.failover.analysis import series
from mrc.lab.harness.table import render

TRANSPORTS = ("mrc", "tcp", "mptcp")
COLORS = {"mrc": "tab:blue", "tcp": "tab:red", "mptcp": "tab:green"}


def _stalls(res: Mapping[str, Any]) -> str:
    """'in the failure / outside it' of one transport's row: the second is the same run's
    level without a failure, what the machine does to any transfer."""
    a, b = res.get("max_stall_in_failure_ms"), res.get("max_stall_outside_failure_ms")
    if a is None:
        return "-"
    return f"{a:.1f} ms" if b is None else f"{a:.1f} / {b:.1f} ms"


def _mbit(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.0f} Mbit/s"


def case_title(case: Mapping[str, Any]) -> str:
    """One line naming a case of the demo's JSON: the link, how it failed, when (and whether)
    it healed, and the plane the side channel (MRC) and first subflow (MPTCP) were set up
    over."""
    a, b = case["link"]
    what = f"{case['fail']} ({a}-{b})" if case.get("fail") else f"{a}-{b}"
    how = "blackholed" if case["how"] == "blackhole" else "down"
    when = (
        f"at {case['fail_at_s']:g} s, healed at {case['heal_at_s']:g} s"
        if case["heal_at_s"] is not None
        else f"at {case['fail_at_s']:g} s, never healed"
    )
    setup = case["setup_plane"]
    which = "the failed plane" if case["setup_on_failed_plane"] else "not the failed plane"
    return f"== {what} {how} {when}; set-up over plane {setup} ({which})"


def _finished(res: Mapping[str, Any]) -> str:
    if "error" in res:
        return "FAILED"
    if res.get("finished", True):
        return "yes"
    moved = res.get("bytes")
    return "NO" if moved is None else f"NO ({moved / 1e6:.0f} MB moved)"


def _intact(res: Mapping[str, Any]) -> str:
    """Whether the data arrived intact; for a stream that did not finish, whether what it
    moved is the data's beginning."""
    if res.get("sha256_match"):
        return "yes"
    if "moved_sha256_match" in res:
        return "what moved: " + ("yes" if res["moved_sha256_match"] else "NO")
    return "NO"


def _recovery(res: Mapping[str, Any]) -> str:
    if "error" in res:
        return "-"
    ms = res.get("recovery_ms")
    return "never" if ms is None else f"{ms:.0f} ms"


def _side(res: Mapping[str, Any]) -> str:
    """MRC's side channel: the plane it was set up over, and when the failed plane's path was
    found dead and joined again (after the failure, after the heal)."""
    sc = res.get("side_channel")
    if not sc:
        return "-"
    lost, back = sc.get("lost_after_s"), sc.get("back_after_heal_s")
    text = f"plane {sc.get('setup_plane')}"
    if lost is not None:
        text += f", lost +{lost:.1f} s"
    if back is not None:
        text += f", back +{back:.1f} s"
    return text


def plot(path: str, raw: Mapping[str, Any], out: Mapping[str, Any], failed_plane: int) -> None:
    """Goodput over time of every transport (top), then each one's per-plane goodput, the
    outage shaded: the picture of the README's failover section."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in TRANSPORTS if n in raw]
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(11, 2.6 * (len(names) + 1)), sharex=True)
    bin_s = 0.05
    ax0 = axes[0]
    for name in names:
        r = raw[name]
        s = r["recv"]["samples"]
        xs, ys = series(s["t"], s["placed"], r["t_start"], bin_s)
        ax0.plot(xs, ys, label=name.upper(), color=COLORS[name], lw=1.2)
    ax0.set_ylabel("goodput Mbit/s")
    how = "blackholed" if out.get("how") == "blackhole" else "down"
    healed = f"up at {out['heal_at_s']} s" if out["heal_at_s"] is not None else "never up"
    ax0.set_title(
        f"{out['link'][0]}-{out['link'][1]} {how} at {out['fail_at_s']} s, {healed}; "
        f"{out['fabric']['planes']} planes x {out['fabric']['rate']} ({bin_s * 1000:.0f} ms bins)"
    )
    ax0.legend(loc="lower right", fontsize=8)
    for i, name in enumerate(names, start=1):
        ax = axes[i]
        r = raw[name]
        pl = r["recv"]["planes"]
        key = "placed" if name == "mrc" and pl.get("placed") else "nic_rx"
        what = "placed bytes" if key == "placed" else "NIC rx bytes (incl. headers)"
        for p, vals in enumerate(pl.get(key, [])):
            xs, ys = series(pl["t"], vals, r["t_start"], 0.1)
            ax.plot(xs, ys, lw=1.0, label=f"plane {p}" + (" (failed)" if p == failed_plane else ""))
        res = out.get(name, {})
        ax.set_title(
            f"{name.upper()} per plane ({what}, 100 ms bins): stall "
            f"{res.get('max_stall_ms')} ms, during {_mbit(res.get('goodput_during_bps'))}",
            fontsize=9,
        )
        ax.set_ylabel("Mbit/s")
        ax.legend(loc="lower right", fontsize=7, ncol=4)
    # never healed: the outage shaded up to the last transport's end
    end = max(
        (float(r["recv"].get("t_done", r["t_start"])) - r["t_start"] for r in raw.values()),
        default=out["fail_at_s"],
    )
    for ax in axes:
        heal = out["heal_at_s"]
        ax.axvspan(out["fail_at_s"], heal if heal is not None else end, color="0.85", zorder=0)
        ax.axvline(out["fail_at_s"], color="k", ls="--", lw=0.8)
        if heal is not None:
            ax.axvline(heal, color="k", ls=":", lw=0.8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("seconds since the sender started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(out: Mapping[str, Any]) -> str:
    """The human table of one case: one column per transport that ran, one row per figure."""
    names = [n for n in TRANSPORTS if n in out]
    rows = [("", *[n.upper() for n in names])]

    def cells(key: str, fmt: Callable[[Any], str], mrc_only: bool = False) -> list[str]:
        got = []
        for n in names:
            v = out[n].get(key)
            got.append("-" if v is None or (mrc_only and n != "mrc") else fmt(v))
        return got

    rows.append(("finished", *[_finished(out[n]) for n in names]))
    rows.append(("data intact (SHA-256)", *[_intact(out[n]) for n in names]))
    rows.append(("max delivery stall", *cells("max_stall_ms", lambda v: f"{v:.1f} ms")))
    rows.append(("  in the failure / outside", *[_stalls(out[n]) for n in names]))
    rows.append(("longest < half rate", *cells("below_half_rate_ms", lambda v: f"{v:.0f} ms")))
    rows.append(("time to recover", *[_recovery(out[n]) for n in names]))
    rows.append(("max in-order stall", *cells("max_stall_inorder_ms", lambda v: f"{v:.1f} ms")))
    for k, label in (
        ("goodput_before_bps", "goodput before"),
        ("goodput_during_bps", "goodput during failure"),
        ("goodput_after_bps", "goodput after heal"),
        ("capacity_during_bps", "capacity during failure"),
    ):
        rows.append((label, *[_mbit(out[n].get(k)) for n in names]))
    rows.append(("during / capacity", *cells("during_vs_capacity", lambda v: f"{v * 100:.0f}%")))
    rows.append(
        (
            "EVs assumed bad / resurrected",
            *[
                (
                    f"{out[n].get('evs_assumed_bad')} / {out[n].get('evs_resurrected')}"
                    if n == "mrc"
                    else "-"
                )
                for n in names
            ],
        )
    )
    rows.append(
        (
            "time to resurrection",
            *cells("resurrection_s", lambda v: f"{v * 1000:.0f} ms", mrc_only=True),
        )
    )
    rows.append(("side channel (set up over)", *[_side(out[n]) for n in names]))
    return render(rows, "<>")
