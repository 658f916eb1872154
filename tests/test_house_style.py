"""Rules the whole package keeps, checked over every module rather than by reading code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import mrc
from mrc.errors import MRCError


def _modules() -> list[str]:
    def fail(name: str) -> None:  # a package whose __init__ fails is not skipped silently
        raise AssertionError(f"cannot import package {name}")

    names = [m.name for m in pkgutil.walk_packages(mrc.__path__, "mrc.", onerror=fail)]
    assert "mrc.errors" in names and "mrc.cli.common" in names
    return ["mrc", *names]


def test_every_exception_class_is_an_mrc_error() -> None:
    """One hierarchy: a caller catches MRCError and prints one line (see mrc/errors.py)."""
    strays = []
    for name in _modules():
        module = importlib.import_module(name)  # an import error fails the test
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if (
                cls.__module__ == name
                and issubclass(cls, BaseException)
                and not issubclass(cls, MRCError)
            ):
                strays.append(f"{name}.{cls_name}")
    assert not strays, f"exception classes outside mrc.errors.MRCError: {strays}"
