"""Part files a killed mrc-recv left behind are named by the next one, whatever its --out.

Seen on an earlier main (issue 36, item 6): mrc-recv --out dir/a.bin killed with SIGKILL mid
transfer, then mrc-recv --out dir/b.bin in the same directory: the 512 MiB a.bin part file
stayed, never mentioned, because only part files of the same --out name were looked for.

A part file is now FILE.mrc-<hex>.part: the mark says it is mrc-recv's, its lock (held for as
long as its receiver lives) whether anyone still owns it. What must never be named: a live
receiver's part file, a file of the user's that merely ends in .part, anything reached through
a link, anything outside the directory.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest
from conftest import free_port

from cli.test_recv_output import _idle_sender
from mrc.cli import outputs, recv
from mrc.cli.outputs import shell_word

if TYPE_CHECKING:
    from conftest import MrcTools, Running

WARNING = (
    "mrc-recv: warning: {count} part file(s) left by a receiver that is gone (their transfers "
    "never completed){first}; remove with: rm -- {words}"
)


def _wait_for(what: Callable[[], list[str]], timeout: float = 10.0) -> list[str]:
    """Poll until ``what()`` returns something (bounded)."""
    deadline = time.monotonic() + timeout
    while not (found := what()):
        if time.monotonic() > deadline:
            pytest.fail(f"nothing appeared within {timeout} s")
        time.sleep(0.01)
    return found


def _parts_of(d: Path, prefix: str) -> Callable[[], list[str]]:
    return lambda: sorted(
        p.name for p in d.iterdir() if p.name.startswith(prefix) and p.name.endswith(".part")
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)


def _start_receiver(mrc_tools: MrcTools, out: Path, *extra: str) -> tuple[Running, int]:
    port = free_port()
    proc = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{port}", "--out", str(out), *extra)
    proc.wait_listening(port)  # it looks for stale part files before it listens
    return proc, port


def _stop(proc: Running) -> str:
    proc.proc.send_signal(signal.SIGTERM)
    res = proc.wait(timeout=20)
    assert res.returncode == 130, res.describe()
    assert "Traceback" not in res.stderr
    return str(res.stderr)


def test_a_killed_receivers_part_file_is_named_by_a_receiver_with_another_out(
    mrc_tools: MrcTools, tmp_path: Path
) -> None:
    d = tmp_path / "dir"
    d.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()

    # mrc-recv --out dir/a.bin, killed with SIGKILL while a transfer is under way
    killed, port = _start_receiver(mrc_tools, d / "a.bin")
    sender = _idle_sender(port, 4 << 20, 1000)
    try:
        (stale,) = _wait_for(_parts_of(d, "a.bin."))
        assert stale.startswith("a.bin.mrc-")
        killed.proc.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=20).returncode == -signal.SIGKILL
    finally:
        sender.kill()
        sender.wait()
    assert (d / stale).stat().st_size == 4 << 20  # still there: a killed process deletes nothing

    # beside it: a receiver alive and writing, and files that are not stale part files of ours
    alive, port2 = _start_receiver(mrc_tools, d / "c.bin")
    sender = _idle_sender(port2, 4 << 20, 1000)
    try:
        (live,) = _wait_for(_parts_of(d, "c.bin."))
        _write(d / "x.part", b"the user's", 0o600)
        _write(d / "notes.part", b"the user's", 0o600)
        _write(d / "backup.deadbeef.part", b"the user's, shared", 0o644)  # old-style look-alike
        _write(d / "old.bin.0123abcd.part", b"an older receiver's", 0o600)  # old-style, ours
        _write(d / "b.bin.89abcdef.part", b"an older receiver's", 0o644)  # old-style, --out's
        odd = "we ird\n'x.bin.mrc-00ff00ff.part"
        _write(d / odd, b"left by a receiver", 0o600)
        (d / "young.bin.mrc-44444444.part").touch()  # empty, just made: perhaps not locked yet
        victim = outside / "victim.bin.mrc-0badf00d.part"
        _write(victim, b"outside the directory", 0o600)
        (d / "link.bin.mrc-0badf00d.part").symlink_to(victim)
        (d / "dirlink.bin.mrc-11111111.part").symlink_to(outside)
        (d / "dangling.bin.mrc-55555555.part").symlink_to(outside / "nothing")
        os.mkfifo(d / "fifo.bin.mrc-22222222.part")  # opening it would block: never opened
        (d / "sub.bin.mrc-33333333.part").mkdir()
        before = sorted(os.listdir(d))

        third, _port3 = _start_receiver(mrc_tools, d / "b.bin")
        stderr = _stop(third)

        warnings = [line for line in stderr.splitlines() if "part file" in line]
        named = [
            str(d / stale),
            str(d / "b.bin.89abcdef.part"),
            str(d / "old.bin.0123abcd.part"),
            "$'" + str(d) + "/we ird\\x0a\\'x.bin.mrc-00ff00ff.part'",
        ]
        assert warnings == [WARNING.format(count=4, first="", words=" ".join(named))], stderr
        assert live not in stderr and "link" not in stderr and "fifo" not in stderr
        assert sorted(os.listdir(d)) == before  # named, nothing removed
        assert victim.read_bytes() == b"outside the directory"

        # the rm line, run as given, removes exactly the stale part files (the live sibling's
        # is still being written: its sender is still there)
        rm = warnings[0].split("remove with: ", 1)[1]
        subprocess.run(["bash", "-c", rm], check=True)
        gone = {stale, "b.bin.89abcdef.part", "old.bin.0123abcd.part", odd}
        assert sorted(os.listdir(d)) == sorted(set(before) - gone)
        assert live in os.listdir(d) and victim.exists()
        assert alive.proc.poll() is None
    finally:
        sender.kill()
        sender.wait()
    res = alive.wait(timeout=60)  # fails on its sender going away, and deletes its part file
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.describe()
    assert live not in os.listdir(d)


def test_a_second_receiver_in_the_same_directory_is_never_told_a_live_part_is_stale(
    mrc_tools: MrcTools, tmp_path: Path
) -> None:
    """Two receivers writing in one directory, then a third: nothing is named, and the two
    transfers are not disturbed by the third looking at their part files."""
    first, port1 = _start_receiver(mrc_tools, tmp_path / "one.bin")
    second, port2 = _start_receiver(mrc_tools, tmp_path / "two.bin")
    s1 = _idle_sender(port1, 2 << 20, 1000)
    s2 = _idle_sender(port2, 2 << 20, 1000)
    try:
        _wait_for(_parts_of(tmp_path, "one.bin.mrc-"))
        _wait_for(_parts_of(tmp_path, "two.bin.mrc-"))
        third, _ = _start_receiver(mrc_tools, tmp_path / "three.bin", "-v")
        stderr = _stop(third)
        assert "part file" not in stderr, stderr
        assert len(_parts_of(tmp_path, "")()) == 2
    finally:
        for s in (s1, s2):
            s.kill()
            s.wait()
    for r in (first, second):
        res = r.wait(timeout=60)  # each fails on its own sender going away, and cleans up
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.describe()
    assert _parts_of(tmp_path, "")() == []


def test_thousands_of_files_bounded_work_and_a_bounded_line(
    mrc_tools: MrcTools, tmp_path: Path
) -> None:
    for i in range(3000):
        (tmp_path / f"f{i}.dat").write_bytes(b"")
    for i in range(outputs.STALE_SCAN_CHECKS + 100):
        (tmp_path / f"s{i:04d}.bin.mrc-{i:08x}.part").write_bytes(b"x")
    t0 = time.monotonic()
    proc, _ = _start_receiver(mrc_tools, tmp_path / "new.bin", "-v")
    assert time.monotonic() - t0 < 10
    stderr = _stop(proc)
    lines = [line for line in stderr.splitlines() if "part file" in line]
    named = [str(tmp_path / f"s{i:04d}.bin.mrc-{i:08x}.part") for i in range(outputs.STALE_NAMED)]
    assert lines == [
        f"mrc-recv: info: stopped checking part files in {tmp_path} after "
        f"{outputs.STALE_SCAN_CHECKS}",
        WARNING.format(
            count=f"at least {outputs.STALE_SCAN_CHECKS}",
            first=f" (the first {outputs.STALE_NAMED} named here)",
            words=" ".join(named),
        ),
    ], stderr
    assert len(list(tmp_path.iterdir())) == 3000 + outputs.STALE_SCAN_CHECKS + 100


def test_what_cannot_be_read_is_one_line_with_v(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As root nothing is unreadable, so the refusals are made here: an unreadable part file is
    counted (not named, not an error); a directory that cannot be read is one line."""
    (tmp_path / "a.bin.mrc-0123abcd.part").write_bytes(b"x")
    (tmp_path / "b.bin.mrc-89abcdef.part").write_bytes(b"x")
    real_open = os.open

    def refuse(
        path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None
    ) -> int:
        if dir_fd is not None and str(path).startswith("a.bin"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    caplog.set_level(logging.INFO, logger="mrc.cli.recv")
    monkeypatch.setattr("mrc.cli.outputs.os.open", refuse)
    recv._warn_stale_parts(str(tmp_path / "new.bin"))
    monkeypatch.undo()
    assert [r.getMessage() for r in caplog.records] == [
        "1 part file(s) could not be opened to check whether they are stale",
        "1 part file(s) left by a receiver that is gone (their transfers never completed); "
        f"remove with: rm -- {tmp_path}/b.bin.mrc-89abcdef.part",
    ]

    caplog.clear()

    def unreadable(path: object) -> NoReturn:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("mrc.cli.outputs.os.scandir", unreadable)
    odd = tmp_path / "d\nir"
    odd.mkdir()
    recv._warn_stale_parts(str(odd / "new.bin"))
    monkeypatch.undo()
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot read $'{tmp_path}/d\\x0air' for stale part files: Permission denied"
    ]
    # a directory that is not there yet: nothing to say (the transfer says what is wrong)
    caplog.clear()
    recv._warn_stale_parts(str(tmp_path / "missing" / "new.bin"))
    assert caplog.records == []


