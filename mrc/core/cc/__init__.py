"""Congestion control as window laws: what the requester asks of one (:class:`WindowLaw`),
the ones that ship (``fixed``, ``nscc``, also named ``uet-1.0-nscc`` as in mrc_ctl.h,
``nscc-mrc``), the registry that names them and :func:`load`, which loads a law given as
code, ``MODULE:CLASS`` (docs/CONGESTION.md, "Writing a window law")."""

from mrc.core.cc.base import LawContext, NoParams, WindowLaw
from mrc.core.cc.fixed import FixedWindow
from mrc.core.cc.loader import load
from mrc.core.cc.nscc import MrcNscc, MrcNsccParams
from mrc.core.cc.registry import (
    create,
    law_class,
    names,
    param_from_text,
    params_of,
    register,
)
from mrc.core.cc.uet import UetNscc, UetNsccParams

__all__ = [
    "FixedWindow",
    "LawContext",
    "NoParams",
    "MrcNscc",
    "MrcNsccParams",
    "UetNscc",
    "UetNsccParams",
    "WindowLaw",
    "create",
    "law_class",
    "load",
    "names",
    "param_from_text",
    "params_of",
    "register",
]
