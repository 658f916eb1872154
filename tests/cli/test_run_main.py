"""cli.common.run_main: how every command turns a failure into one line and an exit status."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mrc.cli.common import run_main
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
