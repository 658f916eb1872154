"""The conventions a user expects of a command-line tool, checked on the real console scripts.

``--version`` everywhere, ``python -m mrc COMMAND`` running the same mains, ``-v``/``-q`` through
stdlib logging without touching stdout or the one-line error, a ``"version"`` in every JSON
object, and a LICENSE and CHANGELOG that match pyproject.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import mrc
from mrc.cli.common import configure_logging, emit_json, package_version, versioned
from mrc.lab.cli import bench as bench_cli
from mrc.lab.cli import fabric as fabric_cli

if TYPE_CHECKING:
    from conftest import MrcTools

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
TOOLS = ["mrc-send", "mrc-recv", "mrc-fabric", "mrc-bench", "mrc-keygen"]
SUBCOMMANDS = {"send": "mrc-send", "recv": "mrc-recv", "fabric": "mrc-fabric"}
SUBCOMMANDS |= {"bench": "mrc-bench", "keygen": "mrc-keygen"}
LOGGING_TOOLS = ["mrc-send", "mrc-recv", "mrc-fabric", "mrc-bench"]


def python_m_mrc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrc", *args], capture_output=True, text=True, timeout=timeout
    )


# --- --version -------------------------------------------------------------------------------


def test_versions_agree() -> None:
    """pyproject, the installed metadata and the fallback in mrc/__init__.py say the same."""
    assert PYPROJECT["version"] == mrc.__version__
    assert importlib.metadata.version("mrc-transport") == mrc.__version__
    assert package_version() == mrc.__version__


@pytest.mark.parametrize("tool", TOOLS)
def test_every_command_prints_its_version(mrc_tools: MrcTools, tool: str) -> None:
    res = mrc_tools.run(tool, "--version", timeout=30)
    assert res.returncode == 0, res.describe()
    expected = f"{tool} (mrc-transport) {mrc.__version__}\n"  # the command, the distribution
    assert res.stdout == expected and res.stderr == "", res.describe()


def test_fabric_sub_commands_leave_version_to_the_command(mrc_tools: MrcTools) -> None:
    """``--version`` belongs before the sub-command, as with git; after it, a usage error."""
    res = mrc_tools.run("mrc-fabric", "up", "--version", timeout=30)
    assert res.returncode == 2 and res.stderr.startswith("mrc-fabric: error: "), res.describe()


# --- python -m mrc ---------------------------------------------------------------------------


def test_python_m_mrc_lists_its_commands() -> None:
    res = python_m_mrc("--help")
    assert res.returncode == 0, res.stderr
    for sub, tool in SUBCOMMANDS.items():
        assert re.search(rf"^\s+{sub}\s+.*\(= {tool}\)", res.stdout, re.M), (sub, res.stdout)
    ver = python_m_mrc("--version")
    expected = f"mrc (mrc-transport) {mrc.__version__}\n"
    assert (ver.returncode, ver.stdout, ver.stderr) == (0, expected, "")


@pytest.mark.parametrize("args", [["frobnicate"], [], ["--bogus"]], ids=["unknown", "none", "flag"])
def test_python_m_mrc_usage_errors_are_one_line(args: list[str]) -> None:
    res = python_m_mrc(*args)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("mrc: error: "), res.stderr
    if args == ["frobnicate"]:
        assert "frobnicate" in res.stderr and "send" in res.stderr


@pytest.mark.parametrize("sub", list(SUBCOMMANDS))
def test_python_m_mrc_runs_the_console_scripts_mains(mrc_tools: MrcTools, sub: str) -> None:
    """Same help, same version line, same one-line usage error as the console script."""
    tool = SUBCOMMANDS[sub]
    for args in (["--help"], ["--version"], ["--no-such-flag"]):
        via_m = python_m_mrc(sub, *args)
        direct = mrc_tools.run(tool, *args, timeout=30)
        assert (via_m.returncode, via_m.stdout, via_m.stderr) == (
            direct.returncode,
            direct.stdout,
            direct.stderr,
        ), (sub, args)
    assert direct.returncode == 2 and direct.stderr.startswith(f"{tool}: error: ")


def test_python_m_mrc_moves_data_with_versioned_json(mrc_tools: MrcTools, mrc_port: int) -> None:
    """A real transfer through ``python -m mrc recv/send``: both print their JSON with the
    version, and say nothing on stderr at the default level."""
    listen = ["--listen", f"[::1]:{mrc_port}", "--discard", "--json", "--timeout", "30"]
    recv = mrc_tools.start("python", "-m", "mrc", "recv", *listen)
    recv.wait_listening(mrc_port)
    send = mrc_tools.run(
        "python", "-m", "mrc", "send", "--size", "256K", "--to", f"[::1]:{mrc_port}", "--json"
    )
    got = recv.wait(30)
    assert send.returncode == 0 and got.returncode == 0, send.describe() + got.describe()
    assert send.stderr == "" and got.stderr == ""
    for res, role in ((send, "send"), (got, "recv")):
        obj = res.json
        assert obj["role"] == role and obj["ok"] is True and obj["version"] == mrc.__version__


# --- -v / -q ---------------------------------------------------------------------------------


def test_verbose_notes_go_to_stderr_as_log_lines(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start(
        "mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "--json", "-v", "--timeout", "30"
    )
    recv.wait_listening(mrc_port)
    send = mrc_tools.run(
        "mrc-send", "--size", "256K", "--to", f"[::1]:{mrc_port}", "--payload", "8000", "-vv"
    )
    got = recv.wait(30)
    assert send.returncode == 0 and got.returncode == 0, send.describe() + got.describe()
    assert f"mrc-recv: info: listening on [::1]:{mrc_port}" in got.stderr.splitlines()
    assert "mrc-recv: info: transfer from ::1:" in got.stderr
    assert re.search(r"^mrc-recv: info: receive kernel: (native|python)", got.stderr, re.M)
    assert got.json["ok"] is True  # stdout unchanged: just the JSON object
    lines = send.stderr.splitlines()
    assert any(ln.startswith("mrc-send: info: connecting to [::1]") for ln in lines), lines
    assert any(ln.startswith("mrc-send: debug: ") for ln in lines), lines  # -vv
    assert all(re.match(r"mrc-send: (debug|info): ", ln) for ln in lines), lines
    assert send.stdout.startswith("ok: sent 256.0 KiB")


def test_quiet_and_default_say_nothing_on_success(mrc_tools: MrcTools, mrc_port: int) -> None:
    recv = mrc_tools.start("mrc-recv", "--listen", f"[::1]:{mrc_port}", "--discard", "-q")
    recv.wait_listening(mrc_port)
    send = mrc_tools.run("mrc-send", "--size", "64K", "--to", f"[::1]:{mrc_port}")
    got = recv.wait(30)
    assert send.returncode == 0 and got.returncode == 0, send.describe() + got.describe()
    assert send.stderr == "" and got.stderr == ""
    assert got.stdout.startswith("ok: received") and send.stdout.startswith("ok: sent")


@pytest.mark.parametrize("flag", [None, "-v", "-q"])
def test_failure_is_still_one_error_line(
    mrc_tools: MrcTools, mrc_port: int, flag: str | None
) -> None:
    """The ``PROG: error: ...`` line is the same whatever the level; -v only adds notes
    before it, -q takes nothing away from it."""
    extra = [flag] if flag else []
    res = mrc_tools.run("mrc-send", "--size", "1M", "--to", f"[::1]:{mrc_port}", *extra)
    assert res.returncode == 1, res.describe()
    lines = res.stderr.splitlines()
    assert lines[-1].startswith("mrc-send: error: ") and "refused" in lines[-1], lines
    # -v: "info: payload ... (path MTU ...)", "info: connecting to ..."
    assert len(lines) == (3 if flag == "-v" else 1), lines
    assert res.stdout == ""


@pytest.mark.parametrize("tool", LOGGING_TOOLS)
def test_verbose_and_quiet_exclude_each_other(mrc_tools: MrcTools, tool: str) -> None:
    res = mrc_tools.run(tool, "-v", "-q", timeout=30)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.describe()
    assert res.stderr.startswith(f"{tool}: error: ") and "not allowed" in res.stderr


@pytest.mark.parametrize("tool", LOGGING_TOOLS)
def test_help_mentions_version_verbose_quiet(mrc_tools: MrcTools, tool: str) -> None:
    res = mrc_tools.run(tool, "--help", timeout=30)
    for flag in ("--version", "-v, --verbose", "-q, --quiet"):
        assert flag in res.stdout, (tool, flag)


@pytest.mark.parametrize(
    ("argv", "verbose", "quiet"),
    [
        (["list"], 0, False),
        (["-v", "list"], 1, False),
        (["list", "-v"], 1, False),
        (["-vv", "status"], 2, False),
        (["up", "-q"], 0, True),
        (["-q", "down"], 0, True),
    ],
)
def test_fabric_takes_v_and_q_before_and_after_the_sub_command(
    argv: list[str], verbose: int, quiet: bool
) -> None:
    args = fabric_cli.build_parser().parse_args(argv)
    assert (args.verbose, args.quiet) == (verbose, quiet)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root, ours = logging.getLogger(), logging.getLogger("mrc")
    saved = (list(root.handlers), root.level, ours.level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    ours.setLevel(saved[2])


@pytest.mark.parametrize(
    ("parser", "argv", "level"),
    [
        (fabric_cli.build_parser, ["list"], logging.WARNING),
        (fabric_cli.build_parser, ["-v", "list"], logging.INFO),
        (fabric_cli.build_parser, ["-vv", "list"], logging.DEBUG),
        (fabric_cli.build_parser, ["-vvvv", "list"], logging.DEBUG),
        (fabric_cli.build_parser, ["-q", "list"], logging.ERROR),
        # mrc-bench's progress notes are what its user watches: INFO by default
        (bench_cli.build_parser, [], logging.INFO),
        (bench_cli.build_parser, ["-v"], logging.DEBUG),
        (bench_cli.build_parser, ["-q"], logging.ERROR),
    ],
)
def test_levels(
    restore_logging: None,
    parser: Callable[[], argparse.ArgumentParser],
    argv: list[str],
    level: int,
) -> None:
    args = parser().parse_args(argv)
    assert configure_logging(args) == level
    assert logging.getLogger("mrc.cli.send").getEffectiveLevel() == level
    # other libraries' debug chatter is not what -v asks for
    assert logging.getLogger("asyncio").getEffectiveLevel() == max(level, logging.WARNING)


def test_log_line_format_and_no_doubled_handlers(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(verbose=1, quiet=False, log_command="mrc-x")
    configure_logging(args)
    configure_logging(args)  # a second main in the same process
    logging.getLogger("mrc.cli.recv").info("listening on %s", "[::1]:4791")
    logging.getLogger("mrc.cli.recv").debug("not at INFO")
    logging.getLogger("pyroute2").info("not ours")
    assert capsys.readouterr().err == "mrc-x: info: listening on [::1]:4791\n"


def test_no_stderr_prints_left_in_the_commands() -> None:
    """A note printed with print() would ignore -q and -v: what the commands write to stderr
    themselves is only a one-line error; common.py (not scanned) holds the sanctioned writers,
    die and run_main, the progress bars draw through rich; everything else goes through
    logging."""
    allowed = {
        "recv.py": 1,  # mrc-recv: error: transfer from PEER failed: ... (one per transfer)
        "fabric.py": 1,  # mrc-fabric: error: cannot run CMD in NS (exec, after entering NS)
    }
    for path in sorted((REPO / "mrc" / "cli").glob("*.py")):
        if path.name == "common.py":
            continue
        text = path.read_text()
        found = len(re.findall(r"file=sys\.stderr|sys\.stderr\.write\(|put\(sys\.stderr", text))
        assert found == allowed.get(path.name, 0), (path.name, found)


# --- "version" in every JSON object ----------------------------------------------------------


def test_emit_json_stamps_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json({"ok": True})
    assert json.loads(capsys.readouterr().out) == {"ok": True, "version": mrc.__version__}
    assert versioned({"version": mrc.__version__}) == {"version": mrc.__version__}
    with pytest.raises(ValueError, match="different 'version'"):
        versioned({"version": 1})  # e.g. a file format's own version


def test_keygen_json_has_the_version(mrc_tools: MrcTools, tmp_path: Path) -> None:
    res = mrc_tools.run("mrc-keygen", str(tmp_path / "k"), "--json", timeout=30)
    assert res.returncode == 0, res.describe()
    assert res.json["version"] == mrc.__version__


def test_tools_json_has_the_version() -> None:
    """tools/profile_core.py runs without root in a second or two: its JSON says the version."""
    res = subprocess.run(
        [sys.executable, str(REPO / "tools" / "profile_core.py"), "--size", "256K", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["version"] == mrc.__version__


def test_json_printed_only_through_emit_json() -> None:
    """Every command's and tool's JSON goes through emit_json (or json_text, for a line written
    by mrc.cli.lineout), so none can forget the version.
    The one exception: mrc-fabric ``up --json`` prints the topology file, whose own ``version``
    is its format's."""
    allowed = {
        "mrc/cli/common.py": 1,  # json_text, which emit_json prints
        "mrc/lab/cli/fabric.py": 1,
        "mrc/lab/harness/peers.py": 1,  # bench_qp's helper: its JSON lines are bench_qp's input
    }
    files = [*(REPO / "mrc").rglob("*.py"), *(REPO / "tools").glob("*.py")]
    for path in files:
        name = str(path.relative_to(REPO))
        found = len(re.findall(r"print\(\s*json\.dumps|json\.dumps\(versioned", path.read_text()))
        assert found == allowed.get(name, 0), (name, found)


# --- LICENSE and CHANGELOG -------------------------------------------------------------------


def test_license_file_matches_pyproject() -> None:
    assert PYPROJECT["license"] == "Apache-2.0"  # an SPDX expression (PEP 639)
    assert PYPROJECT["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    meta = importlib.metadata.metadata("mrc-transport")
    assert meta["License-Expression"] == "Apache-2.0"


def test_changelog_has_unreleased_and_the_current_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings[0] == "Unreleased" and PYPROJECT["version"] in headings
