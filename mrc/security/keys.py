"""Pre-shared key files: what `mrc-keygen` writes and `--key-file` reads.

A key file holds one line, ``mrc-key-v1 <base64 of 32 random bytes>``, and is created with mode
0600, exclusively and without following links (an existing file or a link is refused rather
than overwritten). Reading refuses a file that others may read: a key anyone on the host can
read keeps nobody out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import stat

from mrc.errors import MRCError

KEY_LEN = 32
MAGIC = "mrc-key-v1"
MAX_FILE = 4096


class KeyFileError(MRCError):
    """A key file that cannot be written or read (exit status 2: a configuration error)."""

    exit_code = 2


def generate_key() -> bytes:
    return secrets.token_bytes(KEY_LEN)


def fingerprint(key: bytes) -> str:
    """A short public name of a key (first 8 bytes of its SHA-256, hex), safe to print."""
    return hashlib.sha256(b"mrc key fingerprint\0" + key).hexdigest()[:16]


def write_key_file(path: str, key: bytes | None = None) -> bytes:
    """Create ``path`` holding ``key`` (a new one by default); never replaces anything."""
    key = generate_key() if key is None else key
    line = f"{MAGIC} {base64.b64encode(key).decode()}\n".encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path} exists; not replacing a key file") from None
    except OSError as exc:
        raise KeyFileError(f"cannot create {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask said
        os.write(fd, line)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    return key


def read_key_file(path: str) -> bytes:
    """The key in ``path``; a one-line :class:`KeyFileError` for anything wrong with it."""
    try:
        # O_NONBLOCK: a FIFO would otherwise block the open until a writer came (fstat below
        # then refuses it); reads of a regular file ignore the flag
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == 40 else exc.strerror  # ELOOP
        raise KeyFileError(f"cannot read key file {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"key file {path} is readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it"
            )
        raw = os.read(fd, MAX_FILE + 1)
    finally:
        os.close(fd)
    parts = raw.decode("ascii", "replace").split()
    if len(raw) > MAX_FILE or len(parts) != 2 or parts[0] != MAGIC:
        raise KeyFileError(f"{path} is not an mrc key file (make one with mrc-keygen)")
    try:
        key = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise KeyFileError(f"{path}: the key is not valid base64") from None
    if len(key) != KEY_LEN:
        raise KeyFileError(f"{path}: the key has {len(key)} bytes, not {KEY_LEN}")
    return key
