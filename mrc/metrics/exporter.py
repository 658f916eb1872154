"""Reading mrc's live counters as Prometheus metric families, at scrape time only.

Nothing here runs per packet: the core keeps counting what it always counts (``QPStats``, the
endpoint's drops, the EV set, the listener's ledger), and a scrape walks the connections and
listeners it was told about and turns those numbers into metric families. A scrape therefore
costs a few microseconds per connection, and nothing at all between scrapes. Which per-QP
counters are exported, under what name and HELP, is their declaration's (``mrc.counter_registry``):
this module keeps no list of them.

Counters must never go down, yet connections come and go. So when a connection closes, its
final counters are kept under its labels (a series that stops growing, not one that vanishes);
beyond ``max_finished`` closed connections the oldest are folded into one series per side
with ``qp="retired"``, so a long-running receiver's series stay bounded and every sum over
series still only grows. Gauges (EVs by state, smoothed RTT) describe live connections only.

The exporter reads objects the event loop mutates, so it is used from the loop's thread (the
HTTP server in :mod:`mrc.metrics.http` serves from the loop, which makes every scrape a
consistent snapshot).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from mrc import counter_registry as registry
from mrc.core.counters import CounterSpec
from mrc.core.events import EVState

if TYPE_CHECKING:
    from mrc.connection import Connection, Listener
    from mrc.core.endpoint import EndpointCore
    from mrc.transport.endpoint import Endpoint

#: closed connections kept as series of their own before the oldest are folded into "retired"
MAX_FINISHED = 1024

EV_STATES = ("good", "backup", "skip", "assumed_bad", "denied")

# the per-QP families that are not counters of the registry: (name, HELP, label, what --json
# calls it, more for docs/METRICS.md), for the collector and mrc.metrics.reference
QP_DROPS = (
    "mrc_qp_dropped_datagrams",
    "Datagrams a QP dropped, by reason (see dropped_by_reason in --json)",
    "reason",
    "dropped_by_reason",
    "`bad_rkey`, `psn_out_of_window`, `security_*`... (docs/PROTOCOL.md section 12)",
)
QP_EV_STATES = (
    "mrc_qp_evs",
    "Entropy values of a live QP by state (good: in the rotation, backup: GOOD in the pool)",
    "state",
    "evs[].state",
    ", ".join(f"`{state}`" for state in EV_STATES) + " (docs/EV_HEALTH.md)",
)
QP_SRTT = ("mrc_qp_srtt_seconds", "Smoothed round-trip time of a live QP", "", "srtt_ms", "")

QP_LABELS = ("qp", "peer", "side")
LIMITS = ("setups", "connections", "granted_bytes", "memory_bytes")


@dataclass
class _Totals:
    """Final counters of closed connections (or of a closed endpoint), summed per series."""

    counters: Counter[str] = field(default_factory=Counter)
    drops: Counter[str] = field(default_factory=Counter)

    def add(self, other: _Totals) -> None:
        self.counters.update(other.counters)
        self.drops.update(other.drops)


def exported() -> list[tuple[str, list[CounterSpec]]]:
    """The per-QP families read from the counter registry: (family name, its counters), in
    registry order; several counters share a family when their labels tell them apart."""
    families: dict[str, list[CounterSpec]] = {}
    for spec in registry.COUNTERS:
        if spec.metric is not None:
            families.setdefault(spec.metric, []).append(spec)
    return list(families.items())


def family_help(name: str, specs: list[CounterSpec]) -> str:
    """A family's HELP: its one counter's help, or the family's own (``FAMILY_HELP``)."""
    return specs[0].help if len(specs) == 1 else registry.FAMILY_HELP[name]


def _qp_totals(conn: Connection) -> _Totals:
    """Every counter of ``conn`` as it stands (a gauge's is shown for live connections only),
    and the QP's drops (drops before any QP is found are the endpoint's)."""
    counters: Counter[str] = Counter(conn.counters())
    return _Totals(counters, Counter(conn.qp.stats.dropped_by_reason))


