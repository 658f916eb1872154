"""Reading a metrics endpoint the way Prometheus does, for the metrics tests (library and CLI).

Samples are parsed with prometheus_client's own text parsers, so a test fails on anything a
real scraper would reject, not only on a wrong number.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0"

Labels = dict[str, str]


class Scrape:
    """One scrape's samples, by sample name (``mrc_qp_placed_bytes_total``)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = {f.name: f for f in families}
        self.samples: dict[str, list[tuple[Labels, float]]] = {}
        for family in self.families.values():
            for s in family.samples:
                self.samples.setdefault(s.name, []).append((dict(s.labels), s.value))

    @classmethod
    def parse(cls, text: str, openmetrics: bool = False) -> Scrape:
        parse = openmetrics_families if openmetrics else text_string_to_metric_families
        return cls(parse(text))

    def series(self, name: str, **labels: str) -> list[tuple[Labels, float]]:
        """The samples of ``name`` whose labels include ``labels``."""
        return [
            (lab, v)
            for lab, v in self.samples.get(name, [])
            if all(lab.get(k) == want for k, want in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float:
        """The sum over the matching series (0 when there is none)."""
        return sum(v for _lab, v in self.series(name, **labels))

    def value(self, name: str, **labels: str) -> float:
        """The one matching sample's value (fails unless exactly one matches)."""
        found = self.series(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {found}"
        return found[0][1]


def get(
    port: int, path: str = "/metrics", accept: str | None = None, method: str = "GET"
) -> tuple[int, str, str]:
    """(status, content type, body) of one request to ``[::1]:port`` (no proxies, unlike
    urllib, which honours http_proxy)."""
    conn = http.client.HTTPConnection("::1", port, timeout=10)
    try:
        conn.request(method, path, headers={"Accept": accept} if accept else {})
        res = conn.getresponse()
        return res.status, res.getheader("Content-Type") or "", res.read().decode()
    finally:
        conn.close()


def scrape(port: int, openmetrics: bool = False) -> Scrape:
    status, _ctype, body = get(port, accept=OPENMETRICS if openmetrics else None)
    assert status == 200, body
    return Scrape.parse(body, openmetrics)
