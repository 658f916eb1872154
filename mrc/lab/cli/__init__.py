"""The lab's commands, ``mrc-fabric`` and ``mrc-bench``, behind one guard.

Both build namespace fabrics with pyroute2, which ``pip install mrc-transport`` does not bring
(the transport does not need it): ``pip install 'mrc-transport[lab]'`` does. Without it the
commands say so in one line instead of failing with an import traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from typing import cast

#: what the lab needs beyond the library, and the extra that brings it
LAB_REQUIRES = ("pyroute2",)
LAB_EXTRA = "mrc-transport[lab]"


def missing() -> list[str]:
    """The lab's dependencies that cannot be imported here."""
    return [name for name in LAB_REQUIRES if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _run(prog: str, module: str, argv: Sequence[str] | None) -> int:
    absent = missing()
    if absent:
        print(
            f"{prog}: error: {prog} needs {', '.join(absent)}, which the lab extra brings:"
            f" pip install '{LAB_EXTRA}'",
            file=sys.stderr,
        )
        return 1
    main = cast(Callable[[Sequence[str] | None], int], importlib.import_module(module).main)
    return main(argv)


def fabric_main(argv: Sequence[str] | None = None) -> int:
    """``mrc-fabric``: :func:`mrc.lab.cli.fabric.main` once its dependencies are here."""
    return _run("mrc-fabric", "mrc.lab.cli.fabric", argv)


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``mrc-bench``: :func:`mrc.lab.cli.bench.main` once its dependencies are here."""
    return _run("mrc-bench", "mrc.lab.cli.bench", argv)