def _endpoint_totals(core: EndpointCore, endpoint: Endpoint) -> _Totals:
    counters: Counter[str] = Counter(
        datagrams_received=core.datagrams_received, gro_trains=endpoint.gro_trains
    )
    return _Totals(counters, Counter(core.dropped_by_reason))


def _endpoint_label(endpoint: Endpoint) -> str:
    try:
        host, port = endpoint.listen_sockets[0].getsockname()[:2]
    except (OSError, IndexError):
        return f"endpoint-{id(endpoint):x}"
    return f"[{host}]:{port}"


def _ev_states(conn: Connection) -> Counter[str]:
    evs = conn.qp.evs
    out: Counter[str] = Counter(dict.fromkeys(EV_STATES, 0))
    for ev, state in enumerate(evs.state):
        if state is EVState.GOOD:
            out["backup" if evs.is_backup(ev) else "good"] += 1
        else:
            out[state.name.lower()] += 1
    return out


QPKey = tuple[str, str, str]  # qp, peer, side


class _Watched:
    """A live connection: its labels, and its own endpoint if it has one (a connect()ed
    connection does; a listener's share the listener's)."""

    __slots__ = ("conn", "key", "endpoint")

    def __init__(self, conn: Connection, key: QPKey, endpoint: str | None) -> None:
        self.conn = conn
        self.key = key
        self.endpoint = endpoint  # the label of the connection's own endpoint


