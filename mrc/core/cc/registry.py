"""Window laws by name, and their parameters from dicts and text.

``QPConfig.cc`` names a law registered here: ``fixed``, ``nscc``, ``nscc-mrc``,
``uet-1.0-nscc`` (:data:`UET_NSCC`, ``nscc`` by the name mrc_ctl.h gives it), one a program
registered with :func:`register`, or a ``MODULE:CLASS`` law that :func:`mrc.core.cc.load`
(mrc/core/cc/loader.py) loaded in this process and registered under the text it returned.
Everything here only looks laws up: checking a config (``QPConfig.validate``) or making a law
never imports a module or runs a file. The commands load the laws a user names where the user
names them (``mrc-send --cc``, ``--qp cc=``, mrc-bench and its agents' command lines, the
tools), so no name that arrives from the network, or is merely written in a config, runs code.

``QPConfig.cc_params`` holds the law's parameters as plain values (name -> int, float or
bool); :func:`params_of` turns them into the law's ``Params`` dataclass, checked field by
field, and :func:`param_from_text` converts one from text (``--qp cc.min_window=0.5``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from mrc.core.cc.base import LawContext, QPSettings, WindowLaw
from mrc.core.cc.fixed import FixedWindow
from mrc.core.cc.nscc import MrcNscc
from mrc.core.cc.uet import UetNscc

Value = int | float | bool

#: the algorithm string OCP's mrc_ctl.h defines for UET 1.0 NSCC
#: (``mrc_ctl_device_attr.cc.algorithms``): another name of ``nscc``, the same law, so that a
#: CC profile written for mrc_ctl names one here as it is
UET_NSCC = "uet-1.0-nscc"

_LAWS: dict[str, type[WindowLaw]] = {}
_KINDS_OF: dict[type, dict[str, type]] = {}  # a Params class -> _kinds(it)
#: the types a parameter may have, and the text each accepts
_KINDS = (bool, int, float)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def register(name: str, law: type[WindowLaw]) -> None:
    """Make ``law`` available as ``QPConfig(cc=name)`` in this process (a name registered
    again is replaced: a law under development can be reloaded)."""
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"a window law's name is a word without ':', not {name!r}")
    _check_law(law, name)
    _LAWS[name] = law


def names() -> list[str]:
    """The registered names (not ``MODULE:CLASS`` laws loaded so far), sorted."""
    return sorted(n for n in _LAWS if ":" not in n)


def known(name: str) -> bool:
    """Whether ``name`` is registered: a name, or a ``MODULE:CLASS`` loaded so far."""
    return name in _LAWS


def law_class(name: str) -> type[WindowLaw]:
    """The law registered as ``name``; ValueError, one line, if none (a ``MODULE:CLASS`` law
    must have been loaded first: :func:`mrc.core.cc.load`, which this never does)."""
    law = _LAWS.get(name)
    if law is None:
        raise ValueError(
            f"cc must be one of {', '.join(names())} or a law loaded with"
            f' mrc.core.cc.load("MODULE:CLASS"), not {name!r}'
        )
    return law


def register_loaded(spec: str, law: object) -> type[WindowLaw]:
    """Register ``law``, which :func:`mrc.core.cc.load` found, under ``spec``, the
    ``MODULE:CLASS`` text it returns; checked as :func:`register` checks a law."""
    if ":" not in spec:
        raise ValueError(f"a loaded window law's name is MODULE:CLASS, not {spec!r}")
    checked = _check_law(law, spec)
    _LAWS[spec] = checked
    return checked


def params_of(name: str, values: Mapping[str, object]) -> Any:
    """Law ``name``'s ``Params`` from ``values`` (``QPConfig.cc_params``): every key one of
    its fields, every value of the field's type (an int does for a float), checked by its
    ``validate()``. ValueError, one line naming the key or value, otherwise."""
    params = law_class(name).Params
    if not isinstance(values, Mapping):
        raise ValueError(f"cc_params must be a dict of parameter values, not {values!r}")
    kinds = _kinds(params)
    given: dict[str, Value] = {}
    for key, value in values.items():
        kind = _kind(name, kinds, key)
        fitted = _as_kind(value, kind)
        if fitted is None:
            raise ValueError(f"cc.{key} must be {_a(kind)}, not {value!r}")
        given[key] = fitted
    made = params(**given)
    validate = getattr(made, "validate", None)
    if validate is not None:
        validate()
    return made


def param_from_text(name: str, key: str, text: str) -> Value:
    """Parameter ``key`` of law ``name`` from text, as its field's type: ``16``, ``0.25``,
    ``true``. ValueError, one line, for an unknown key or a value of another type; the value's
    range is checked by :func:`params_of` (``QPConfig.validate``)."""
    kind = _kind(name, _kinds(law_class(name).Params), key)
    word = text.strip()
    if kind is bool:
        if word.lower() in _TRUE:
            return True
        if word.lower() in _FALSE:
            return False
    else:
        try:
            return int(word) if kind is int else float(word)
        except ValueError:
            pass
    raise ValueError(f"cc.{key} must be {_a(kind)}, not {text!r}")


def create(name: str, values: Mapping[str, object], config: QPSettings) -> WindowLaw:
    """A new instance of law ``name`` for a QP of ``config`` (its ``QPConfig``), with
    parameters ``values``: the law is given the :class:`LawContext` of ``config``."""
    return law_class(name)(params_of(name, values), LawContext.of(config))


# ---- internals -------------------------------------------------------------------------


def _check_law(law: object, name: str) -> type[WindowLaw]:
    """``law`` if it is a window law whose parameters are plain values; else ValueError."""
    if not (isinstance(law, type) and issubclass(law, WindowLaw)):
        raise ValueError(f"cc {name!r} is not a window law (a subclass of WindowLaw)")
    params = law.Params
    if not dataclasses.is_dataclass(params):
        raise ValueError(f"cc {name!r}: its Params is not a dataclass")
    _kinds(params)
    return law


def _kinds(params: type[Any]) -> dict[str, type]:
    """Field name -> int, float or bool, for every field of a law's ``Params`` (worked out
    once per class: every QP's config is checked against it)."""
    kinds = _KINDS_OF.get(params)
    if kinds is not None:
        return kinds
    hints = typing.get_type_hints(params)
    kinds = {}
    for f in dataclasses.fields(params):
        kind = hints.get(f.name)
        if kind not in _KINDS:
            raise ValueError(f"parameter {f.name} of {params.__name__} is not int, float or bool")
        kinds[f.name] = kind
    _KINDS_OF[params] = kinds
    return kinds


def _kind(name: str, kinds: dict[str, type], key: str) -> type:
    kind = kinds.get(key)
    if kind is None:
        known = ", ".join(kinds) or "none"
        raise ValueError(f"cc.{key}: window law {name} has no such parameter (it has: {known})")
    return kind


def _as_kind(value: object, kind: type) -> Value | None:
    """``value`` as a parameter of type ``kind``, or None if it is none: an int does for a
    float (and becomes one), a bool is no number."""
    if isinstance(value, bool):
        return value if kind is bool else None
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, int | float):
        return float(value)
    return None


def _a(kind: type) -> str:
    return {bool: "true or false", int: "an integer", float: "a number"}[kind]


register("fixed", FixedWindow)
register("nscc", UetNscc)
register(UET_NSCC, UetNscc)  # the same class: the same parameters, windows and shared base
register("nscc-mrc", MrcNscc)
