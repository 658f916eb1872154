"""The library never needs the lab: ``import mrc``, the connection layer and mrc-send/mrc-recv
load no ``mrc.lab`` module and no pyroute2, and still move data when neither can be imported.

Why: a user embedding the transport on a host with real NICs should not carry the namespace
fabric, the eBPF trimmer or the benchmark, nor their import time. The rule is one-way: the lab
(``mrc.lab``) imports the library, never the reverse. Three checks hold it: every import
statement in the library's source (also those inside functions), what a fresh interpreter has
loaded after importing the library's entry points, and a real transfer with pyroute2 and
``mrc.lab`` made unimportable.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mrc"
LAB = PACKAGE / "lab"
FORBIDDEN = ("mrc.lab", "pyroute2")
# where mrc-send / mrc-recv live (as in conftest.py)
BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)

#: Installed as sitecustomize in a child interpreter: the modules named in BLOCKED (and their
#: submodules) cannot be imported, as if they were not installed.
BLOCKER = """
import importlib.abc, sys

BLOCKED = {blocked!r}

class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"blocked by the test: {{name}}", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
"""


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement in ``path`` names, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if LAB not in p.parents)


def test_the_library_source_never_imports_the_lab() -> None:
    """Not at the top of a module, not inside a function, not under TYPE_CHECKING."""
    files = _library_files()
    assert len(files) > 40 and PACKAGE / "connection" / "__init__.py" in files
    bad = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in files
        for line, name in _imports(path)
        if name == "pyroute2" or name.startswith(("pyroute2.", *FORBIDDEN))
    ]
    assert bad == []


def test_the_import_scan_sees_lab_imports() -> None:
    """The scan above finds what it looks for (relative forms included)."""
    names = [name for _, name in _imports(LAB / "fabric" / "kernel.py")]
    assert "pyroute2" in names and "mrc.lab.fabric.shaping" in names
    names = [name for _, name in _imports(LAB / "fabric" / "trim" / "maps.py")]
    assert "mrc.lab.fabric.shaping.tbf_params" in names


def _child_env(tmp_path: Path, blocked: tuple[str, ...] = FORBIDDEN) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    return env


def test_library_entry_points_load_no_lab_module(tmp_path: Path) -> None:
    probe = (
        "import json, sys\n"
        "import mrc, mrc.connection, mrc.app.transfer, mrc.app.timed, mrc.metrics\n"
        "import mrc.cli.send, mrc.cli.recv, mrc.cli.keygen, mrc.topology, mrc.srv6.evroutes\n"
        "mrc.connect, mrc.listen\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    # in a plain interpreter: nothing of the lab gets loaded even though it could be
    res = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout)
    assert [m for m in loaded if m.split(".")[0] == "pyroute2" or m.startswith("mrc.lab")] == []
    assert "mrc.cli.send" in loaded and "mrc.topology.realfile" in loaded
    # and with the lab made unimportable, the same imports succeed
    res = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_child_env(tmp_path),
    )
    assert res.returncode == 0, res.stderr


def test_blocked_lab_really_is_blocked(tmp_path: Path) -> None:
    """The blocker itself works, so the transfer below proves something."""
    for name in ("pyroute2", "mrc.lab.fabric"):
        res = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=_child_env(tmp_path),
        )
        assert res.returncode == 1 and "blocked by the test" in res.stderr, name


def test_send_and_recv_move_data_without_the_lab(
    tmp_path: Path, mrc_tools: Any, mrc_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mrc-recv and mrc-send, with pyroute2 and mrc.lab unimportable, move a file whose
    bytes arrive intact."""
    blocker_dir = tmp_path / "blocker"
    blocker_dir.mkdir()
    for key, value in _child_env(blocker_dir).items():
        monkeypatch.setenv(key, value)
    src = tmp_path / "src.bin"
    data = os.urandom(3 * 1024 * 1024 + 17)
    src.write_bytes(data)
    out = tmp_path / "out.bin"
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--out", str(out), "--json", "--timeout", "60"
    )
    recv.wait_listening(mrc_port)
    send = mrc_tools.run("mrc-send", str(src), "--to", f"[::1]:{mrc_port}", "--json")
    got = recv.wait(60)
    assert send.returncode == 0 and got.returncode == 0, send.describe() + got.describe()
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert send.json["ok"] is True and got.json["ok"] is True


def test_lab_commands_without_pyroute2_name_the_extra(tmp_path: Path) -> None:
    """mrc-fabric and mrc-bench without their dependency: one line naming what to install."""
    env = _child_env(tmp_path, blocked=("pyroute2",))
    for tool in ("mrc-fabric", "mrc-bench"):
        res = subprocess.run(
            [str(BIN / tool), "status" if tool == "mrc-fabric" else "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert res.returncode == 1, res.stderr
        assert res.stderr == (
            f"{tool}: error: {tool} needs pyroute2, which the lab extra brings:"
            " pip install 'mrc-transport[lab]'\n"
        )