class MetricsExporter:
    """The counters of the listeners and connections it watches, as Prometheus metrics.

    ``watch_listener(listener)`` covers every connection that listener sets up from then on
    (and those it holds already), its endpoint's drops and its limits; ``watch_connection``
    covers one connection (e.g. a sender's from :func:`mrc.connect`) and its endpoint.
    ``registry`` is a ``prometheus_client`` registry holding the one collector that reads
    them; :meth:`render` encodes it for an HTTP ``Accept`` header, and
    :func:`mrc.metrics.serve` serves it over HTTP.
    """

    def __init__(self, max_finished: int = MAX_FINISHED) -> None:
        if max_finished < 0:
            raise ValueError(f"max_finished must be at least 0, not {max_finished}")
        self.max_finished = max_finished
        self._live: dict[int, _Watched] = {}  # id(conn) -> watched
        self._finished: OrderedDict[QPKey, _Totals] = OrderedDict()
        self._retired: dict[str, _Totals] = {}  # side -> the oldest closed, folded
        self._listeners: dict[Listener, str] = {}  # -> its endpoint's label
        self._endpoints: dict[str, Endpoint] = {}  # live endpoints of watched connections
        self._endpoints_closed: dict[str, _Totals] = {}
        self.connections_seen = 0
        self.connections_finished = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ---- what to watch -----------------------------------------------------------------

    def watch_listener(self, listener: Listener) -> None:
        """Watch ``listener``: its endpoint, its limits, and every connection it sets up."""
        if listener in self._listeners:
            return
        self._listeners[listener] = _endpoint_label(listener.endpoint)
        listener.on_connection(lambda conn: self._watch(conn, "listener", None))
        for conn in list(listener.connections):
            self._watch(conn, "listener", None)

    def watch_connection(self, conn: Connection) -> None:
        """Watch one connection (and its endpoint, unless a watched listener's)."""
        if any(conn.endpoint is li.endpoint for li in self._listeners):
            self._watch(conn, "listener", None)
        else:
            self._watch(conn, "connect", conn.endpoint)

    def _watch(self, conn: Connection, side: str, endpoint: Endpoint | None) -> None:
        if id(conn) in self._live:
            return
        key = (f"0x{conn.qpn:06x}", conn.peer_host, side)
        label = _endpoint_label(endpoint) if endpoint is not None else None
        watched = _Watched(conn, key, label)
        self._live[id(conn)] = watched
        self.connections_seen += 1
        if endpoint is not None and label is not None:
            self._endpoints.setdefault(label, endpoint)
        conn.on_close(lambda: self._closed(watched))

    def _closed(self, watched: _Watched) -> None:
        """``watched`` closed: keep its final counters (they must not vanish), drop the
        connection itself (it holds the QP, its buffers and sockets)."""
        if self._live.pop(id(watched.conn), None) is None:
            return
        self.connections_finished += 1
        totals = _qp_totals(watched.conn)
        previous = self._finished.pop(watched.key, None)
        if previous is not None:  # a QP number reused by the same peer: one series
            totals.add(previous)
        self._finished[watched.key] = totals
        if watched.endpoint is not None:
            ep = self._endpoints.pop(watched.endpoint, None)
            if ep is not None:
                closed = self._endpoints_closed.setdefault(watched.endpoint, _Totals())
                closed.add(_endpoint_totals(ep.core, ep))
        while len(self._finished) > self.max_finished:
            (_qp, _peer, side), oldest = self._finished.popitem(last=False)
            self._retired.setdefault(side, _Totals()).add(oldest)

    # ---- reading -----------------------------------------------------------------------

    def qp_totals(self) -> dict[QPKey, _Totals]:
        """Counters per QP series: live connections read now, plus closed ones' totals."""
        out: dict[QPKey, _Totals] = {}
        for side, totals in self._retired.items():
            out[("retired", "", side)] = _Totals(Counter(totals.counters), Counter(totals.drops))
        for key, totals in self._finished.items():
            out[key] = _Totals(Counter(totals.counters), Counter(totals.drops))
        for watched in self._live.values():
            now = _qp_totals(watched.conn)
            if watched.key in out:
                out[watched.key].add(now)
            else:
                out[watched.key] = now
        return out

    def endpoint_totals(self) -> dict[str, _Totals]:
        out: dict[str, _Totals] = {}
        for label, totals in self._endpoints_closed.items():
            out[label] = _Totals(Counter(totals.counters), Counter(totals.drops))
        live = [(label, li.endpoint) for li, label in self._listeners.items()]
        live += list(self._endpoints.items())
        for label, endpoint in live:
            out.setdefault(label, _Totals()).add(_endpoint_totals(endpoint.core, endpoint))
        return out

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The metrics encoded as the ``Accept`` header asks (OpenMetrics text for
        ``application/openmetrics-text``, else Prometheus text 0.0.4), and its content type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def live_connections(self) -> list[tuple[QPKey, Connection]]:
        """The watched connections not yet closed, with their labels."""
        return [(w.key, w.conn) for w in self._live.values()]

    def listeners(self) -> list[tuple[Listener, str]]:
        """The watched listeners and their labels (``[address]:port``)."""
        return list(self._listeners.items())


