"""How much memory this process may use: the machine's, or its memory cgroup's if smaller.

A listener grants memory to peers it may not know (without a key, anyone who reaches its port),
so its default budget for that is a share of what the process can really have, and a budget
configured above it is refused: asking the kernel for more than it can give ends in the OOM
killer, not in a refusal the peer can read. Linux only reads these files; elsewhere (or if they
cannot be read) there is no cgroup limit and the machine's memory is unknown (None).
"""

from __future__ import annotations

import contextlib
import os

#: the default budget of memory granted to peers: this fraction of what the process may use
DEFAULT_SHARE = 4  # a quarter
#: and at most this fraction of what is available when the listener starts
AVAILABLE_SHARE = 2  # a half

#: cgroup v1 writes a number this large (or larger) for "no limit"
_V1_UNLIMITED = 1 << 62


def meminfo(root: str = "/") -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, ...); {} where it cannot be read."""
    out: dict[str, int] = {}
    try:
        with open(os.path.join(root, "proc/meminfo")) as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if fields and fields[0].isdigit():
                    scale = 1024 if fields[1:] == ["kB"] else 1
                    out[name] = int(fields[0]) * scale
    except OSError:
        return {}
    return out


def _read_limit(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max": no limit at this level
    value = int(text)
    return value if value < _V1_UNLIMITED else None


def _mounts(root: str) -> list[tuple[str, str, str, str]]:
    """(mount point, root within the hierarchy, fs type, super options) of cgroup mounts."""
    out = []
    with contextlib.suppress(OSError), open(os.path.join(root, "proc/self/mountinfo")) as f:
        for line in f:
            head, sep, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if sep and len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], fields[3], rest[0], rest[2]))
    return out


def _levels(mount: str, mount_root: str, path: str, root: str) -> list[str]:
    """The directories of cgroup ``path`` and of each of its ancestors under ``mount``."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root) :] or "/"
    parts = [p for p in path.split("/") if p]
    base = os.path.join(root, mount.lstrip("/"))
    return [os.path.join(base, *parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_limit(root: str = "/") -> int | None:
    """The smallest memory limit of this process's cgroup and its ancestors (v2 memory.max,
    v1 memory.limit_in_bytes), or None when there is none (or none can be read)."""
    groups: dict[str, str] = {}  # "" (v2) or a v1 controller -> the process's cgroup path
    with contextlib.suppress(OSError), open(os.path.join(root, "proc/self/cgroup")) as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3:
                for controller in parts[1].split(",") if parts[1] else [""]:
                    groups[controller] = parts[2]
    limits = []
    for mount, mount_root, fstype, options in _mounts(root):
        if fstype == "cgroup2" and "" in groups:
            path, name = groups[""], "memory.max"
        elif fstype == "cgroup" and "memory" in options.split(",") and "memory" in groups:
            path, name = groups["memory"], "memory.limit_in_bytes"
        else:
            continue
        for level in _levels(mount, mount_root, path, root):
            limit = _read_limit(os.path.join(level, name))
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def usable_memory(root: str = "/") -> int | None:
    """The memory this process can have at most: the machine's (MemTotal), or its cgroup's
    limit when that is smaller; None if neither is known."""
    known = [v for v in (meminfo(root).get("MemTotal"), cgroup_limit(root)) if v is not None]
    return min(known) if known else None


def default_budget(root: str = "/") -> int | None:
    """What a listener grants in memory by default, all peers together: a quarter of
    :func:`usable_memory`, and no more than half of what is available right now (a listener
    started on a busy machine takes less). None where the memory is unknown."""
    usable = usable_memory(root)
    if usable is None:
        return None
    budget = usable // DEFAULT_SHARE
    available = meminfo(root).get("MemAvailable")
    if available is not None:
        budget = min(budget, available // AVAILABLE_SHARE)
    return budget
