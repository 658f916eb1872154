"""Exceptions the fabric raises on purpose.

The CLI turns these into one ``mrc-fabric: error: ...`` line; anything else escaping is a bug.
"""


class FabricError(Exception):
    """A fabric operation failed for a reason the user can act on (exit code 1)."""

    exit_code = 1


class SpecError(FabricError):
    """Bad arguments: impossible sizes, unknown node names, malformed rate... (exit code 2)."""

    exit_code = 2
