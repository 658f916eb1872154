"""What mrc-send and mrc-recv print with --json matches docs/schemas/, key for key.

The schemas forbid keys they do not list, so a key added to, renamed in or dropped from a tool's
output without its schema fails here: machines reading the output can trust the documents.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _schema(tool: str) -> dict[str, object]:
    schema = json.loads((SCHEMAS / f"{tool}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_a_transfer_matches_both_schemas(mrc_tools, mrc_port: int) -> None:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json")
    recv.wait_listening(mrc_port)
    sent = mrc_tools.run("mrc-send", "--size", "2M", "--to", f"[::1]:{mrc_port}", "--json")
    assert sent.returncode == 0, sent.describe()
    got = recv.wait()
    assert got.returncode == 0, got.describe()
    jsonschema.validate(sent.json, _schema("mrc-send"))
    jsonschema.validate(got.json, _schema("mrc-recv"))


def test_the_schemas_reject_what_they_do_not_describe() -> None:
    send = _schema("mrc-send")
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({"version": "0", "ok": True, "surprise": 1}, send)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": "0", "ok": "yes"}, _schema("mrc-recv"))
