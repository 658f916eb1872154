"""The C extension ``mrc._native``, loaded once and used whole or not at all.

Every C kernel of the package comes from here: :mod:`mrc.core.fastpath` (the train, burst and
sender's record kernels), :mod:`mrc.transport.rxbatch` (the receive batch) and
:mod:`mrc.security.packet` (keyed mode's sealing and unsealing) each take :data:`module`'s
functions when it is not None and their pure-Python twins when it is. Nothing else imports
``mrc._native``, and nothing asks which kernels a build has: the built module's
``KERNEL_VERSION`` must be :data:`KERNEL_VERSION`, the version of ``mrc/_native.c`` this
source was written against, or none of it is used. A build of an older (or newer) source is
*stale*: rebuilding it (``tools/setup.sh``) is the cure, and until then every kernel is the
Python one, never a mix no test ran.

``MRC_NATIVE=0`` in the environment (read once, at import) forces the Python kernels
everywhere; :func:`describe` says which kernels are in use, and if Python, why.

This module imports nothing from mrc (but the extension) so that any layer may import it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType

#: the kernel version this source expects: ``#define KERNEL_VERSION`` in mrc/_native.c (raise
#: both together whenever a kernel is added or changes its arguments or results)
KERNEL_VERSION = 6

#: why a built extension is refused (its KERNEL_VERSION is not :data:`KERNEL_VERSION`)
STALE = "mrc._native is stale: rebuild it with tools/setup.sh"


def check(candidate: object) -> str | None:
    """None when the built extension ``candidate`` may be used; otherwise why not: it is
    :data:`STALE` unless its ``KERNEL_VERSION`` is exactly :data:`KERNEL_VERSION`, whatever
    kernels it holds."""
    if getattr(candidate, "KERNEL_VERSION", None) == KERNEL_VERSION:
        return None
    return STALE


def load(environ: Mapping[str, str] | None = None) -> tuple[ModuleType | None, str | None]:
    """``(extension, None)`` when ``mrc._native`` is to be used, ``(None, why)`` when not:
    ``MRC_NATIVE=0`` in ``environ`` (default: ``os.environ``), not built, or stale
    (:func:`check`)."""
    env = os.environ if environ is None else environ
    if env.get("MRC_NATIVE", "1").strip() == "0":
        return None, "MRC_NATIVE=0"
    try:
        candidate = importlib.import_module("mrc._native")
    except ImportError:
        return None, "not built"
    why = check(candidate)
    return (None, why) if why is not None else (candidate, None)


def summary(why: str | None) -> str:
    """:func:`describe`'s text for a load that gave ``why`` (None: the extension is used)."""
    return "native (mrc._native)" if why is None else f"python ({why})"


#: the extension, every kernel of which is used (None: the Python twins are, see :data:`reason`)
module: ModuleType | None
#: why :data:`module` is None: "MRC_NATIVE=0", "not built" or :data:`STALE` (None: it is not)
reason: str | None
module, reason = load()


def describe() -> str:
    """Which kernels are in use, for logs and ``-v`` output: ``native (mrc._native)``, or
    ``python (<why>)``."""
    return summary(reason)
