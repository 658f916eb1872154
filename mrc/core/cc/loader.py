"""Window laws given as code, ``MODULE:CLASS``: loaded where a user names one, on purpose.

``MODULE`` is a module to import (``mylab.laws:Dctcp``) or the path of a Python file
(``examples/dctcp_window.py:Dctcp``). :func:`load` imports it (runs it), checks that
``CLASS`` is a window law, registers it (mrc/core/cc/registry.py) and returns the text
``QPConfig.cc`` then takes. Only this module imports code: the registry, ``QPConfig.validate``
and the QP look laws up and never load one, so a config, or a ``cc=`` setting received over a
network, names only what this process already loaded. The commands call :func:`load` on what
their user typed (``mrc-send --cc``, ``--qp cc=``, mrc-bench and its agents' ``--cc``, the
tools: ``mrc.cli.common.cc_arg``); a program calls it itself, or :func:`register`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from pathlib import Path
from typing import Any

from mrc.core.cc.registry import known, names, register_loaded


def load(text: str) -> str:
    """Make the window law ``text`` names usable in this process, and return the text
    ``QPConfig.cc`` takes for it. A registered name (``nscc``, ``fixed``) is returned as it is;
    ``MODULE:CLASS`` is imported (a law file's path made absolute, so that a process started
    elsewhere finds it too: the text returned), checked to be a window law and registered
    under the text returned, once per process however often it is loaded. ValueError, one
    line, for an unknown name, a module or file that does not load, or a class that is not a
    window law."""
    module_name, sep, attr = text.rpartition(":")
    if not sep:
        if not known(text):
            known_names = ", ".join(names())
            raise ValueError(f"cc must be one of {known_names} or MODULE:CLASS, not {text!r}")
        return text
    if not module_name.strip() or not attr.strip():
        raise ValueError(f"cc {text!r}: want MODULE:CLASS, a module or .py file and a class")
    spec = f"{Path(module_name).resolve()}:{attr}" if module_name.endswith(".py") else text
    if not known(spec):
        register_loaded(spec, _find(spec))
    return spec


# ---- internals -------------------------------------------------------------------------


def _find(spec: str) -> object:
    """What ``CLASS`` of ``MODULE:CLASS`` is, once its module is imported or file run."""
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError, SyntaxError) as exc:
        raise ValueError(f"cc {spec!r}: cannot load {module_name}: {exc}") from None
    law = getattr(module, attr, None)
    if law is None:
        raise ValueError(f"cc {spec!r}: {module_name} has no {attr!r}")
    return law


def _import_file(path: Path) -> Any:
    """The module of a law file, executed once per process however often it is named."""
    path = path.resolve()
    module_name = f"_mrc_law_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    found = importlib.util.spec_from_file_location(module_name, path)
    if found is None or found.loader is None:
        raise ImportError(f"not a Python file: {path}")
    module = importlib.util.module_from_spec(found)
    # in sys.modules before it runs: its dataclasses resolve their annotations through it
    sys.modules[module_name] = module
    try:
        found.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
