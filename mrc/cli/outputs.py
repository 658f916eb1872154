"""Where mrc-recv puts what it receives: memory for ``--discard``, part files for ``--out``.

A part file is created new beside its output, locked (``flock``) for as long as its receiver
holds it, and renamed into place only once its transfer is verified. A receiver killed with
SIGKILL cannot delete its part files; the lock is what tells the next receiver that nobody
owns them any more (:func:`stale_parts`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import glob
import mmap
import os
import secrets
import stat
import threading

from mrc.cli.prefault import Prefault, map_region
from mrc.errors import MRCError

#: ``--discard``: a transfer larger than this comes through a window of this many bytes
DISCARD_WINDOW = 64 << 20
#: random bytes in a part file's name (PATH.<hex>.part)
PART_TOKEN_BYTES = 4


def discard_bytes(size: int, window: int) -> int:
    """The memory ``--discard`` maps for a transfer of ``size`` bytes: all of it, or, when
    larger than ``window`` (``--discard-window``), a window of two equal slots."""
    return size if size <= window else window - window % 2


class Outputs:
    """Allocates the memory a sender asks for and owns the files behind it.

    ``--discard`` grants at most a window of ``--discard-window`` bytes (two slots a larger
    transfer streams through, each hashed as it lands: mrc/rounds.py), so memory does not grow
    with the transfer.

    Each transfer gets its own part file, created new (``O_EXCL | O_NOFOLLOW``, mode 0600 until
    it is verified, then the umask's) next to its output with a random name, never reopened and
    never shared, with its disk space reserved up front (``posix_fallocate``): a full disk is a
    refusal before any data moves, not a SIGBUS in the middle. At most ``--count`` transfers are
    granted memory; a hello beyond that is refused instead of allocating; a slot given back (a
    sender that never started) does not give back its ``{n}``, so no two transfers ever share an
    output name. Every part file not renamed into place is deleted, whatever ends the transfer
    (``remove_all`` runs on the way out, signals included).

    The listener calls it in a worker thread (a large region takes seconds to make); what it
    counts and the parts it owns are shared with the event loop's thread under ``_lock``.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.granted = 0  # transfers holding (or done with) one of --count's slots
        self.numbered = 0  # the last {n} given out: never given twice, even when released
        self.umask = os.umask(0)  # (read it, then put it back: there is no other way)
        os.umask(self.umask)
        # id(mmap) -> (part file, final path, its descriptor: holds the part's lock)
        self.parts: dict[int, tuple[str, str, int]] = {}
        # id(mmap) -> the thread faulting it in (large regions: mrc/cli/prefault.py)
        self._prefaults: dict[int, Prefault] = {}
        self._lock = threading.Lock()

    def __call__(self, size: int, request: dict[str, object]) -> mmap.mmap:
        if size > self.args.max_size:
            raise MRCError(f"transfer of {size} bytes exceeds --max-size {self.args.max_size}")
        with self._lock:
            if self.granted >= self.args.count:
                raise MRCError(
                    f"this receiver takes {self.args.count} transfer(s) and has them all"
                )
            self.granted += 1  # taken now: a hello beside this one sees it
        try:
            return self._window(size) if self.args.discard else self._part(size)
        except BaseException:
            with self._lock:
                self.granted -= 1
            raise

    def _window(self, size: int) -> mmap.mmap:
        """Memory for ``--discard``: the transfer, or a window of two equal slots."""
        return self._mapped(discard_bytes(size, self.args.discard_window), None)

    def _mapped(self, size: int, fd: int | None) -> mmap.mmap:
        buf, prefault = map_region(size, fd)
        if prefault is not None:
            with self._lock:
                self._prefaults[id(buf)] = prefault
        return buf

    def _part(self, size: int) -> mmap.mmap:
        """A new part file of ``size`` bytes for the next output, mapped. Its number is
        taken once the part file exists (used from then on, whatever comes of it)."""
        with self._lock:
            path = self.args.out.replace("{n}", str(self.numbered + 1))
            check_target(path, self.args.force)
            fd, part = _create_part(path)
            self.numbered += 1
        try:
            if size:
                _reserve(fd, size, part)
            m = self._mapped(size, fd) if size else mmap.mmap(-1, 1)
        except BaseException:
            os.unlink(part)
            os.close(fd)
            raise
        with self._lock:
            self.parts[id(m)] = (part, path, fd)
        return m

    def path_of(self, buf: mmap.mmap) -> str | None:
        with self._lock:
            entry = self.parts.get(id(buf))
        return entry[1] if entry else None

    def release(self, buf: object) -> None:
        """A set-up failed after its memory was made: free it and give the slot back."""
        assert isinstance(buf, mmap.mmap)
        with self._lock:
            self.granted -= 1
        self.finish(buf, keep=False)

    def finish(self, buf: mmap.mmap, keep: bool) -> None:
        """Unmap ``buf``; put its part file in place (``keep``) or delete it.

        Raises :class:`MRCError` when the file cannot be put in place (the part is deleted).
        """
        with self._lock:
            entry = self.parts.pop(id(buf), None)
            prefault = self._prefaults.pop(id(buf), None)
        if prefault is not None:
            prefault.stop()
        if keep:
            buf.flush()
        buf.close()
        if entry is None:
            return
        part, path, fd = entry
        try:
            if keep:
                os.fchmod(fd, 0o666 & ~self.umask)  # verified: the mode of any new file
                _put_in_place(part, path, self.args.force)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            os.close(fd)

    def remove_all(self) -> None:
        with self._lock:
            parts, self.parts = self.parts, {}
        for part, _path, fd in parts.values():
            with contextlib.suppress(OSError):
                os.unlink(part)
            os.close(fd)


def check_target(path: str, force: bool) -> None:
    """Refuse an output that exists (unless ``force``) or that could never be replaced."""
    if os.path.isdir(path) and not os.path.islink(path):
        raise MRCError(f"{path} is a directory")
    if not force and os.path.lexists(path):
        raise MRCError(f"{path} exists; not replacing it (use --force)")


def _create_part(path: str) -> tuple[int, str]:
    """A new part file beside ``path``: ``PATH.<random>.part``, created exclusively and locked
    (the lock goes with the descriptor: keep it open while the part is ours)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(8):
        part = f"{path}.{secrets.token_hex(PART_TOKEN_BYTES)}.part"
        try:
            fd = os.open(part, flags, 0o600)  # partial data: its owner's only
        except FileExistsError:
            continue
        except OSError as exc:
            raise MRCError(f"cannot create {part}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # a new file nobody else can know yet: not expected
            os.close(fd)
            os.unlink(part)
            raise MRCError(f"cannot lock {part}: {exc.strerror}") from None
        return fd, part
    raise MRCError(f"cannot create a part file beside {path}")


def stale_parts(out: str) -> list[str]:
    """Part files of ``--out`` (every ``{n}``) that no live receiver holds: left by one that was
    killed before it could delete them. Only files named as this module names part files, and
    only regular files, are looked at; none is opened for writing or changed."""
    pattern = glob.escape(out).replace(glob.escape("{n}"), "*")
    stale = []
    for candidate in sorted(glob.glob(f"{pattern}.{'[0-9a-f]' * (2 * PART_TOKEN_BYTES)}.part")):
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, a link, unreadable: not ours to judge
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            continue  # locked: a receiver is writing it right now
        finally:
            os.close(fd)
        stale.append(candidate)
    return stale


def _reserve(fd: int, size: int, part: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        where = os.path.dirname(os.path.abspath(part))
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise MRCError(f"no space for {size} bytes in {where}") from None
        raise MRCError(f"cannot reserve {size} bytes for {part}: {exc.strerror}") from None


def _put_in_place(part: str, path: str, force: bool) -> None:
    """Rename ``part`` to ``path``: atomically, and without replacing anything unless ``force``."""
    try:
        if force:
            os.replace(part, path)
        else:
            os.link(part, path)  # fails if path appeared meanwhile, where rename would replace
    except FileExistsError:
        raise MRCError(f"{path} appeared during the transfer; not replacing it") from None
    except OSError as exc:
        raise MRCError(f"cannot put the data in place as {path}: {exc.strerror}") from None
