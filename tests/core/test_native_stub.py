"""The boundary of the C extensions (issue 38, items 3 and 4): mrc.native loads ``mrc._native``
and ``mrc._native_gcm`` once and uses them whole or not at all (or the first alone, where the
second was not built: no OpenSSL headers), and mrc/_native.pyi and mrc/_native_gcm.pyi say what
they hold.

* Each stub against its built module: the same public names both ways (functions, types and
  their attributes, ``KERNEL_VERSION``), and each function's parameter count: from
  ``__text_signature__`` where the builtin has one, else from the count its own ``TypeError``
  states when called with too many arguments (a kernel whose message says neither is skipped).
  Skipped when the extension is not built, or is stale (it then describes an older source).
* The loader: a module reporting another ``KERNEL_VERSION`` is refused, and the other with it,
  with :func:`mrc.native.describe`'s text; ``MRC_NATIVE=0`` and an unbuilt extension likewise;
  a missing ``mrc._native_gcm`` leaves keyed mode alone on Python; and in a fresh interpreter a
  stale build holding every kernel leaves every consumer on Python.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterable
from pathlib import Path

import pytest

from mrc import native

ROOT = Path(__file__).resolve().parent.parent.parent
#: each extension: its name, stub and source
EXTENSIONS = {
    name: (ROOT / "mrc" / f"{name}.pyi", ROOT / "mrc" / f"{name}.c")
    for name in ("_native", "_native_gcm")
}

STALE_TEXT = "python (mrc._native is stale: rebuild it with tools/setup.sh)"
GCM_STALE_TEXT = "python (mrc._native_gcm is stale: rebuild it with tools/setup.sh)"
BOTH = "native (mrc._native, mrc._native_gcm)"
NO_GCM_TEXT = f"native (mrc._native; keyed mode python: {native.NO_GCM})"

#: the count a builtin's TypeError states: "takes 14 or 15 arguments", "takes at most 7
#: arguments", "takes exactly 3 arguments"
_TAKES = re.compile(r"takes (?:(at most|exactly) )?(\d+)(?: or (\d+))? (?:positional )?argument")


def _public(names: Iterable[str]) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def _stub(name: str = "_native") -> ast.Module:
    stub = EXTENSIONS[name][0]
    return ast.parse(stub.read_text(), str(stub))


def _stub_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """Public names a stub body defines (functions, classes, annotated names; not imports)."""
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return {k: v for k, v in out.items() if not k.startswith("_")}


def _arity(fn: ast.FunctionDef, drop_self: bool = False) -> tuple[int, int]:
    """(required, total) positional parameters of a stub function."""
    params = [*fn.args.posonlyargs, *fn.args.args]
    if drop_self:
        params = params[1:]
    return len(params) - len(fn.args.defaults), len(params)


def _built(name: str = "_native") -> types.ModuleType:
    try:
        module = importlib.import_module(f"mrc.{name}")
    except ImportError:
        pytest.skip(f"mrc.{name} is not built here (tools/setup.sh builds it)")
    if native.check(module) is not None:
        version = getattr(module, "KERNEL_VERSION", None)
        pytest.skip(
            f"{native.STALE} (it is KERNEL_VERSION {version}, the source {native.KERNEL_VERSION})"
        )
    return module


def _claimed(obj: object) -> tuple[int | None, int] | None:
    """(required or None, total) as the builtin says: its text signature, else the count its
    TypeError states for a call with far too many arguments; None: it says neither."""
    if getattr(obj, "__text_signature__", None):
        params = list(inspect.signature(obj).parameters.values())  # type: ignore[arg-type]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return None
        required = sum(p.default is p.empty for p in params)
        return required, len(params)
    try:
        obj(*[None] * 64)  # type: ignore[operator]
    except TypeError as exc:
        m = _TAKES.search(str(exc))
    else:  # pragma: no cover - no kernel takes 64 arguments
        return None
    if m is None:
        return None
    low, high = int(m.group(2)), int(m.group(3) or m.group(2))
    return (None if m.group(1) == "at most" else low), high


@pytest.mark.parametrize("name", EXTENSIONS)
def test_the_loader_expects_the_version_of_the_c_source(name: str) -> None:
    source = EXTENSIONS[name][1]
    m = re.search(r"^#define KERNEL_VERSION (\d+)$", source.read_text(), re.MULTILINE)
    assert m is not None
    assert int(m.group(1)) == native.KERNEL_VERSION


@pytest.mark.parametrize("name", EXTENSIONS)
def test_the_stub_and_the_built_module_name_the_same_things(name: str) -> None:
    module = _built(name)
    stub = _stub_names(_stub(name).body)
    built = _public(dir(module))
    assert sorted(set(stub) - built) == [], "in mrc/_native.pyi, not in the built module"
    assert sorted(built - set(stub)) == [], "in the built module, not in mrc/_native.pyi"
    for name, node in stub.items():
        if isinstance(node, ast.ClassDef):
            assert isinstance(getattr(module, name), type), name
            attrs = _stub_names(node.body)
            attrs.pop("__init__", None)
            have = _public(dir(getattr(module, name)))
            assert sorted(set(attrs) ^ have) == [], f"{name}: attributes differ"
        elif isinstance(node, ast.FunctionDef):
            assert callable(getattr(module, name)), name


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_the_stub_gives_each_kernel_its_parameter_count(ext: str) -> None:
    module = _built(ext)
    checked: list[str] = []
    for name, node in _stub_names(_stub(ext).body).items():
        if isinstance(node, ast.FunctionDef):
            required, total = _arity(node)
        elif isinstance(node, ast.ClassDef):
            init = next(
                (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None,
            )
            if init is None:
                continue
            required, total = _arity(init, drop_self=True)
        else:
            continue
        claimed = _claimed(getattr(module, name))
        if claimed is None:
            continue  # neither a text signature nor a count in its TypeError: not checkable
        want_required, want_total = claimed
        assert total == want_total, (
            f"{name}: the stub has {total} parameters, the module {want_total}"
        )
        if want_required is not None:
            assert required == want_required, (
                f"{name}: {required} required, the module {want_required}"
            )
        checked.append(name)
    if not checked:
        pytest.skip("no kernel of mrc._native states its parameters")


def _fake(name: str, version: int | None) -> types.ModuleType:
    """A module standing for the built ``mrc.<name>`` of ``version`` (None: it says none),
    holding every name of its stub."""
    fake = types.ModuleType(f"mrc.{name}")
    if version is not None:
        fake.KERNEL_VERSION = version  # type: ignore[attr-defined]
    for attr in _stub_names(_stub(name).body):  # every kernel there: none of them is taken
        if attr != "KERNEL_VERSION":
            setattr(fake, attr, object())
    return fake


@pytest.mark.parametrize("stale", EXTENSIONS)
@pytest.mark.parametrize("version", [native.KERNEL_VERSION - 1, native.KERNEL_VERSION + 1, None])
def test_a_module_of_another_kernel_version_is_refused_whole(
    stale: str, version: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either extension stale: neither is used (a rebuild is the cure, not half of one)."""
    fakes = {
        name: _fake(name, version if name == stale else native.KERNEL_VERSION)
        for name in EXTENSIONS
    }
    why = native.stale(f"mrc.{stale}")
    assert native.check(fakes[stale]) == why
    if stale == "_native":
        assert why == native.STALE
    for name, fake in fakes.items():
        monkeypatch.setitem(sys.modules, f"mrc.{name}", fake)
    assert native.load({}) == (None, None, why, why)
    assert native.summary(why, why) == (STALE_TEXT if stale == "_native" else GCM_STALE_TEXT)
    fakes[stale].KERNEL_VERSION = native.KERNEL_VERSION  # type: ignore[attr-defined]
    assert native.check(fakes[stale]) is None
    assert native.load({}) == (fakes["_native"], fakes["_native_gcm"], None, None)
    assert native.summary(None, None) == BOTH


