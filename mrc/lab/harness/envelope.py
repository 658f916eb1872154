"""The JSON object every benchmark and demo prints.

It opens with the same fields everywhere: ``tool`` (which program, the name of its schema in
docs/schemas/), ``machine`` (:func:`mrc.lab.harness.machine.machine_info`) and, stamped by
:func:`mrc.cli.common.emit_json`, ``version``; then the tool's own fields: ``config`` and
``results`` where the tool has those sections, its documented top-level fields where it predates
them. A reader finds out what measured what without knowing the tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mrc.cli.common import emit_json


def envelope(tool: str, machine: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` in the envelope; a ``tool`` or ``machine`` field of its own would be ambiguous."""
    clash = {"tool", "machine", "version"} & body.keys()
    if clash:
        raise ValueError(f"the envelope's fields {sorted(clash)} are not a tool's own")
    return {"tool": tool, "machine": dict(machine), **body}


def emit(
    tool: str, machine: Mapping[str, Any], body: Mapping[str, Any], indent: int | None = None
) -> None:
    """Print ``body`` in the envelope, as one JSON object on stdout."""
    emit_json(envelope(tool, machine, body), indent=indent)
