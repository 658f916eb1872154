"""What mrc-send reports: one JSON object (totals over its streams, each stream, intervals)
and, for people, one result line and the summary table ib_write_bw users know."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from mrc import counter_registry as registry
from mrc.app.transfer import TransferResult

#: the counters mrc-send prints, each stream's and, in the totals, their sum over streams
#: (declared with the counters: ``json=SEND``, mrc/core/counters.py)
SENT = registry.in_json("send")


@dataclass
class Outcome:
    """One stream (QP) once its transfer ended: the verdict and its connection's counters
    (``stats``: ``Connection.stats()``, ``counters``: ``Connection.counters()``)."""

    result: TransferResult
    stats: dict[str, object]
    evs: list[dict[str, object]]
    counters: dict[str, int]


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def stream_record(index: int, o: Outcome) -> dict[str, Any]:
    """One stream's part of the JSON object (its EVs are in the totals' ``evs``)."""
    stats, peer, r = o.stats, o.result.peer_stats, o.result
    srtt = stats.get("srtt")
    drops = peer.get("dropped_by_reason")
    return {
        "stream": index,
        "ok": r.ok,
        "bytes": r.bytes,
        "seconds": round(r.seconds, 6),
        "goodput_bps": round(r.goodput_bps),
        "checksum": r.checksum,
        "digest": r.digest,
        "digest_receiver": r.peer_digest,
        **{spec.key: o.counters[spec.name] for spec in SENT},
        # the receiver's count (from its report at the end): trims happen on the way to it
        "trims_seen": _int(peer.get("trims_seen", 0)),
        "srtt_ms": round(srtt * 1000, 3) if isinstance(srtt, float) and srtt else None,
        "dropped_by_reason": dict(drops) if isinstance(drops, dict) else {},
        "error": r.error,
    }


def totals(outcomes: list[Outcome], cpu: float, peak_bps: float) -> dict[str, Any]:
    """The fields of the JSON object that add up (or agree) over all streams."""
    streams = [stream_record(i, o) for i, o in enumerate(outcomes)]
    seconds = max(s["seconds"] for s in streams)
    total = sum(s["bytes"] for s in streams)
    drops: Counter[str] = Counter()
    for s in streams:
        drops.update(s["dropped_by_reason"])
    srtts = [s["srtt_ms"] for s in streams if s["srtt_ms"] is not None]
    evs: list[dict[str, object]] = []
    for i, o in enumerate(outcomes):
        evs.extend({**row, "stream": i} if len(outcomes) > 1 else row for row in o.evs)
    errors = [s["error"] for s in streams if s["error"]]
    if len(streams) > 1:
        errors = [f"stream {s['stream']}: {s['error']}" for s in streams if s["error"]]
    return {
        "ok": all(s["ok"] for s in streams),
        "bytes": total,
        "seconds": seconds,
        "goodput_bps": round(total * 8 / seconds) if seconds > 0 else 0,
        # the best PEAK_TICK of the run, never below the average
        "peak_bps": round(max(peak_bps, total * 8 / seconds if seconds > 0 else 0.0)),
        # CPU time (user + system) of this process during the transfer, hashing included
        "cpu_seconds": round(cpu, 4),
        # the end-to-end checksum the receiver picked (mrc.app.checksum), and one digest when
        # every stream agrees on it (a file or --size), else null
        "checksum": _agreed(s["checksum"] for s in streams),
        "digest": _agreed(s["digest"] for s in streams),
        "digest_receiver": _agreed(s["digest_receiver"] for s in streams),
        **{k: sum(s[k] for s in streams) for k in (*(spec.key for spec in SENT), "trims_seen")},
        "srtt_ms": round(sum(srtts) / len(srtts), 3) if srtts else None,
        "dropped_by_reason": dict(drops),
        "evs": evs,
        "streams": streams,
        "error": "; ".join(errors) if errors else None,
    }


def _agreed(values: Any) -> str | None:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def summary_table(out: dict[str, Any]) -> str:
    """ib_write_bw's closing table: bytes, iterations (data packets: first transmissions),
    peak and average bandwidth in Gb/s, message rate in million packets per second."""
    seconds = out["seconds"]
    rate = out["data_packets"] / seconds / 1e6 if seconds > 0 else 0.0
    rule = "-" * 86
    head = (
        f" {'#bytes':<16}{'#iterations':<14}{'BW peak[Gb/s]':<17}"
        f"{'BW average[Gb/s]':<20}{'MsgRate[Mpps]':<14}"
    )
    row = (
        f" {out['bytes']:<16}{out['data_packets']:<14}{out['peak_bps'] / 1e9:<17.3f}"
        f"{out['goodput_bps'] / 1e9:<20.3f}{rate:<14.6f}"
    )
    return "\n".join((rule, head.rstrip(), row.rstrip(), rule))
