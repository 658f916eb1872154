"""Named network namespaces, managed in-process.

Why not ``ip netns add`` or ``pyroute2.netns.create``?  Both cost a process per namespace
(``ip`` is a subprocess, pyroute2 forks a child).  Building a fabric needs dozens of
namespaces and hundreds of netlink calls, so we create namespaces with ``unshare(2)`` in the
calling thread, bind-mount them under ``/run/netns`` exactly like iproute2 does (so ``ip netns``
sees them), and switch the calling thread back with ``setns(2)``.  A netlink socket opened while
the thread is inside a namespace stays bound to that namespace after we switch back, which is how
:mod:`mrc.lab.fabric.builder` talks to every namespace from one process.

All functions here act on the *calling thread* only; never use :func:`entered` across an
``await`` or hand the thread to other work while inside.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterator

NETNS_RUN_DIR = "/run/netns"

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def _check(ret: int, what: str, target: str = "") -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", target or None)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int) -> int:
    return int(
        _libc.mount(
            src.encode() if src is not None else None,
            dst.encode(),
            fstype.encode() if fstype is not None else None,
            flags,
            None,
        )
    )


def netns_path(name: str) -> str:
    """Path of the bind mount that keeps namespace ``name`` alive."""
    return os.path.join(NETNS_RUN_DIR, name)


def list_netns() -> list[str]:
    """Names of all namespaces under /run/netns (ours and anybody else's)."""
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except FileNotFoundError:
        return []


def exists(name: str) -> bool:
    return os.path.exists(netns_path(name))


def _prepare_run_dir() -> None:
    """Make /run/netns a shared mount point, as ``ip netns add`` does.

    Shared propagation lets a bind mount made here show up in every mount namespace (e.g.
    inside ``ip netns exec``), so a namespace is visible to all tools at once.
    """
    os.makedirs(NETNS_RUN_DIR, mode=0o755, exist_ok=True)
    if _mount("", NETNS_RUN_DIR, "none", MS_SHARED | MS_REC) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        _check(-1, "make /run/netns shared", NETNS_RUN_DIR)
    _check(
        _mount(NETNS_RUN_DIR, NETNS_RUN_DIR, "none", MS_BIND | MS_REC),
        "bind /run/netns",
        NETNS_RUN_DIR,
    )
    _check(_mount("", NETNS_RUN_DIR, "none", MS_SHARED | MS_REC), "share /run/netns")


def _current_fd() -> int:
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _setns_fd(fd: int) -> None:
    _check(_libc.setns(fd, CLONE_NEWNET), "setns")


def create(name: str) -> None:
    """Create the named namespace; raise FileExistsError if it already exists."""
    _prepare_run_dir()
    path = netns_path(name)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    back = _current_fd()
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare", name)
        try:
            _check(_mount("/proc/thread-self/ns/net", path, "none", MS_BIND), "bind", name)
        finally:
            _setns_fd(back)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(back)


def attach(name: str, pid: int) -> None:
    """Name the network namespace of process ``pid`` ``name`` (``ip netns attach``): how a
    container's namespace joins the fabric. Raise FileExistsError if ``name`` exists."""
    _prepare_run_dir()
    path = netns_path(name)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    try:
        _check(_mount(f"/proc/{pid}/ns/net", path, "none", MS_BIND), "bind", name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def remove(name: str) -> bool:
    """Detach and delete the named namespace; False if it did not exist.

    The namespace itself (and every veth end inside it) is freed by the kernel once no process
    and no open file refers to it any more; see :func:`kill_processes`.
    """
    path = netns_path(name)
    if not os.path.exists(path):
        return False
    _libc.umount2(path.encode(), MNT_DETACH)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with the calling thread inside namespace ``name``.

    Sockets (including netlink sockets) and /proc/sys/net files opened in the body belong to
    that namespace for their whole life, even after we switch back.
    """
    back = _current_fd()
    try:
        target = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        os.close(back)
        raise
    try:
        _setns_fd(target)
    finally:
        os.close(target)
    try:
        yield
    finally:
        _setns_fd(back)
        os.close(back)


def write_sysctl(key: str, value: str | int) -> None:
    """Write ``net.ipv6...`` style ``key`` in the namespace the thread is currently in."""
    path = "/proc/sys/" + key.replace(".", "/")
    with open(path, "w") as f:
        f.write(str(value))


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is ``name`` (matched by inode, like ``ip netns pids``)."""
    try:
        st = os.stat(netns_path(name))
    except FileNotFoundError:
        return []
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            pst = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (pst.st_ino, pst.st_dev) == (st.st_ino, st.st_dev):
            pids.append(int(entry))
    return pids


def kill_processes(names: list[str], grace: float = 1.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds, every process living in ``names``.

    A process left inside a namespace keeps it (and its veths) alive after the bind mount is
    gone, which would leak links; killing them is what makes teardown complete.
    """
    victims = sorted({pid for name in names for pid in pids_in(name)})
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(victims)
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [pid for pid in alive if _alive(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return victims


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    # a zombie is dead; reaping it is its parent's job (never steal a caller's exit status)
    return state != "Z"


def enter_for_exec(name: str) -> None:
    """Move this process into ``name`` for good, as ``ip netns exec`` does before exec(2).

    Besides setns(2) we give the process a private mount namespace with a fresh /sys, so tools
    that read /sys/class/net see the namespace's interfaces rather than the host's.  Failure of
    the /sys step is harmless (netlink-based tools work regardless), so it is best effort.
    """
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns_fd(fd)
    finally:
        os.close(fd)
    if _libc.unshare(CLONE_NEWNS) != 0:
        return
    if _mount("", "/", "none", MS_SLAVE | MS_REC) != 0:
        return
    _libc.umount2(b"/sys", MNT_DETACH)
    _mount(name, "/sys", "sysfs", 0)
