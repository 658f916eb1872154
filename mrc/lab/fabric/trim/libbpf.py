"""The few libbpf calls trimming needs, through ctypes (libbpf.so.1 ships with iproute2's tc).

Why libbpf and not a raw bpf(2) loader: the program's map values hold a ``bpf_spin_lock``,
which needs BTF, ELF relocations and map creation done exactly as libbpf does them.  Why not
``bpftool``/``tc ... obj``: one process per router and port is slow, and tc pins maps in its own
fixed directory, while we want one set of maps per router under a per-fabric directory.

Everything here acts on file descriptors of this process; a loaded program lives on through its
bpffs pins and the tc filters that reference it after the object is closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
import threading
from collections.abc import Iterator

from mrc.errors import FabricError

BPF_F_LOCK = 4  # lookup/update: copy the value under its bpf_spin_lock
BPF_ANY = 0

_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_print_lock = threading.Lock()

# int (*libbpf_print_fn_t)(enum libbpf_print_level, const char *fmt, va_list ap).  va_list is
# an array type on x86-64 (decays to a pointer) and a >16-byte struct on arm64 (passed by
# reference): a void pointer either way, which is all vsnprintf needs.
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


def _load() -> ctypes.CDLL:
    global _lib, _lib_error
    if _lib is not None:
        return _lib
    if _lib_error is not None:
        raise FabricError(_lib_error)
    names = ["libbpf.so.1"]
    found = ctypes.util.find_library("bpf")
    if found and found not in names:
        names.append(found)
    for name in names:
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            break
        except OSError:
            continue
    else:
        _lib_error = "libbpf.so.1 not found: install clang libbpf-dev (tools/setup.sh does)"
        raise FabricError(_lib_error)
    vp, cp, ci, u32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32
    sigs = {
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__load": (ci, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_object__find_map_fd_by_name": (ci, [vp, cp]),
        "bpf_program__fd": (ci, [vp]),
        "bpf_obj_pin": (ci, [ci, cp]),
        "bpf_obj_get": (ci, [cp]),
        "bpf_map_lookup_elem_flags": (ci, [ci, vp, vp, ctypes.c_uint64]),
        "bpf_map_update_elem": (ci, [ci, vp, vp, ctypes.c_uint64]),
        "bpf_map_get_next_key": (ci, [ci, vp, vp]),
        "bpf_obj_get_info_by_fd": (ci, [ci, vp, ctypes.POINTER(u32)]),
        "libbpf_set_print": (vp, [vp]),
    }
    try:
        for fname, (res, args) in sigs.items():
            fn = getattr(lib, fname)
            fn.restype = res
            fn.argtypes = args
    except AttributeError as e:
        _lib_error = f"libbpf is too old ({e}); need libbpf >= 1.0"
        raise FabricError(_lib_error) from None
    _lib = lib
    return lib


def available() -> str | None:
    """None if libbpf can be used, else why not (one line)."""
    try:
        _load()
    except FabricError as e:
        return str(e)
    return None


def _err(rc: int) -> int:
    """libbpf >= 1.0 returns -errno (and sets errno)."""
    return -rc if rc < 0 else (ctypes.get_errno() or errno.EIO)


@contextlib.contextmanager
def _captured_log() -> Iterator[list[str]]:
    """Collect libbpf's messages (verifier log included) instead of printing them."""
    lib = _load()
    lines: list[str] = []

    def _cb(level: int, fmt: bytes, ap: int) -> int:
        buf = ctypes.create_string_buffer(4096)
        n: int = _libc.vsnprintf(buf, len(buf), fmt, ap)
        lines.append(buf.value.decode(errors="replace"))
        return n

    cb = _PRINT_FN(_cb)
    with _print_lock:
        old = lib.libbpf_set_print(ctypes.cast(cb, ctypes.c_void_p))
        try:
            yield lines
        finally:
            lib.libbpf_set_print(old)


