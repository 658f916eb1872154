"""``--qp KEY=VALUE``: set any ``QPConfig`` knob from a command line, the same way in every tool.

KEY is a field of :class:`~mrc.core.config.QPConfig` and VALUE is converted by the field's type
(an integer, a number, a boolean as 1/0/true/false/yes/no/on/off, a string; ``none`` for a
field that may be unset). ``cc.NAME=VALUE`` sets parameter NAME of the congestion-control law
(``QPConfig.cc_params``) through :func:`cc_param`. The option repeats, and later settings win.
An unknown key or a bad value is a one-line usage error naming the keys it is close to.

The settings stay text until they are applied: mrc-bench forwards them to its agents as they
were given, and each agent builds its QPConfig from them with the same :func:`apply_settings`.
mrc-send, mrc-bench and the failover demo's roles take ``--qp`` through :func:`add_qp_arg`.

A ``cc=MODULE:CLASS`` setting names code: the option's type, :func:`qp_setting`, loads it where
the user typed it (``mrc.core.cc.load``) and keeps the text that names the law it loaded (a law
file's path made absolute). :func:`parse_setting` and :func:`apply_settings` load nothing: they
only set ``cc``, which must name a law this process has registered or loaded, so settings that
come from elsewhere (mrc-bench's agents' requests) never run code.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Iterable
from functools import cache

from mrc.core.cc import load, param_from_text
from mrc.core.config import QPConfig

CC_PREFIX = "cc."
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_UNSET = ("none", "auto")

#: the PSN window of a QP whose window is at most a quarter of it (QPConfig's default)
BASE_PSN_WINDOW = QPConfig().psn_window

Convert = Callable[[str], object]


def cc_param(config: QPConfig, name: str, value: str) -> None:
    """``--qp cc.NAME=VALUE``: set parameter ``name`` of ``config``'s window law (``config.cc``)
    from ``value``, or raise ValueError (one line) if the law has no such parameter or the
    value does not fit it (the law's own ``Params`` dataclass says, mrc.core.cc.registry)."""
    config.cc_params = {**config.cc_params, name: param_from_text(config.cc, name, value)}


def with_window(config: QPConfig, window: int) -> QPConfig:
    """``config`` with ``window`` packets in flight at most (``max_outstanding``) and a PSN
    window to match: ``validate`` wants it at least the window, and four windows give a sender
    room to run ahead while the oldest packet is resent; never below the default, so small
    windows keep the default's span."""
    config.max_outstanding = window
    config.psn_window = max(BASE_PSN_WINDOW, 4 * window)
    return config


def parse_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` as (KEY, the value converted by KEY's type); a ``cc.`` KEY's value stays
    text (:func:`cc_param` reads it). Raises ValueError with a one-line reason."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"want KEY=VALUE (a QPConfig field), not {text!r}")
    if key.startswith(CC_PREFIX):
        if key == CC_PREFIX:
            raise ValueError(f"want cc.NAME=VALUE, not {text!r}")
        return key, raw
    convert = _converters().get(key)
    if convert is None:
        raise ValueError(_unknown(key))
    try:
        return key, convert(raw.strip())
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}, not {raw!r}") from None


def apply_settings(
    config: QPConfig,
    settings: Iterable[str],
    cc: Callable[[QPConfig, str, str], None] = cc_param,
) -> QPConfig:
    """``config`` with every ``KEY=VALUE`` of ``settings`` applied in order, the ``cc.`` keys
    last (through ``cc``), so that they are read as parameters of the law the settings end up
    choosing; it is not validated here (``QPConfig.validate``). Setting ``max_outstanding``
    sets the PSN window to match (:func:`with_window`) unless a ``psn_window`` setting is given
    as well. A ``cc`` setting only names a law, loaded already if it is code (see the module's
    docstring): nothing is imported here. Raises ValueError with a one-line reason."""
    parsed = [parse_setting(text) for text in settings]
    explicit_psn = any(key == "psn_window" for key, _value in parsed)
    for key, value in parsed:
        if key.startswith(CC_PREFIX):
            continue
        if key == "max_outstanding" and not explicit_psn:
            assert isinstance(value, int)
            with_window(config, value)
        else:
            setattr(config, key, value)
    for key, value in parsed:
        if key.startswith(CC_PREFIX):
            assert isinstance(value, str)
            cc(config, key.removeprefix(CC_PREFIX), value)
    return config


def qp_setting(text: str) -> str:
    """argparse type of ``--qp``: ``text`` itself, once it is known to apply (so that a bad one
    is a usage error at once, and the text can be forwarded as it is). A ``cc.`` parameter is
    only checked for its form here: which law it belongs to is known once every option is read
    (the commands apply and validate the whole config before they start). ``cc=LAW`` is the
    command line's edge for a window law: LAW is loaded here (``mrc.core.cc.load``) and the
    setting becomes ``cc=`` the text naming what was loaded (a law file's absolute path)."""
    try:
        key, value = parse_setting(text)
        if key == "cc":
            assert isinstance(value, str)
            law = load(value)
            if law != value:  # a law file's path, made absolute
                text = f"cc={law}"
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not key.startswith(CC_PREFIX):
        try:
            apply_settings(QPConfig(), [text])
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_qp_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup, applied: str = "") -> None:
    """``--qp KEY=VALUE`` (repeatable) into ``args.qp``, a list of the settings' texts."""
    p.add_argument(
        "--qp",
        type=qp_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a QPConfig field, e.g. --qp probe_interval=0.01 --qp route_dead_evs=0 "
        "(repeatable; booleans 1/0, 'none' to unset; cc.NAME=VALUE: a parameter of the "
        f"congestion-control law){applied}; see mrc/core/config.py",
    )


@cache
def _converters() -> dict[str, Convert]:
    """Per settable QPConfig field, how its text becomes its value."""
    hints = typing.get_type_hints(QPConfig)
    out: dict[str, Convert] = {}
    for f in dataclasses.fields(QPConfig):
        convert = _converter(hints[f.name])
        if convert is not None:
            out[f.name] = convert
    return out


def _converter(hint: object) -> Convert | None:
    """How text becomes a value of type ``hint`` (None: not settable as one value)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        convert = _converter(inner)
        if convert is None:
            return None
        return lambda raw: None if raw.lower() in _UNSET else convert(raw)
    if hint is bool:
        return _bool
    if hint is int:
        return _int
    if hint is float:
        return _float
    if hint is str:
        return str
    return None


def _bool(raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError("want a boolean (1/0, true/false, yes/no, on/off)")


def _int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("want an integer") from None


def _float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("want a number") from None
    if not math.isfinite(value):
        raise ValueError("want a finite number")
    return value


def _unknown(key: str) -> str:
    known = sorted(_converters())
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if close:
        return f"unknown QP setting {key!r} (did you mean {' or '.join(close)}?)"
    return f"unknown QP setting {key!r} (QPConfig fields: {', '.join(known)})"
