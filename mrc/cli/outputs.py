"""Where mrc-recv puts what it receives: memory for ``--discard``, part files for ``--out``.

A part file is created new beside its output (``FILE.mrc-<random>.part``), locked (``flock``)
for as long as its receiver holds it, and renamed into place only once its transfer is
verified. A receiver killed with SIGKILL cannot delete its part files; the lock is what tells
the next receiver that nobody owns them any more (:func:`stale_parts`), and the ``mrc-`` in the
name what tells it that the file is mrc-recv's, whatever ``--out`` it was for.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import glob
import itertools
import logging
import mmap
import os
import re
import secrets
import shlex
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, field

from mrc.cli.prefault import Prefault, map_region
from mrc.errors import MRCError

log = logging.getLogger(__name__)

#: ``--discard``: a transfer larger than this comes through a window of this many bytes
DISCARD_WINDOW = 64 << 20
#: random bytes in a part file's name (PATH.mrc-<hex>.part)
PART_TOKEN_BYTES = 4
#: what marks a part file as mrc-recv's, before its random hex
PART_MARK = "mrc-"
#: how long a new part file waits for its lock while a receiver starting beside it holds a
#: shared one for a moment (checking whether it is stale: :func:`stale_parts`)
LOCK_WAIT = 0.5
#: :func:`stale_parts` reads at most this many directory entries, opens at most this many part
#: files, looks in at most this many directories (``{n}`` in a directory name), and names at
#: most this many (the rest are counted)
STALE_SCAN_ENTRIES = 100_000
STALE_SCAN_CHECKS = 1_000
STALE_SCAN_DIRS = 64
STALE_NAMED = 32
#: an empty part file nobody holds, younger than this, may be one a receiver has created and
#: not yet locked: not called stale
CREATING_GRACE = 10.0

_HEX = f"[0-9a-f]{{{2 * PART_TOKEN_BYTES}}}"
#: a part file: FILE.mrc-<hex>.part (FILE: any name, newlines included)
_PART = re.compile(rf"(?s).+\.{re.escape(PART_MARK)}{_HEX}\.part")
#: a part file as receivers before the mark named them: FILE.<hex>.part
_LEGACY_PART = re.compile(rf"(?s)(.+)\.{_HEX}\.part")


def discard_bytes(size: int, window: int) -> int:
    """The memory ``--discard`` maps for a transfer of ``size`` bytes: all of it, or, when
    larger than ``window`` (``--discard-window``), a window of two equal slots."""
    return size if size <= window else window - window % 2


class Outputs:
    """Allocates the memory a sender asks for and owns the files behind it.

    ``--discard`` grants at most a window of ``--discard-window`` bytes (two slots a larger
    transfer streams through, each hashed as it lands: mrc/app/rounds.py), so memory does not grow
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
        #: senders refused for want of an output (or too large), and the last one's reason
        self.refused = 0
        self.last_refusal: str | None = None

    def __call__(self, size: int, request: dict[str, object]) -> mmap.mmap:
        try:
            return self._grant(size)
        except MRCError as exc:
            # the sender hears why; this side says it too, or a receiver waiting for a good
            # sender would look as if nobody had come
            with self._lock:
                self.refused += 1
                self.last_refusal = str(exc)
            log.warning("refused a sender: %s", exc)
            raise

    def _grant(self, size: int) -> mmap.mmap:
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


