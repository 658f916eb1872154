"""The one error hierarchy of the package.

Every exception mrc raises on purpose derives from :class:`MRCError`, so a caller (or a
command's ``main``, see :func:`mrc.cli.common.run_main`) can catch one class and print one
line. Subclasses exist only where a caller needs to tell cases apart; the message itself always
says what happened.
"""

from __future__ import annotations


class MRCError(Exception):
    """A failure to report to a user as one line (no traceback). Exit status 1."""

    exit_code = 1


class UsageError(MRCError):
    """Bad arguments or configuration: an impossible size, an unknown node name, a malformed
    rate... The user has to change the command line, hence its own exit status (2, as argparse
    uses for usage errors)."""

    exit_code = 2


class FabricError(MRCError):
    """A fabric operation failed for a reason the user can act on (no topology file, a missing
    namespace, not root...). Separate because ``mrc-fabric exec`` falls back to the naming
    pattern of namespaces when the topology cannot be loaded, and ``Fabric.up`` passes these
    through but wraps anything else."""


class AgentError(MRCError):
    """An ``mrc-bench`` agent failed a request or died. Separate because the coordinator counts
    such a failure against one step (and reconnects) instead of ending the run."""


class WriteError(MRCError):
    """A posted write that will not complete. ``status`` is how it ended, the phrase of a
    :class:`mrc.core.events.WCStatus` ("remote access error", "retry exceeded", "flushed"...),
    as a verbs work completion reports it per work request: the write whose packet made the
    QP fail carries the cause, every other one still pending was flushed."""

    def __init__(self, message: str, status: str = "flushed") -> None:
        super().__init__(message)
        self.status = status


class TooManyImmediates(MRCError):
    """A WRITE_IMM posted while ``QPConfig.max_imm_outstanding`` of them are not yet
    completed (mrc.h's MRC_QP_MAX_WIMM). ``Connection.write`` waits for room instead; a
    caller of the sans-IO ``post_write`` must wait for a completion itself."""