class _Collector:
    """The one collector of an exporter's registry: builds every family at scrape time."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        ex = self.exporter
        yield from _qp_families(ex)
        yield from _endpoint_families(ex)
        yield from _listener_families(ex)
        active = GaugeMetricFamily(
            "mrc_connections_active", "Watched connections set up and not yet closed"
        )
        active.add_metric([], len(ex._live))
        yield active
        seen = CounterMetricFamily(
            "mrc_connections", "Connections set up (listeners' and connect()ed ones watched)"
        )
        seen.add_metric([], ex.connections_seen)
        yield seen
        finished = CounterMetricFamily("mrc_connections_finished", "Watched connections closed")
        finished.add_metric([], ex.connections_finished)
        yield finished


def _qp_families(ex: MetricsExporter) -> Iterator[Metric]:
    totals = ex.qp_totals()
    live = _one_per_key(ex.live_connections())
    for name, specs in exported():
        labels = (*QP_LABELS, *(label for label, _value in specs[0].labels))
        help_text = family_help(name, specs)
        if specs[0].kind == "gauge":  # of live connections only
            gauge = GaugeMetricFamily(name, help_text, labels=labels)
            for key, conn in live.items():
                values = conn.counters()
                for spec in specs:
                    gauge.add_metric([*key, *(v for _l, v in spec.labels)], values[spec.name])
            yield gauge
            continue
        family = CounterMetricFamily(name, help_text, labels=labels)
        for key, t in totals.items():
            for spec in specs:
                family.add_metric([*key, *(v for _l, v in spec.labels)], t.counters[spec.name])
        yield family
    drops = CounterMetricFamily(*QP_DROPS[:2], labels=(*QP_LABELS, QP_DROPS[2]))
    for key, t in totals.items():
        for reason, n in sorted(t.drops.items()):
            drops.add_metric([*key, reason], n)
    yield drops
    states = GaugeMetricFamily(*QP_EV_STATES[:2], labels=(*QP_LABELS, QP_EV_STATES[2]))
    srtt = GaugeMetricFamily(*QP_SRTT[:2], labels=QP_LABELS)
    for key, conn in live.items():
        for state, n in _ev_states(conn).items():
            states.add_metric([*key, state], n)
        rtt = conn.qp.requester.rtt.srtt
        if rtt:
            srtt.add_metric(list(key), rtt)
    yield states
    yield srtt


def _one_per_key(live: list[tuple[QPKey, Connection]]) -> dict[QPKey, Connection]:
    """Live connections by key; of two under one key (a reused QP number), the first."""
    out: dict[QPKey, Connection] = {}
    for key, conn in live:
        out.setdefault(key, conn)
    return out


def _endpoint_families(ex: MetricsExporter) -> Iterator[Metric]:
    totals = ex.endpoint_totals()
    received = CounterMetricFamily(
        "mrc_endpoint_received_datagrams",
        "Datagrams an endpoint's UDP sockets received, for any QP or none",
        labels=("endpoint",),
    )
    drops = CounterMetricFamily(
        "mrc_endpoint_dropped_datagrams",
        "Datagrams dropped before reaching any QP, by reason (short, bad_version, unknown_qp)",
        labels=("endpoint", "reason"),
    )
    for label, t in sorted(totals.items()):
        received.add_metric([label], t.counters["datagrams_received"])
        for reason, n in sorted(t.drops.items()):
            drops.add_metric([label, reason], n)
    yield received
    yield drops


def _listener_families(ex: MetricsExporter) -> Iterator[Metric]:
    refused = CounterMetricFamily(
        "mrc_listener_refused",
        "Peers a listener refused because a limit was reached (setups: side-channel "
        "connections being set up, those dropped for a newcomer included, connections: live "
        "connections, granted_bytes: regions granted on request, memory_bytes: the memory "
        "among them)",
        labels=("listener", "limit"),
    )
    setups = GaugeMetricFamily(
        "mrc_listener_setups", "Side-channel connections being set up now", labels=("listener",)
    )
    conns = GaugeMetricFamily(
        "mrc_listener_connections",
        "Connections a listener holds now (set up, not closed)",
        labels=("listener",),
    )
    granted = GaugeMetricFamily(
        "mrc_listener_granted_bytes",
        "Bytes of regions granted on request to connections not yet closed",
        labels=("listener",),
    )
    memory = GaugeMetricFamily(
        "mrc_listener_memory_bytes",
        "Bytes of memory among the regions granted on request to connections not yet closed",
        labels=("listener",),
    )
    for listener, label in ex.listeners():
        ledger = listener.ledger
        for limit in LIMITS:
            refused.add_metric([label, limit], ledger.refused[limit])
        setups.add_metric([label], ledger.setups)
        conns.add_metric([label], ledger.connections)
        granted.add_metric([label], ledger.granted_bytes)
        memory.add_metric([label], ledger.memory_bytes)
    yield refused
    yield setups
    yield conns
    yield granted
    yield memory
