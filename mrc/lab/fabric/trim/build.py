"""Compile ``mrc_trim.bpf.c`` with clang, once per source version (cached by hash).

The object is cached as ``<run dir>/bpf/mrc_trim-<hash>.o`` (``/run/mrc/bpf/`` unless
``MRC_FABRIC_DIR`` says otherwise), keyed by the SHA-256 of the source and the compiler flags,
so ``up --trim`` costs a clang run (~0.5 s) only the first time after a change or a reboot.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

from mrc.errors import FabricError
from mrc.topology.model import run_dir

SOURCE = Path(__file__).with_name("mrc_trim.bpf.c")

INSTALL_HINT = "install clang libbpf-dev (tools/setup.sh does)"

#: Headers the source includes that come from packages (libbpf-dev; linux-libc-dev).
_NEEDED_HEADERS = ("bpf/bpf_helpers.h", "bpf/bpf_endian.h", "linux/bpf.h")


def _multiarch() -> str:
    machine = platform.machine()
    return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(
        machine, f"{machine}-linux-gnu"
    )


def clang_flags() -> list[str]:
    # -I<multiarch>: <linux/types.h> includes <asm/types.h>, which Debian keeps there
    return ["-O2", "-g", "-target", "bpf", f"-I/usr/include/{_multiarch()}", "-Wall"]


def find_clang() -> str | None:
    found = shutil.which("clang")
    if found:
        return found
    for v in range(21, 10, -1):  # versioned names (clang-14 ...) without the plain symlink
        found = shutil.which(f"clang-{v}")
        if found:
            return found
    return None


def missing() -> str | None:
    """Why we cannot compile here (one line), or None."""
    if find_clang() is None:
        return f"clang not found: {INSTALL_HINT}"
    for h in _NEEDED_HEADERS:
        if not os.path.exists(os.path.join("/usr/include", h)):
            return f"/usr/include/{h} not found: {INSTALL_HINT}"
    return None


def object_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(clang_flags()).encode()).hexdigest()
    return run_dir() / "bpf" / f"mrc_trim-{digest[:16]}.o"


def compile_object() -> Path:
    """Return the path of the compiled object, compiling it if not cached; FabricError."""
    out = object_path()
    if out.exists():
        return out
    why = missing()
    if why:
        raise FabricError(f"--trim: {why}")
    clang = find_clang()
    assert clang is not None
    out.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [clang, *clang_flags(), "-c", str(SOURCE), "-o", str(tmp)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FabricError(f"--trim: running clang failed: {e}") from None
    if res.returncode != 0:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip())
        hint = f" ({INSTALL_HINT})" if "file not found" in first else ""
        raise FabricError(f"--trim: compiling {SOURCE.name} failed: {first[:300]}{hint}")
    os.replace(tmp, out)
    for stale in out.parent.glob("mrc_trim-*.o"):  # objects of older sources
        if stale != out:
            with contextlib.suppress(OSError):
                stale.unlink()
    return out
