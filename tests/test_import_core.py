"""The sans-IO core imports on its own: no asyncio, sockets layer, fabric, pyroute2 or ctypes.

Why it matters: the core is what researchers embed and what the simulator drives thousands of
times; it must load (and be testable) on a machine without the I/O dependencies installed.
The check runs in a fresh virtualenv that sees the repository but no installed packages, so a
stray import of pyroute2 fails there exactly as it would after ``pip install --no-deps``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import mrc.core, mrc.wire, mrc.lab.sim
print(json.dumps(sorted(sys.modules)))
"""

FORBIDDEN_ROOTS = ("asyncio", "pyroute2", "ctypes", "_ctypes", "socket", "uvloop")
FORBIDDEN_PREFIXES = ("mrc.lab.fabric", "mrc.transport", "mrc.connection", "mrc.srv6")


def _bare_venv(where: Path) -> Path:
    """A virtualenv without pip or site packages, that finds mrc through a .pth file."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(where)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "mrc-repo.pth").write_text(str(REPO) + "\n")
    return python


def test_core_imports_without_dependencies(tmp_path: Path) -> None:
    python = _bare_venv(tmp_path / "venv")
    # pyroute2 really is absent there, so the check below cannot pass by luck
    absent = subprocess.run([str(python), "-c", "import pyroute2"], capture_output=True)
    assert absent.returncode != 0
    res = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout)
    bad = [
        m for m in loaded if m.split(".")[0] in FORBIDDEN_ROOTS or m.startswith(FORBIDDEN_PREFIXES)
    ]
    assert bad == [], f"import mrc.core/wire/sim pulled in {bad}"
    assert "mrc.core.qp" in loaded and "mrc.lab.sim" in loaded


def test_top_level_names_resolve_lazily() -> None:
    """``import mrc`` alone loads no connection layer; touching a name loads it."""
    code = (
        "import sys, mrc; a = 'mrc.connection' in sys.modules; "
        "mrc.connect; b = 'mrc.connection' in sys.modules; "
        "print(a, b, mrc.MRCError.__module__, sorted(mrc.__all__) == sorted(set(mrc.__all__)))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True", "mrc.errors", "True"]
