"""cli.common.run_main: how every command turns a failure into one line and an exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from mrc.cli.common import GC_THRESHOLDS, run_main
from mrc.errors import FabricError, MRCError, UsageError


def _raise(exc: BaseException) -> Callable[[], int]:  # -> a command body
    def body() -> int:
        raise exc

    return body


@pytest.mark.parametrize(
    ("exc", "status", "line"),
    [
        (MRCError("peer gone"), 1, "prog: error: peer gone"),
        (FabricError("no fabric 'x'"), 1, "prog: error: no fabric 'x'"),
        (UsageError("bad rate 'fast'"), 2, "prog: error: bad rate 'fast'"),
        (KeyboardInterrupt(), 130, "prog: interrupted"),
        (
            ValueError("boom"),
            1,
            "prog: error: internal error: ValueError: boom (set MRC_DEBUG=1 for a traceback)",
        ),
    ],
)
def test_failures_are_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: BaseException,
    status: int,
    line: str,
) -> None:
    monkeypatch.delenv("MRC_DEBUG", raising=False)
    assert run_main("prog", _raise(exc)) == status
    out, err = capsys.readouterr()
    assert out == "" and err == line + "\n"


def test_mrc_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MRC_DEBUG", "1")
    with pytest.raises(ValueError):
        run_main("prog", _raise(ValueError("boom")))


def test_success_passes_the_status_through() -> None:
    assert run_main("prog", lambda: 7) == 7


def test_a_command_runs_with_the_collector_set_for_a_transfer() -> None:
    """run_command freezes what exists and widens the young generation before the body runs
    (docs/PERFORMANCE.md, "Fewer objects per packet at the sender"); in a child, so this
    process's collector is left as it is."""
    code = (
        "import gc, json\n"
        "from mrc.cli.common import run_command\n"
        "before = gc.get_threshold()\n"
        "async def body():\n"
        "    print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))\n"
        "    return 3\n"
        "raise SystemExit(run_command('prog', body()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3, done.stderr
    before, during, frozen = json.loads(done.stdout)
    assert tuple(before) == (700, 10, 10)  # Python's own
    assert tuple(during) == GC_THRESHOLDS
    assert frozen > 1000  # the modules' objects, at least
