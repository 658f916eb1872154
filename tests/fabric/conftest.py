"""Fixtures for fabric tests (helpers live in fabric_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fabric.fabric_helpers import SKIP_REASON, running_fabric, unique_name

from mrc.lab.fabric import FabricSpec, Topology
from mrc.topology.model import SRV6_MODES


@pytest.fixture(scope="module", params=SRV6_MODES)
def fabric(request: pytest.FixtureRequest) -> Iterator[Topology]:
    """The default fabric (4 planes x 2 spines x 2 leaves, 4 hosts), one per test module, with
    each kind of route (uSID containers, the default, and SRHs)."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    with running_fabric(FabricSpec(name=unique_name("m"), srv6=request.param)) as topo:
        yield topo