def test_n_in_the_directory_name(tmp_path: Path) -> None:
    """--out run{n}/data.bin: every run directory is looked in, a link to one is not."""
    for n in (1, 2):
        (tmp_path / f"run{n}").mkdir()
        (tmp_path / f"run{n}" / f"data.bin.mrc-0000000{n}.part").write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.bin.mrc-00000009.part").write_bytes(b"x")
    (tmp_path / "run9").symlink_to(elsewhere)
    found = outputs.stale_parts(str(tmp_path / "run{n}" / "data.bin"))
    assert found.paths == [
        str(tmp_path / "run1" / "data.bin.mrc-00000001.part"),
        str(tmp_path / "run2" / "data.bin.mrc-00000002.part"),
    ]
    assert found.complete and found.notes == []


@pytest.mark.parametrize(
    "name",
    [
        "plain.bin",
        "a b'c\"d $HOME `x` *",
        "new\nline",
        "esc\x1b[31mred",
        "café",
        os.fsdecode(b"bad\xff\xfebytes"),
        "bidi\u202eX",
        "back\\slash\n'q",
        "-dash",
        "tab\there1a",
    ],
)
def test_shell_word_is_one_line_and_means_the_name(name: str) -> None:
    word = shell_word(name)
    assert "\n" not in word and word.isprintable()
    res = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True)
    assert res.stdout == os.fsencode(name)


def test_a_new_part_file_waits_out_a_checkers_shared_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver starting beside another holds a shared lock on each part file for a moment
    (stale_parts); the other, locking its new part file then, waits instead of failing."""
    path = tmp_path / "f"
    path.write_bytes(b"")
    owner = os.open(path, os.O_RDWR)
    checker = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(checker, fcntl.LOCK_SH | fcntl.LOCK_NB)
        monkeypatch.setattr(outputs, "LOCK_WAIT", 0.05)
        with pytest.raises(BlockingIOError):  # held throughout: gives up, bounded
            outputs._lock_new(owner)
        monkeypatch.setattr(outputs, "LOCK_WAIT", 10.0)
        errors: list[BaseException] = []

        def lock() -> None:
            try:
                outputs._lock_new(owner)
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=lock)
        t.start()
        os.close(checker)  # released, before or while the owner tries: either way it gets it
        checker = -1
        t.join(timeout=10)
        assert not t.is_alive() and errors == []
        probe = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(probe)
    finally:
        os.close(owner)
        if checker >= 0:
            os.close(checker)
