"""Fixtures for fabric tests (helpers live in fabric_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fabric_helpers import SKIP_REASON, running_fabric, unique_name

from mrc.lab.fabric import FabricSpec, Topology


@pytest.fixture(scope="module")
def fabric() -> Iterator[Topology]:
    """The default fabric (4 planes x 2 spines x 2 leaves, 4 hosts), one per test module."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    with running_fabric(FabricSpec(name=unique_name("m"))) as topo:
        yield topo
