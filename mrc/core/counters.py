"""How a counter is declared: once, beside what keeps it, with everything its outputs need.

A QP's counters live where they are incremented (``QPStats`` fields, ``EVSet`` attributes, the
transport's channel, the congestion window's ``counters()``), and every output that shows them
(``Connection.stats()``, the Prometheus exporter, ``--json`` of mrc-send and mrc-recv, their
JSON schemas, docs/METRICS.md) reads one registry of :class:`CounterSpec` (``mrc.counter_registry``)
instead of a list of its own. So a new counter is its declaration and nothing else:

* a ``QPStats`` field declared with :func:`counter` (its spec is the field's metadata);
* an ``EVSet`` attribute: a line of ``EV_COUNTERS`` beside the class;
* a counter of the transport or the congestion window: a line of ``mrc.counter_registry``.

Only names here: nothing is read or formatted in the core.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

Kind = Literal["counter", "gauge"]

#: ``json`` of a counter that mrc-send's / mrc-recv's ``--json`` prints (per stream and in
#: mrc-send's totals, summed)
SEND: tuple[str, ...] = ("send",)
RECV: tuple[str, ...] = ("recv",)
BOTH: tuple[str, ...] = ("send", "recv")

_SPEC = "mrc.counter"


class Source(enum.Enum):
    """What a counter is read from, for one connection."""

    QP = "QPStats"  # a field of the QP's ``QPStats`` (``qp.stats``)
    EVS = "EVSet"  # an attribute of its EV set (``qp.evs``)
    CHANNEL = "channel"  # an attribute of the transport's channel of the connection
    CC = "cc"  # a key of the congestion window's ``counters()`` (0 without one)


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """One counter: ``name`` is its key in ``Connection.stats()`` (or ``ev_counters()``),
    ``help`` its one line for people (Prometheus HELP, schema description, METRICS.md).

    ``metric``: its Prometheus family (without ``_total``), None if not exported; counters
    sharing one family are told apart by ``labels``. ``attr``: where it is read from its
    ``source`` when that is not ``name`` (a dotted path). ``json``: the ``--json`` outputs that
    print it (:data:`SEND`, :data:`RECV`), under ``json_key`` if that is given."""

    name: str
    source: Source
    help: str
    kind: Kind = "counter"
    metric: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    attr: str | None = None
    json: tuple[str, ...] = ()
    json_key: str | None = None

    @property
    def key(self) -> str:
        """Its key in ``--json``."""
        return self.json_key or self.name

    def read(self, obj: object) -> int:
        """Its value on ``obj``, the object its source names."""
        value: int = attrgetter(self.attr or self.name)(obj)
        return value


def counter(
    help: str,
    *,
    kind: Kind = "counter",
    metric: str | None = None,
    labels: tuple[tuple[str, str], ...] = (),
    json: tuple[str, ...] = (),
    json_key: str | None = None,
) -> Any:
    """A dataclass field that is a counter (0 to start with), declared as such: use for a
    field of a counters class, read back with :func:`counters_of`."""
    declared = {
        "help": help,
        "kind": kind,
        "metric": metric,
        "labels": labels,
        "json": json,
        "json_key": json_key,
    }
    return dataclasses.field(default=0, metadata={_SPEC: declared})


def counters_of(cls: type, source: Source) -> tuple[CounterSpec, ...]:
    """The counters declared (with :func:`counter`) as fields of dataclass ``cls``, in order."""
    return tuple(
        CounterSpec(f.name, source, **f.metadata[_SPEC])
        for f in dataclasses.fields(cls)
        if _SPEC in f.metadata
    )
