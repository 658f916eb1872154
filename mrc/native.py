"""The C extensions ``mrc._native`` and ``mrc._native_gcm``, loaded once and used as one.

Every C kernel of the package comes from here: :mod:`mrc.core.fastpath` (the train, burst and
sender's record kernels) and :mod:`mrc.transport.rxbatch` (the receive batch) take
:data:`module`'s functions when it is not None, and :mod:`mrc.security.packet` (keyed mode's
sealing and unsealing, with their AES-GCM) takes :data:`gcm`'s when it is not None; each takes
its pure-Python twins otherwise. Nothing else imports the extensions, and nothing asks which
kernels a build has: each built module's ``KERNEL_VERSION`` must be :data:`KERNEL_VERSION`, the
version of ``mrc/_native.c`` and ``mrc/_native_gcm.c`` this source was written against, or none
of either is used. A build of an older (or newer) source is *stale*: rebuilding it
(``tools/setup.sh``) is the cure, and until then every kernel is the Python one, never a mix no
test ran.

``mrc._native_gcm`` links OpenSSL's libcrypto, so it is built apart (setup.py): where it was
not (no OpenSSL headers, Debian's libssl-dev), ``mrc._native`` is used alone and keyed mode's
per-packet work is Python (:data:`gcm_reason` says why). That is the one partial set, and a
tested one: keyed mode's Python and C give the same bytes (tests/security).

``MRC_NATIVE=0`` in the environment (read once, at import) forces the Python kernels
everywhere; :func:`describe` says which kernels are in use, and if Python, why.

This module imports nothing from mrc (but the extensions) so that any layer may import it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import NamedTuple

#: the kernel version this source expects: ``#define KERNEL_VERSION`` in mrc/_native.c and in
#: mrc/_native_gcm.c (raise all three together whenever a kernel of either is added or changes
#: its arguments or results)
KERNEL_VERSION = 12

MAIN = "mrc._native"
GCM = "mrc._native_gcm"


def stale(name: str) -> str:
    """Why a built extension ``name`` of another KERNEL_VERSION is refused."""
    return f"{name} is stale: rebuild it with tools/setup.sh"


#: why a built ``mrc._native`` is refused (its KERNEL_VERSION is not :data:`KERNEL_VERSION`)
STALE = stale(MAIN)
#: why keyed mode's kernels are Python while the others are native (:data:`gcm_reason`)
NO_GCM = f"{GCM} is not built: it needs OpenSSL's headers, libssl-dev"


def check(candidate: object) -> str | None:
    """None when the built extension ``candidate`` may be used; otherwise why not: it is
    stale (:func:`stale`, for its name) unless its ``KERNEL_VERSION`` is exactly
    :data:`KERNEL_VERSION`, whatever kernels it holds."""
    if getattr(candidate, "KERNEL_VERSION", None) == KERNEL_VERSION:
        return None
    return stale(getattr(candidate, "__name__", MAIN))


class Loaded(NamedTuple):
    """What :func:`load` found: the extensions to use and, for each that is None, why."""

    module: ModuleType | None
    gcm: ModuleType | None
    reason: str | None
    gcm_reason: str | None


def load(environ: Mapping[str, str] | None = None) -> Loaded:
    """The extensions to use: both, ``mrc._native`` alone (``mrc._native_gcm`` does not
    import: :data:`NO_GCM`, or the loader's error), or neither (``MRC_NATIVE=0`` in
    ``environ``, default ``os.environ``; ``mrc._native`` not built; or either of them stale,
    :func:`check`)."""
    env = os.environ if environ is None else environ
    if env.get("MRC_NATIVE", "1").strip() == "0":
        return Loaded(None, None, "MRC_NATIVE=0", "MRC_NATIVE=0")
    try:
        main = importlib.import_module(MAIN)
    except ImportError:
        return Loaded(None, None, "not built", "not built")
    why = check(main)
    if why is not None:
        return Loaded(None, None, why, why)
    try:
        gcm = importlib.import_module(GCM)
    except ImportError as exc:
        # not built, or built but its libcrypto is gone: keyed mode's work stays Python
        missing = isinstance(exc, ModuleNotFoundError) and exc.name in (GCM, None)
        return Loaded(main, None, None, NO_GCM if missing else f"{GCM} does not load: {exc}")
    why = check(gcm)
    if why is not None:  # built from another source than the main one: neither is trusted
        return Loaded(None, None, why, why)
    return Loaded(main, gcm, None, None)


def summary(why: str | None, gcm_why: str | None = None) -> str:
    """:func:`describe`'s text for a load that gave ``why`` and ``gcm_why`` (None: that
    extension is used)."""
    if why is not None:
        return f"python ({why})"
    if gcm_why is not None:
        return f"native ({MAIN}; keyed mode python: {gcm_why})"
    return f"native ({MAIN}, {GCM})"


#: the extension of the data path's kernels (None: the Python twins are, see :data:`reason`)
module: ModuleType | None
#: the extension of keyed mode's kernels, used only beside :data:`module` (None: Python)
gcm: ModuleType | None
#: why :data:`module` is None: "MRC_NATIVE=0", "not built" or stale (None: it is not)
reason: str | None
#: why :data:`gcm` is None (None: it is not): as :data:`reason`, or :data:`NO_GCM`
gcm_reason: str | None
module, gcm, reason, gcm_reason = load()


def describe() -> str:
    """Which kernels are in use, for logs and ``-v`` output: ``native (mrc._native,
    mrc._native_gcm)``, ``native (mrc._native; keyed mode python: <why>)``, or
    ``python (<why>)``."""
    return summary(reason, gcm_reason)
