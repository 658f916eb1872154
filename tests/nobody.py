"""Running mrc as the unprivileged user nobody (uid 65534), for the tests that show what a user
without privileges sees. From a checkout that nobody cannot reach (one under /root, which
Debian and Ubuntu make 0700) those tests cannot run at all: they skip, saying why, instead of
failing on a Permission denied that says nothing about mrc."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@functools.cache
def why_nobody_cannot_run_mrc() -> str | None:
    """None if user nobody can import mrc from this interpreter's environment; else why not."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv (util-linux) to drop to user nobody"
    done = subprocess.run(
        [*NOBODY, sys.executable, "-c", "import mrc"],
        cwd="/",
        capture_output=True,
        timeout=60,
    )
    if done.returncode != 0:
        return (
            f"user nobody cannot import mrc from {sys.prefix}: a directory above it is closed"
            " to others (as /root is); run the tests from a checkout outside /root"
        )
    return None