def check_out_dir(out: str) -> None:
    """Refuse an ``--out`` whose directory does not exist or takes no new file here (missing,
    read-only, on a read-only file system, or a place such as /proc where nothing can be
    created): said at start, before listening, where otherwise each sender would be refused
    and the receiver wait on. A file is created in it and removed at once to tell. A ``{n}``
    in the directory's name makes a directory per transfer: then only the fixed part before
    it must exist (each is checked when its file is made)."""
    directory = os.path.dirname(out)
    if "{n}" in directory:
        fixed = directory[: directory.index("{n}")]
        parent = (fixed if fixed.endswith("/") else os.path.dirname(fixed)).rstrip("/")
        if parent and not os.path.isdir(parent):
            raise MRCError(f"the directory {parent} does not exist")
        return
    directory = directory or "."
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.lexists(directory) else "does not exist"
        raise MRCError(f"the directory {directory} {what}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".mrc-probe-", dir=directory)
    except OSError as exc:
        raise MRCError(f"cannot create files in {directory}: {exc.strerror}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_target(path: str, force: bool) -> None:
    """Refuse an output that exists (unless ``force``) or that could never be replaced."""
    if os.path.isdir(path) and not os.path.islink(path):
        raise MRCError(f"{path} is a directory")
    if not force and os.path.lexists(path):
        raise MRCError(f"{path} exists; not replacing it (use --force)")


def _create_part(path: str) -> tuple[int, str]:
    """A new part file beside ``path``: ``PATH.mrc-<random>.part``, created exclusively and
    locked (the lock goes with the descriptor: keep it open while the part is ours)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(8):
        part = f"{path}.{PART_MARK}{secrets.token_hex(PART_TOKEN_BYTES)}.part"
        try:
            fd = os.open(part, flags, 0o600)  # partial data: its owner's only
        except FileExistsError:
            continue
        except OSError as exc:
            raise MRCError(f"cannot create {part}: {exc.strerror}") from None
        try:
            _lock_new(fd)
        except OSError as exc:
            os.close(fd)
            os.unlink(part)
            raise MRCError(f"cannot lock {part}: {exc.strerror}") from None
        return fd, part
    raise MRCError(f"cannot create a part file beside {path}")


def _lock_new(fd: int) -> None:
    """Lock a new part file for good. Only a receiver checking whether it is stale can hold
    it now (a shared lock, for as long as one ``flock`` and ``close`` take): wait that out."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


@dataclass
class StaleParts:
    """What :func:`stale_parts` found."""

    #: stale part files (the directory as ``--out`` gives it, joined with the name), at most
    #: :data:`STALE_NAMED`, by name
    paths: list[str] = field(default_factory=list)
    #: stale part files found beyond those
    more: int = 0
    #: False when a bound cut the search short (there may be more)
    complete: bool = True
    #: part files that could not be opened to be checked (another user's, say)
    unchecked: int = 0
    #: one line each: a directory that could not be read, a search cut short
    notes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.paths) + self.more


def stale_parts(out: str) -> StaleParts:
    """Part files in ``--out``'s directory (every ``{n}``'s) that no live receiver holds: left
    by one that was killed before it could delete them, for whatever ``--out``.

    A file is taken for one of ours only when it is a regular file (never a link: nothing is
    followed), named ``FILE.mrc-<hex>.part``, and nobody holds its lock: a receiver holds the
    lock of each of its part files for as long as it lives. A name from before the mark,
    ``FILE.<hex>.part``, counts when ``FILE`` is ``--out``'s name, as it always did, or when the
    file is private (mode 0600 or less) and this user's, as every part file is until verified.
    None is opened for writing or changed; the work is bounded (``STALE_SCAN_*``)."""
    found = StaleParts()
    budget = _Budget(STALE_SCAN_ENTRIES, STALE_SCAN_CHECKS)
    head = os.path.dirname(out)
    base = re.escape(os.path.basename(out)).replace(re.escape("{n}"), ".*")
    same = re.compile(f"(?s){base}")
    if "{n}" in head:
        pattern = glob.escape(head).replace("{n}", "*")
        dirs = sorted(
            d
            for d in itertools.islice(glob.iglob(pattern), STALE_SCAN_DIRS)
            if os.path.isdir(d) and not os.path.islink(d)
        )
    else:
        dirs = [head]
    for directory in dirs:
        _scan_dir(directory, same, found, budget)
    return found


@dataclass
class _Budget:
    entries: int
    checks: int


def _scan_dir(directory: str, same: re.Pattern[str], found: StaleParts, budget: _Budget) -> None:
    shown = shell_word(directory or ".")
    try:
        dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing left there; the transfer will say what is wrong with it
    except OSError as exc:
        found.notes.append(f"cannot look for stale part files in {shown}: {exc.strerror}")
        return
    try:
        candidates = []
        try:
            with os.scandir(dfd) as entries:
                for entry in entries:
                    if budget.entries <= 0:
                        found.complete = False
                        found.notes.append(
                            f"stopped looking for stale part files in {shown} after "
                            f"{STALE_SCAN_ENTRIES} directory entries"
                        )
                        break
                    budget.entries -= 1
                    name = entry.name
                    if not name.endswith(".part"):
                        continue
                    kind = _part_kind(name, same)
                    if kind is None:
                        continue
                    with contextlib.suppress(OSError):
                        if entry.is_file(follow_symlinks=False):  # no link, FIFO, device
                            candidates.append((name, kind))
        except OSError as exc:
            found.notes.append(f"cannot read {shown} for stale part files: {exc.strerror}")
        now = time.time()
        for name, kind in sorted(candidates):
            if budget.checks <= 0:
                found.complete = False
                found.notes.append(
                    f"stopped checking part files in {shown} after {STALE_SCAN_CHECKS}"
                )
                break
            budget.checks -= 1
            verdict = _judge(dfd, name, kind, now)
            if verdict is None:
                continue
            if not verdict:
                found.unchecked += 1
            elif len(found.paths) < STALE_NAMED:
                found.paths.append(os.path.join(directory, name))
            else:
                found.more += 1
    finally:
        os.close(dfd)


#: kinds of part file name (:func:`_part_kind`)
_MARKED, _LEGACY_SAME, _LEGACY = "marked", "legacy-same", "legacy"


def _part_kind(name: str, same: re.Pattern[str]) -> str | None:
    if _PART.fullmatch(name):
        return _MARKED
    legacy = _LEGACY_PART.fullmatch(name)
    if legacy is None:
        return None
    return _LEGACY_SAME if same.fullmatch(legacy.group(1)) else _LEGACY


def _judge(dfd: int, name: str, kind: str, now: float) -> bool | None:
    """True: the part file ``name`` (in the directory ``dfd``) is stale; None: it is not, or is
    not a part file of ours; False: it could not be opened to tell."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except PermissionError:
        return False
    except OSError:
        return None  # gone meanwhile, a link now (ELOOP): not ours to judge
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if kind == _LEGACY and (st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077):
            return None  # an old-style name for another FILE: only a private file of ours
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return None  # locked: a receiver is writing it right now
        if st.st_size == 0 and st.st_ctime > now - CREATING_GRACE:
            return None  # perhaps created by a receiver this instant, not yet locked
        again = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
            return None  # renamed or replaced meanwhile
        return True
    except OSError:
        return None  # gone meanwhile
    finally:
        os.close(fd)


def shell_word(text: str) -> str:
    """``text`` as one word of a shell command line, on one line: shlex.quote's quoting, or,
    when it holds a newline or another character that does not print, bash's ``$'...'`` with
    those characters as ``\\xHH`` (the bytes of the name, undecodable ones too)."""
    if text.isprintable():
        return shlex.quote(text)
    chars = []
    for ch in text:
        if ch in "\\'":
            chars.append("\\" + ch)
        elif ch.isprintable():
            chars.append(ch)
        else:
            chars.extend(f"\\x{b:02x}" for b in os.fsencode(ch))
    return "$'" + "".join(chars) + "'"


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
