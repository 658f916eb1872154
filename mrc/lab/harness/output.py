"""Reading what a child printed: its result (the last JSON object) and its last words."""

from __future__ import annotations

import json
from typing import Any


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object, or None.

    A line that starts like an object but does not parse (cut short, or a log line that happens
    to start with a brace) is skipped rather than ending the search: a result printed before it
    is still the result."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank ("" if none): a failed child's reason."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
