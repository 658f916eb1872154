"""The one error hierarchy of the package.

Every exception mrc raises on purpose derives from :class:`MRCError`, so a caller (or a
command's ``main``) can catch one class and print one line. Subclasses exist only where a
caller needs to tell cases apart; the message itself always says what happened.
"""

from __future__ import annotations


class MRCError(Exception):
    """A failure to report to a user as one line (no traceback). Exit status 1."""

    exit_code = 1
