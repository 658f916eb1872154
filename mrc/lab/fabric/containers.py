"""Fabric hosts as real containers (``mrc-fabric up --host-image IMAGE``).

Each host is a container of the user's image started with no network of the engine's
(``--network none``) and running only ``sleep infinity``. Its network namespace is then bound
under /run/netns with the host's namespace name, exactly as ``ip netns attach`` does, so the
builder treats it like any other namespace: the host's per-plane veth NICs are born inside
it, addressed and routed from outside. Programs run in it with ``ENGINE exec`` (see
:func:`exec_argv`), with the image's own file system and Python.

The fabric's run directory (topology files) is mounted read-only at the same path, so
``--fabric NAME`` works inside. A per-fabric directory under it, ``share-<name>`` (mode 1777, see
:func:`share_dir`), is mounted read-write at the same path: the one place where files made on
the host (data to send) and in the containers (results) are seen by both, under the same name.
Containers carry the label ``mrc.fabric=<name>`` and the fabric's namespace name, and
:func:`remove` finds them by label alone (teardown never trusts the topology file), as
:func:`remove_share` finds the shared directory by the fabric's name alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from mrc.errors import FabricError
from mrc.topology.model import run_dir

#: the containers' label (its value: the fabric's name); users and scripts filter on it, so it
#: does not follow the package's name
LABEL = "mrc.fabric"
ENGINES = ("podman", "docker")


def _works(engine: str) -> bool:
    if shutil.which(engine) is None:
        return False
    try:
        return subprocess.run([engine, "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pick_engine() -> str:
    """The container engine to use: ``MRC_ENGINE`` if set, else podman, else docker."""
    wanted = os.environ.get("MRC_ENGINE")
    for engine in (wanted,) if wanted else ENGINES:
        if _works(engine):
            return engine
    if wanted:
        raise FabricError(f"MRC_ENGINE={wanted} cannot run here ({wanted} info failed)")
    raise FabricError("--host-image needs podman or a running Docker engine; neither is here")


def _run(engine: str, *args: str, timeout: float = 120) -> str:
    try:
        done = subprocess.run(
            [engine, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise FabricError(f"{engine} {args[0]} took longer than {timeout:g} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise FabricError(f"{engine} {args[0]} failed: {why}")
    return done.stdout.strip()


def check_image(engine: str, image: str) -> None:
    """Fail before building anything if ``image`` is not in the engine's store."""
    if subprocess.run([engine, "image", "inspect", image], capture_output=True).returncode != 0:
        raise FabricError(
            f"no image {image!r} in {engine}'s store (build one: bash docker/build.sh)"
        )


def share_dir(fabric: str) -> Path:
    """The directory shared read-write by the host and every host container of ``fabric``."""
    return run_dir() / f"share-{fabric}"


def make_share(fabric: str) -> Path:
    """Create :func:`share_dir` (empty, mode 1777: the image's user writes there, and only
    removes what it made) before any container mounts it."""
    path = share_dir(fabric)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o1777)  # after mkdir: the umask would take the group's and others' bits
    return path


def remove_share(fabric: str) -> bool:
    """Remove :func:`share_dir` and everything in it; True if it was there."""
    path = share_dir(fabric)
    if path.is_symlink() or not path.is_dir():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def start_host(engine: str, image: str, fabric: str, container: str, hostname: str) -> int:
    """Start one host container; return the PID whose network namespace is the host's."""
    fabric_dir = str(run_dir())
    os.makedirs(fabric_dir, mode=0o755, exist_ok=True)
    share = str(make_share(fabric))
    try:
        _start(engine, image, fabric, container, hostname, fabric_dir, share)
    except FabricError as exc:
        if engine == "podman" and any(s in str(exc) for s in _CONF_SYMPTOMS):
            raise FabricError(f"{exc} ({_CONF_HINT})") from None
        raise
    pid = _run(engine, "inspect", "--format", "{{.State.Pid}}", container)
    if not pid.isdigit() or int(pid) <= 0:
        raise FabricError(f"container {container} is not running (pid {pid!r})")
    return int(pid)


#: podman's defaults fail on some hosts (these VMs among them); docker/podman.conf fixes both
_CONF_SYMPTOMS = ("rlimit", "cgroups in hybrid mode")
_CONF_HINT = "try CONTAINERS_CONF=docker/podman.conf: runc and no default ulimits"


def _start(
    engine: str, image: str, fabric: str, container: str, hostname: str, fdir: str, share: str
) -> None:
    _run(
        engine,
        "run",
        "--detach",
        "--name",
        container,
        "--hostname",
        hostname,
        "--network",
        "none",
        # scoped to the container's own network namespace: EV sockets on a uSID fabric set
        # SO_MARK to pick their spine's table (mrc.srv6.usid)
        "--cap-add",
        "NET_ADMIN",
        "--label",
        f"{LABEL}={fabric}",
        "--volume",
        f"{fdir}:{fdir}:ro",
        "--volume",
        f"{share}:{share}:rw",
        "--env",
        f"MRC_FABRIC_DIR={fdir}",
        "--entrypoint",
        "sleep",
        image,
        "infinity",
    )


def labelled(engine: str, fabric: str) -> list[str]:
    """IDs of ``engine``'s containers (running or not) labelled with ``fabric``."""
    listed = subprocess.run(
        [engine, "ps", "--all", "--quiet", "--filter", f"label={LABEL}={fabric}"],
        capture_output=True,
        text=True,
    )
    return listed.stdout.split() if listed.returncode == 0 else []


def remove(fabric: str) -> list[str]:
    """Remove every container labelled with ``fabric``, on every engine that runs here."""
    removed: list[str] = []
    for engine in ENGINES:
        if shutil.which(engine) is None:
            continue
        ids = labelled(engine, fabric)
        if ids:
            subprocess.run([engine, "rm", "--force", *ids], capture_output=True)
            removed += ids
    return removed


def exec_argv(engine: str, container: str, cmd: list[str], interactive: bool) -> list[str]:
    """The argv that runs ``cmd`` inside ``container`` (with a terminal when ``interactive``)."""
    flags = ["--interactive", "--tty"] if interactive else ["--interactive"]
    return [engine, "exec", *flags, container, *cmd]
