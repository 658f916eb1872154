"""``Fabric``: the one-stop Python API (what the CLI and tests call)."""

from __future__ import annotations

from typing import Any

from mrc.topology.model import Link, Topology, load_topology

from . import builder, control, teardown
from .spec import FabricSpec


class Fabric:
    """Namespace for fabric operations; all static, state lives in the kernel and the file."""

    @staticmethod
    def up(spec: FabricSpec) -> Topology:
        """Build the fabric and write /run/mrc/fabric-<name>.json; raise FabricError."""
        return builder.up(spec)

    @staticmethod
    def down(name: str) -> list[str]:
        """Remove everything of fabric ``name`` (idempotent); return removed namespaces."""
        builder.require_root()
        return teardown.down(name)

    @staticmethod
    def list() -> dict[str, dict[str, Any]]:
        return teardown.list_fabrics()

    @staticmethod
    def status(name_or_topology: str | Topology) -> dict[str, Any]:
        return control.status(_topo(name_or_topology))

    @staticmethod
    def link(name_or_topology: str | Topology, x: str, y: str, up: bool) -> Link:
        return control.set_link(_topo(name_or_topology), x, y, up)


def _topo(t: str | Topology) -> Topology:
    return t if isinstance(t, Topology) else load_topology(t)
