"""Reading what a child printed: its results (the JSON objects) and its last words."""

from __future__ import annotations

import json
from typing import Any


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` that is a JSON object, in order: the results of a child that
    prints one per piece of work (``mrc-recv --count N``, one per transfer).

    A line that starts like an object but does not parse (cut short, or a log line that happens
    to start with a brace) is skipped: the results printed around it still count."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object (:func:`json_objects`), or None: the
    result of a child that prints one."""
    found = json_objects(text)
    return found[-1] if found else None


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank ("" if none): a failed child's reason."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