def test_mrc_native_0_and_an_unbuilt_module_use_none(monkeypatch: pytest.MonkeyPatch) -> None:
    off = (None, None, "MRC_NATIVE=0", "MRC_NATIVE=0")
    assert native.load({"MRC_NATIVE": "0"}) == off
    assert native.load({"MRC_NATIVE": " 0\n"}) == off
    assert native.summary("MRC_NATIVE=0", "MRC_NATIVE=0") == "python (MRC_NATIVE=0)"
    monkeypatch.setitem(sys.modules, "mrc._native", None)  # import fails: as if never built
    assert native.load({}) == (None, None, "not built", "not built")
    assert native.summary("not built", "not built") == "python (not built)"


def test_without_the_gcm_extension_keyed_mode_alone_is_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No OpenSSL headers at build time: ``mrc._native`` is still used, and keyed mode's
    kernels are Python (the one partial set, which describe() names)."""
    main = _fake("_native", native.KERNEL_VERSION)
    monkeypatch.setitem(sys.modules, "mrc._native", main)
    monkeypatch.setitem(sys.modules, "mrc._native_gcm", None)  # as if it did not build
    assert native.load({}) == (main, None, None, native.NO_GCM)
    assert native.summary(None, native.NO_GCM) == NO_GCM_TEXT


_PROBE = """
import json, sys, types
for ext, fake in {fakes!r}.items():
    if fake == "absent":  # not built
        sys.modules[ext] = None
    elif fake is not None:  # a build holding every kernel, installed before mrc looks
        mod = types.ModuleType(ext)
        mod.KERNEL_VERSION = fake
        for name in {names!r}[ext]:
            setattr(mod, name, object())
        sys.modules[ext] = mod
