"""Find and remove fabrics by their namespace names alone.

Teardown must work after a crash, with the topology file missing or stale, so it never trusts
the file: it matches ``/run/netns`` entries against the exact naming pattern of the fabric
(``mrc-<name>-h<N>`` or ``mrc-<name>-p<N>l<N>`` / ``p<N>s<N>``) and touches nothing else.
Every veth lives inside our namespaces (none in the caller's), so removing the namespaces
removes every link; processes still inside are killed first or they would keep the namespace
and its veths alive.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from mrc.topology.model import run_dir, topology_path

from . import netns
from .spec import NAME_RE
from .trim.maps import fabric_pin_dir, pinned_fabrics, remove_pins

_NODE = r"(?:h\d+|p\d+[ls]\d+)"
_ANY_FABRIC = re.compile(rf"^mrc-([A-Za-z0-9_]+)-{_NODE}$")


def fabric_namespaces(name: str) -> list[str]:
    """Namespaces belonging to fabric ``name`` (by exact naming pattern)."""
    pattern = re.compile(rf"^mrc-{re.escape(name)}-{_NODE}$")
    return [ns for ns in netns.list_netns() if pattern.match(ns)]


def down(name: str) -> list[str]:
    """Remove fabric ``name``: host containers and the directory they shared with the host,
    processes, namespaces (and thus links), the topology file, and the trimming program's bpffs
    pins (``/sys/fs/bpf/mrc-<name>``).

    Idempotent: removing a fabric that does not exist does nothing and returns [].
    """
    if not NAME_RE.match(name):
        return []
    from . import containers

    containers.remove(name)  # first: a container's processes would keep its namespace busy
    containers.remove_share(name)
    namespaces = fabric_namespaces(name)
    netns.kill_processes(namespaces)
    removed = [ns for ns in namespaces if netns.remove(ns)]
    with contextlib.suppress(FileNotFoundError):
        topology_path(name).unlink()
    with contextlib.suppress(FileNotFoundError):
        topology_path(name).with_suffix(".json.tmp").unlink()
    remove_pins(name)
    return removed


def list_fabrics() -> dict[str, dict[str, Any]]:
    """Every fabric visible on this machine:
    {name: {"namespaces": n, "topology": path|None, "bpf_pins": path|None}}."""
    found: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return found.setdefault(name, {"namespaces": 0, "topology": None, "bpf_pins": None})

    for ns in netns.list_netns():
        m = _ANY_FABRIC.match(ns)
        if m:
            entry(m.group(1))["namespaces"] += 1
    d = run_dir()
    if d.is_dir():
        for f in sorted(d.glob("fabric-*.json")):
            entry(f.name[len("fabric-") : -len(".json")])["topology"] = str(f)
    for name in pinned_fabrics():
        if NAME_RE.match(name):
            entry(name)["bpf_pins"] = fabric_pin_dir(name)
    return dict(sorted(found.items()))
