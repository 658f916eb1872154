"""The workloads of ``mrc-bench``: which host writes how many bytes to which, in one step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Transfer:
    src: int
    dst: int
    size: int


def transfers(workload: str, hosts: int, size: int, pair_size: int) -> list[Transfer]:
    """Every transfer of one step of ``workload`` among hosts 0..hosts-1.

    * ``alltoall``: every host writes ``size`` bytes to every other host;
    * ``ring``: host i writes ``size`` bytes to host i+1 (mod N);
    * ``incast``: hosts 1..N-1 each write ``size`` bytes to host 0;
    * ``pair``: host 0 writes ``pair_size`` bytes to host N-1 (one connection, across the
      spines when the fabric has more than one leaf).
    """
    if hosts < 2:
        raise ValueError("a workload needs at least 2 hosts")
    if workload == "alltoall":
        return [Transfer(s, d, size) for s in range(hosts) for d in range(hosts) if s != d]
    if workload == "ring":
        return [Transfer(s, (s + 1) % hosts, size) for s in range(hosts)]
    if workload == "incast":
        return [Transfer(s, 0, size) for s in range(1, hosts)]
    if workload == "pair":
        return [Transfer(0, hosts - 1, pair_size)]
    raise ValueError(f"unknown workload {workload!r}")


def ideal_seconds(tlist: list[Transfer], planes: int, rate_bps: int | None) -> float | None:
    """Lower bound on a step: the busiest host NIC set (all planes, both directions counted
    separately) moving its bytes at ``planes`` x the link rate. None on an unshaped fabric."""
    if not rate_bps:
        return None
    out: dict[int, int] = {}
    inn: dict[int, int] = {}
    for t in tlist:
        out[t.src] = out.get(t.src, 0) + t.size
        inn[t.dst] = inn.get(t.dst, 0) + t.size
    busiest = max(list(out.values()) + list(inn.values()))
    return busiest * 8 / (planes * rate_bps)