class BpfObject:
    """One loaded instance of an object file: its programs and maps (own copies)."""

    def __init__(self, path: str) -> None:
        lib = _load()
        self._obj = None
        with _captured_log() as log:
            obj = lib.bpf_object__open_file(os.fsencode(path), None)
            if not obj:
                e = ctypes.get_errno()
                raise FabricError(f"cannot open BPF object {path}: {os.strerror(e)}")
            rc = lib.bpf_object__load(obj)
            if rc != 0:
                lib.bpf_object__close(obj)
                tail = " | ".join(s.strip() for s in "".join(log).splitlines()[-6:] if s.strip())
                raise FabricError(
                    f"loading BPF program failed: {os.strerror(_err(rc))}: {tail[-600:]}"
                )
        self._obj = obj

    def program_fd(self, name: str) -> int:
        prog = _load().bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise FabricError(f"BPF object has no program {name!r}")
        return int(_load().bpf_program__fd(prog))

    def map_fd(self, name: str) -> int:
        fd: int = _load().bpf_object__find_map_fd_by_name(self._obj, name.encode())
        if fd < 0:
            raise FabricError(f"BPF object has no map {name!r}")
        return fd

    def close(self) -> None:
        if self._obj:
            _load().bpf_object__close(self._obj)
            self._obj = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pin(fd: int, path: str) -> None:
    rc = _load().bpf_obj_pin(fd, os.fsencode(path))
    if rc != 0:
        e = _err(rc)
        raise OSError(e, f"pin {path}: {os.strerror(e)}", path)


def open_pinned(path: str) -> int:
    """A new fd for a pinned program or map (close it with os.close)."""
    fd: int = _load().bpf_obj_get(os.fsencode(path))
    if fd < 0:
        e = _err(fd)
        raise OSError(e, f"open pinned {path}: {os.strerror(e)}", path)
    return fd


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    rc = _load().bpf_map_update_elem(fd, key, value, flags)
    if rc != 0:
        e = _err(rc)
        raise OSError(e, f"map update: {os.strerror(e)}")


def map_lookup(fd: int, key: bytes, size: int, flags: int = 0) -> bytes | None:
    buf = ctypes.create_string_buffer(size)
    rc = _load().bpf_map_lookup_elem_flags(fd, key, buf, flags)
    if rc != 0:
        e = _err(rc)
        if e == errno.ENOENT:
            return None
        raise OSError(e, f"map lookup: {os.strerror(e)}")
    return buf.raw


def map_keys(fd: int, key_size: int) -> list[bytes]:
    keys: list[bytes] = []
    prev = None
    nxt = ctypes.create_string_buffer(key_size)
    while _load().bpf_map_get_next_key(fd, prev, nxt) == 0:
        keys.append(nxt.raw)
        prev = ctypes.create_string_buffer(nxt.raw, key_size)
        if len(keys) > 65536:  # a map changing under us cannot loop forever
            break
    return keys


class _MapInfo(ctypes.Structure):
    # leading fields of struct bpf_map_info (stable UAPI)
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


def map_info(fd: int) -> tuple[int, int, int]:
    """(key_size, value_size, max_entries) of a map fd."""
    info = _MapInfo()
    n = ctypes.c_uint32(ctypes.sizeof(info))
    rc = _load().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(n))
    if rc != 0:
        e = _err(rc)
        raise OSError(e, f"map info: {os.strerror(e)}")
    return info.key_size, info.value_size, info.max_entries


#: offsets of run_time_ns / run_cnt in struct bpf_prog_info (stable UAPI, since Linux 5.1)
_PROG_INFO_SIZE = 232
_RUN_TIME_NS_OFF = 192


def prog_run_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a program fd: how long it ran in total and how often.  Both
    stay 0 unless ``sysctl kernel.bpf_stats_enabled=1`` (counting costs a clock read per run)."""
    buf = ctypes.create_string_buffer(_PROG_INFO_SIZE)
    n = ctypes.c_uint32(_PROG_INFO_SIZE)
    rc = _load().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(n))
    if rc != 0:
        e = _err(rc)
        raise OSError(e, f"prog info: {os.strerror(e)}")
    if n.value < _RUN_TIME_NS_OFF + 16:
        return 0, 0
    return struct.unpack_from("=QQ", buf.raw, _RUN_TIME_NS_OFF)


def possible_cpus() -> int:
    """Number of possible CPUs (per-CPU map values come as one slot per possible CPU)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n