from mrc import native
from mrc.core import fastpath as f
from mrc.security import packet
from mrc.transport import rxbatch
print(json.dumps({{
    "module": native.module is not None,
    "describe": f.describe(),
    "NATIVE": f.NATIVE,
    "python": [
        f.place_train is f.py_place_train,
        f.note_arrivals is f.py_note_arrivals,
        f.note_runs is f.py_note_runs,
        f.pack_burst is f.py_pack_burst,
        f.record_burst is f.py_record_burst,
        f.Packet is f.PyPacket,
        f.take_acked is f.py_take_acked,
        f.take_ack is f.py_take_ack,
        rxbatch.recv_batch is rxbatch.py_recv_batch,
        packet.open_in_place is None,
        packet.seal_packet is None,
        packet.gcm_key is None,
    ],
}}))
"""


def _probe(fake: int | None, gcm: int | str | None = None, **env: str) -> dict[str, object]:
    """What a fresh interpreter uses with ``mrc._native`` replaced by a build of version
    ``fake`` and ``mrc._native_gcm`` by one of version ``gcm`` ("absent": not built; None:
    the real ones)."""
    names = {
        f"mrc.{ext}": sorted(n for n in _stub_names(_stub(ext).body) if n != "KERNEL_VERSION")
        for ext in EXTENSIONS
    }
    fakes = {"mrc._native": fake, "mrc._native_gcm": gcm}
    environ = {k: v for k, v in os.environ.items() if k != "MRC_NATIVE"} | env
    res = subprocess.run(
        [sys.executable, "-c", _PROBE.format(fakes=fakes, names=names)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    out: dict[str, object] = json.loads(res.stdout)
    return out


def test_a_stale_build_leaves_every_kernel_python() -> None:
    """Whatever kernels a stale build holds, none is used: fastpath, rxbatch and packet all
    take their Python twins, and describe() says why; a stale keyed extension beside a current
    main one likewise."""
    got = _probe(native.KERNEL_VERSION - 1, native.KERNEL_VERSION - 1)
    assert got == {"module": False, "describe": STALE_TEXT, "NATIVE": False, "python": [True] * 12}
    got = _probe(native.KERNEL_VERSION, native.KERNEL_VERSION + 1)
    want = {"module": False, "describe": GCM_STALE_TEXT, "NATIVE": False}
    assert got == want | {"python": [True] * 12}


def test_mrc_native_0_leaves_every_kernel_python() -> None:
    got = _probe(None, MRC_NATIVE="0")
    want = {"module": False, "describe": "python (MRC_NATIVE=0)", "NATIVE": False}
    assert got == want | {"python": [True] * 12}


def test_without_the_gcm_extension_only_keyed_mode_is_python() -> None:
    got = _probe(native.KERNEL_VERSION, "absent")
    want = {"module": True, "describe": NO_GCM_TEXT, "NATIVE": True}
    assert got == want | {"python": [False] * 9 + [True] * 3}


def test_a_current_build_is_used_whole() -> None:
    _built()
    _built("_native_gcm")
    got = _probe(None)
    want = {"module": True, "describe": BOTH, "NATIVE": True}
    assert got == want | {"python": [False] * 12}
