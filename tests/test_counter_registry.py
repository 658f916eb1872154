"""The counter registry (mrc.counter_registry) is the one list of a QP's counters: every output
reads it, and the documents that list counters (docs/METRICS.md, the mrc-send/mrc-recv schemas)
are generated from it, so they cannot drift from what the code reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mrc import counter_registry as registry
from mrc.core import QPConfig, QueuePair
from mrc.core.counters import BOTH, Source
from mrc.core.memory import ProtectionDomain
from mrc.core.stats import QPStats
from mrc.metrics import reference
from mrc.metrics.exporter import exported


class _Channel:
    send_errors = 3
    ce_received = 4
    queue_marks = 6


def test_the_generated_documents_are_up_to_date(tmp_path: Path) -> None:
    stale = reference.stale()
    assert not stale, f"run python -m mrc.metrics.reference --write: {stale}"
    # and the generator finds a counter missing from a schema, and puts it back
    docs = tmp_path / "docs"
    (docs / "schemas").mkdir(parents=True)
    for path, text in reference.documents().items():
        (docs / path.relative_to(reference.ROOT / "docs")).write_text(text)
    schema = docs / "schemas" / "mrc-recv.schema.json"
    schema.write_text(schema.read_text().replace('"ce_received"', '"ce_gone"'))
    assert reference.stale(tmp_path) == [schema]
    assert reference.main(["--write", "--root", str(tmp_path)]) == 0
    assert reference.stale(tmp_path) == [] and '"ce_received"' in schema.read_text()


def test_every_counter_is_declared_once_and_every_stats_field_is_a_counter() -> None:
    names = [spec.name for spec in registry.COUNTERS]
    assert len(names) == len(set(names))
    fields = [f.name for f in dataclasses.fields(QPStats) if f.name != "dropped_by_reason"]
    assert [s.name for s in registry.of(Source.QP)] == fields
    for tool in ("send", "recv"):
        keys = [spec.key for spec in registry.in_json(tool)]
        assert len(keys) == len(set(keys)), tool
    for spec in registry.of(Source.EVS):
        assert spec.json == BOTH  # both ends keep EV health


def test_families_of_several_counters_have_their_own_help_and_distinct_labels() -> None:
    for name, specs in exported():
        if len(specs) > 1:
            assert name in registry.FAMILY_HELP, name
            assert len({s.labels for s in specs}) == len(specs), name
            assert len({tuple(label for label, _v in s.labels) for s in specs}) == 1, name
            assert len({s.kind for s in specs}) == 1, name
        else:
            assert not specs[0].labels, name


def test_read_takes_every_counter_from_where_it_is_declared() -> None:
    qp = QueuePair(1, ProtectionDomain(), list(range(5000, 5008)), config=QPConfig())
    qp.stats.packets_sent = 7
    qp.evs.assumed_bad = 2
    qp.evs.ce.penalties = 5
    got = registry.read(qp, _Channel())
    assert list(got) == [spec.name for spec in registry.COUNTERS]
    assert got["packets_sent"] == 7 and got["evs_assumed_bad"] == 2
    assert got["evs_penalized"] == 5 and got["send_errors"] == 3 and got["ce_received"] == 4
    assert got["queue_marks"] == 6
    assert {k: got[k] for k in qp.evs.counters()} == qp.evs.counters()
