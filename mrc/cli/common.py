"""What the commands share: argument parsing and validators, one-line errors, progress, output.

Every command (mrc-send, mrc-recv, mrc-fabric, mrc-bench and the scripts in tools/) runs its body
through :func:`run_main` (or :func:`run_command` for a coroutine), so a failure always ends the
same way: one line ``PROG: error: ...`` on stderr and an exit status, never a traceback.

The conventions people expect of a command live here too, so no command can miss one: every
:class:`Parser` has ``--version``; :func:`add_logging_args` and :func:`configure_logging` give
``-v``/``-q`` the same meaning everywhere; :func:`emit_json` stamps every JSON object with the
version that produced it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import gc
import ipaddress
import json
import logging
import os
import select
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn, TextIO

from mrc.app import hashpolicy
from mrc.cli.progress import Progress as Progress  # (re-exported: mrc-send, mrc-recv)
from mrc.core.cc import load as load_law
from mrc.errors import MRCError, UsageError
from mrc.security.keys import read_key_file
from mrc.transport.messages import CHECKSUMS
from mrc.units import parse_rate, parse_size
from mrc.wire import DEFAULT_PORT


@functools.cache
def package_version() -> str:
    """The installed distribution's version (what pip and bug reports see), or, when mrc runs
    from a source tree nobody installed, ``mrc.__version__`` (kept equal to pyproject's by a
    test). Looked up on first use: the metadata scan costs a few milliseconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mrc-transport")  # the distribution; "mrc" on the index is another
    except PackageNotFoundError:
        from mrc import __version__

        return __version__


class _VersionAction(argparse.Action):
    """``--version``: prints ``PROG VERSION`` and exits 0. argparse's own version action wants
    the text when the parser is built; this one reads the metadata only when asked."""

    def __init__(self, option_strings: list[str], dest: str, command: str = "") -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version"
        )
        self.command = command

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{self.command} (mrc-transport) {package_version()}")
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (argparse prints usage + message),
    and every command gets ``--version``.

    ``command`` names the command in error lines and in ``--version`` (default: the first word
    of ``prog``). Sub-command parsers (``mrc-fabric up``) report under the command's name, so
    every error line of a command starts the same way; they take no ``--version`` of their own
    (it belongs to the command, before the sub-command).

    A long option the parser does not know is named in the error, with the closest it does
    know (``unrecognized arguments: --too (did you mean --to?)``), whatever else argparse
    found wrong with a command line that option made no sense of. ``json_role``: the command
    promises one JSON object on stdout with ``--json`` whatever happens (:class:`JsonAnswer`),
    so a usage error with ``--json`` among the arguments prints its failure object too."""

    def __init__(
        self,
        *args: Any,
        command: str | None = None,
        version: bool = True,
        json_role: str | None = None,
        **kw: Any,
    ):
        super().__init__(*args, **kw)
        self.command = command or self.prog.split(" ")[0]
        self.json_role = json_role
        self._argv: list[str] = []
        if version:
            self.add_argument("--version", action=_VersionAction, command=self.command)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _SubParser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        typo = self.unknown_option()
        if typo is not None:
            message = typo
        if self.json_role is not None and self.wants_json():
            emit_json(failure_object(self.json_role, message))
        die(self.command, f"{message} (see {self.prog} --help)", 2)

    # --- what the command line asked for, read before (or without) argparse ----------------

    def _long_options(self) -> list[str]:
        return sorted(o for o in self._option_string_actions if o.startswith("--"))

    def _options_given(self) -> list[str]:
        """The long options of the command line (``--name`` of ``--name=value`` too), up to
        a ``--`` that ends them. Empty for a parser with sub-commands: their options are
        theirs, not this parser's."""
        if self._subparsers is not None:
            return []
        out = []
        for arg in self._argv:
            if arg == "--":
                break
            if arg.startswith("--") and len(arg) > 2:
                out.append(arg.split("=", 1)[0])
        return out

    def _matches(self, given: str) -> list[str]:
        """The options ``given`` stands for: itself, or those it abbreviates."""
        options = self._long_options()
        if given in options:
            return [given]
        return [o for o in options if o.startswith(given)] if self.allow_abbrev else []

    def unknown_option(self) -> str | None:
        """The error for the first long option of the command line that names no option of
        this parser (with the closest that does), or None if each names one."""
        for given in self._options_given():
            if self._matches(given):
                continue
            close = difflib.get_close_matches(given, self._long_options(), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"unrecognized arguments: {given}{hint}"
        return None

    def wants_json(self) -> bool:
        """``--json`` (or an abbreviation of it) is among the arguments."""
        return any(self._matches(given) == ["--json"] for given in self._options_given())


class _SubParser(Parser):
    """A sub-command's parser: one-line errors under the command's name, no ``--version``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw["version"] = False
        super().__init__(*args, **kw)


# --- -v / -q: stdlib logging, one format for every command ------------------------------------


def add_logging_args(
    parser: argparse.ArgumentParser,
    default: int = logging.WARNING,
    verbose_help: str = "say more on stderr: -v notes of what happens (INFO), -vv also DEBUG",
    quiet_help: str = "say nothing on stderr but errors (no notes, warnings or progress bar)",
) -> None:
    """``-v/--verbose`` (repeatable) and ``-q/--quiet``, as every long-running command takes
    them, and the command's default level (``default``: WARNING unless a command's progress
    notes are what a user watches, as mrc-bench's are). On a sub-command's parser too, so
    ``mrc-fabric up -v`` works as ``mrc-fabric -v up`` does: there the defaults are
    suppressed, so an absent flag does not undo the one given before the sub-command."""
    sub = isinstance(parser, _SubParser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if sub else 0,
        help=verbose_help,
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS if sub else False,
        help=quiet_help,
    )
    if not sub:
        parser.set_defaults(
            log_command=getattr(parser, "command", parser.prog), log_default=default
        )


class _Formatter(logging.Formatter):
    """``PROG: level: message``, the shape of the one-line ``PROG: error: ...`` failures, so
    a user's grep (and eye) finds both the same way."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        text = f"{self.command}: {record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a line is logged, not what it was when the
    command started: tests capture stderr per test while the handler outlives them."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(args: argparse.Namespace) -> int:
    """Set up stdlib logging for a command from its ``-v``/``-q`` (see
    :func:`add_logging_args`); returns the level chosen.

    mrc's own loggers (``mrc.*``) get that level; everything else (asyncio, pyroute2) stays at
    WARNING even with ``-vv``, because their debug chatter is not what ``-v`` on an MRC command
    asks for. One handler on the root logger writes to stderr; called again (tests run several
    mains in one process) it replaces the handler it installed, so lines are never doubled."""
    default = getattr(args, "log_default", logging.WARNING)
    verbose = getattr(args, "verbose", 0) or 0
    if getattr(args, "quiet", False):
        level = logging.ERROR
    else:  # each -v one level down from the command's default: WARNING -> INFO -> DEBUG
        level = max(logging.DEBUG, default - 10 * verbose)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(_Formatter(getattr(args, "log_command", "mrc")))
    root.addHandler(handler)
    root.setLevel(max(level, logging.WARNING))
    logging.getLogger("mrc").setLevel(level)
    return level


# --- argparse types: each raises ArgumentTypeError, whose message argparse prints as is -------


def size_arg(text: str) -> int:
    """A size in bytes, read by :func:`mrc.units.parse_size` (64M binary, 64MB decimal)."""
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_arg(text: str) -> str:
    """A tc rate (200mbit), checked while parsing but kept as text for tc."""
    try:
        parse_rate(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def cc_arg(text: str) -> str:
    """A window law for ``QPConfig.cc`` (``--cc``): a registered name (``nscc``, ``fixed``) or
    ``MODULE:CLASS``, loaded here, where the user typed it (``mrc.core.cc.load``: a law
    file's path made absolute); the config only names it, and nothing else loads it."""
    try:
        return load_law(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


CC_HELP = (
    "window law (congestion control): nscc (the default: UET 1.0's NSCC, a window driven by "
    "ECN echoes with queueing delay, trims and a fair increase, capped by the window; "
    "uet-1.0-nscc is the same law by mrc_ctl's name), nscc-mrc (mrc's own, which also cuts "
    "on queueing delay alone), fixed (a window of that "
    "many packets), or MODULE:CLASS, a law of your own in a module or a .py file "
    "(docs/CONGESTION.md)"
)


def int_at_least(low: int) -> Callable[[str], int]:
    """argparse type for an integer ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def float_between(
    low: float, high: float, unit: str = "", low_inclusive: bool = False
) -> Callable[[str], float]:
    """argparse type for a number in ``(low, high]``, or ``[low, high]`` with ``low_inclusive``
    (a timeout of 0 s is never meant; an outage of 0 s may be)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        above = value >= low if low_inclusive else value > low
        if not (above and value <= high):
            least = "at least" if low_inclusive else "more than"
            raise argparse.ArgumentTypeError(
                f"must be {least} {low:g} and at most {high:g}{unit}, not {text}"
            )
        return value

    parse.__name__ = "float_between"
    return parse


def add_idle_timeout(parser: argparse._ActionsContainer, what: str, default: float) -> None:
    """``--idle-timeout SECONDS``, as mrc-send and mrc-recv both take it: fail a transfer on
    which ``what`` for that long."""
    parser.add_argument(
        "--idle-timeout",
        type=float_between(0.1, 86400.0),
        default=default,
        metavar="SECONDS",
        help=f"fail if {what} for this long (default {default:g})",
    )


def checksum_list(text: str) -> tuple[str, ...]:
    """``--checksum``'s value: one name or a comma-separated list of them, each a checksum mrc
    knows (mrc.app.checksum), none twice."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one checksum")
    for name in names:
        if name not in CHECKSUMS:
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a checksum mrc knows ({', '.join(CHECKSUMS)})"
            )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a checksum twice")
    return names


def add_checksum_arg(
    parser: argparse._ActionsContainer, default: tuple[str, ...], side: str
) -> None:
    """``--checksum NAME[,NAME...]``: what mrc-send offers or mrc-recv takes, preferred first."""
    parser.add_argument(
        "--checksum",
        type=checksum_list,
        default=default,
        metavar="NAME[,NAME]",
        help=(
            f"end-to-end checksums {side}, preferred first "
            f"(default {','.join(default)}): blake3 (cryptographic; keyed with --key-file, "
            "so a MAC), xxh3-128 (catches accidental corruption only, more than 10x cheaper "
            "than SHA-256), sha256"
        ),
    )


def add_key_args(parser: argparse._ActionsContainer, encrypt_help: str) -> None:
    """``--key-file FILE`` and ``--encrypt``, as mrc-send and mrc-recv both take them."""
    parser.add_argument(
        "--key-file",
        metavar="FILE",
        help="pre-shared key made by mrc-keygen, the same file on both ends: both prove they "
        "hold it before anything is allocated, and every packet and side-channel message is "
        "then authenticated (without a key, anyone who reaches the port can write into the "
        "receiver's memory)",
    )
    parser.add_argument("--encrypt", action="store_true", help=encrypt_help)


def load_key(args: argparse.Namespace) -> bytes | None:
    """The key ``--key-file`` names (None without one); one-line errors, exit status 2."""
    if args.encrypt and not args.key_file:
        raise UsageError("--encrypt needs --key-file")
    if not args.key_file:
        return None
    return read_key_file(args.key_file)


def parse_endpoint(text: str, default_host: str = "::") -> tuple[str, int]:
    """'[::1]:4791', '::1', 'host:4791', 'host', ':4791' -> (host, port).

    Refused with a hint to ``[ADDR]:PORT``: a port alone (``4791``, which the resolver would
    take for the IPv4 address 0.0.18.183), and an unbracketed IPv6 address followed by what
    reads as a port (``::1:4791``, itself the address ::1:4791)."""
    text = text.strip()
    port: int | None = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise argparse.ArgumentTypeError(f"missing ']' in {text!r}")
        if rest:
            if not rest.startswith(":"):
                raise argparse.ArgumentTypeError(f"expected ':PORT' after ']' in {text!r}")
            port = _port(rest[1:], text)
    elif text.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a port alone, not an address: write [ADDR]:{text} ([::]:{text} for "
            f"every address, or :{text})"
        )
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = _port(p, text)
    else:
        host = text
        _refuse_port_in_ipv6(text)
    return (host or default_host, DEFAULT_PORT if port is None else port)


def _refuse_port_in_ipv6(text: str) -> None:
    """An unbracketed IPv6 address whose last group reads as a port: ``fd00::2:4791`` is an
    address, but a user who wrote it meant ``[fd00::2]:4791`` far more often. Refused when the
    text without its last group is an IPv6 address and that group is a decimal of 2 digits or
    more (a full eight-group address never is: without a group it is no address)."""
    head, _, last = text.rpartition(":")
    if len(last) < 2 or not last.isdigit() or not head or head.endswith(":"):
        return
    try:
        ipaddress.IPv6Address(head.split("%")[0])
    except ValueError:
        return
    if int(last) > 65535:
        return
    raise argparse.ArgumentTypeError(
        f"{text!r}: an IPv6 address with a port needs brackets: [{head}]:{last} (or "
        f"[{text}] if all of it is the address)"
    )


def endpoint_arg(text: str) -> str:
    """argparse type for HOST[:PORT]: checked while parsing (bad usage), split later."""
    parse_endpoint(text)
    return text


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"bad port in {whole!r}")
    return int(text)


def die(prog: str, message: str, status: int) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def versioned(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with a ``"version"`` field: the mrc that produced it, so a result kept in a file
    or a CI log says which code measured it. A field ``obj`` already has is kept (and must then
    be that version: two meanings of one key would mislead)."""
    out = {**obj, "version": package_version()}
    if "version" in obj and obj["version"] != out["version"]:
        raise ValueError(f"JSON object already has a different 'version': {obj['version']!r}")
    return out


def json_text(obj: dict[str, Any], indent: int | None = None) -> str:
    """One JSON object as ``--json`` prints it, stamped by :func:`versioned`."""
    return json.dumps(versioned(obj), indent=indent)


def emit_json(obj: dict[str, Any], indent: int | None = None) -> None:
    """Print one JSON object on stdout, stamped by :func:`versioned`: every command's and tool's
    ``--json`` goes through here (or :func:`json_text`), so none forgets the version."""
    print(json_text(obj, indent), flush=True)


def failure_object(role: str, error: str) -> dict[str, Any]:
    """What ``--json`` prints when a command fails before (or instead of) its result: ``ok``
    false, the command's ``role`` and the ``error`` line's message (docs/schemas/, the
    failure object of mrc-send's and mrc-recv's schemas)."""
    return {"ok": False, "role": role, "error": error}


class JsonAnswer:
    """``--json``'s promise, as iperf3's ``-J`` keeps it: the run answers with a JSON object on
    stdout whatever happens. A command prints its result through :meth:`emit`; if the run
    then fails without one (refused, interrupted, a bug), :func:`run_main` prints a
    :func:`failure_object` through :meth:`fail` beside the one-line error on stderr. Without
    ``--json`` (``enabled`` false) it prints nothing."""

    def __init__(self, role: str, enabled: bool) -> None:
        self.role = role
        self.enabled = enabled
        self.answered = False

    def emit(self, obj: dict[str, Any]) -> None:
        """Print the run's result object (which answers for the run)."""
        emit_json(obj)
        self.answered = True

    def fail(self, error: str) -> None:
        """The run failed with ``error``: say so in JSON unless a result already did."""
        if self.enabled and not self.answered:
            self.answered = True
            with contextlib.suppress(BrokenPipeError, ValueError):  # a reader gone: no answer
                emit_json(failure_object(self.role, error))


def run_main(
    prog: str,
    body: Callable[[], int],
    interrupted: str = "interrupted",
    answer: JsonAnswer | None = None,
) -> int:
    """Run a command's body; whatever goes wrong becomes one line on stderr and an exit status.

    * :class:`~mrc.errors.MRCError`: ``PROG: error: <message>``, exit ``exc.exit_code`` (1, or
      2 for a :class:`~mrc.errors.UsageError`);
    * Ctrl-C (or a SIGTERM handler raising KeyboardInterrupt): ``PROG: <interrupted>``, 130;
    * stdout closed early (piped into ``head``): nothing more to say, exit 0;
    * anything else is a bug: one line naming the exception, exit 1; with ``MRC_DEBUG=1`` in the
      environment it propagates with its traceback.

    ``answer``: the command's ``--json`` (:class:`JsonAnswer`): each failure above also prints
    its failure object on stdout, unless the command printed its result already.
    """
    say = answer.fail if answer is not None else (lambda _error: None)
    try:
        return body()
    except MRCError as exc:
        say(str(exc))
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        say(interrupted)
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_gone():
            # later writes (and the flush at exit) must not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if os.environ.get("MRC_DEBUG"):
            raise
        error = f"internal error: {type(exc).__name__}: {exc}"
        say(error)
        print(f"{prog}: error: {error} (set MRC_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1


#: the cyclic collector's thresholds while a command moves data (gc.set_threshold): a young
#: collection per this many container objects made, not per 700
GC_THRESHOLDS = (100_000, 50, 1000)


def tune_gc() -> None:
    """Set the cyclic garbage collector for a transfer: what exists now (the modules, the
    command's set-up) frozen out of every collection, and young collections 140 times rarer.

    A transfer makes container objects per packet (send buffers' views, bursts, ACK tuples)
    that die young and almost never in cycles. With the defaults the collector ran every 700
    of them and now and then walked the whole heap of modules: 4-16% of mrc-send's CPU at
    1400-byte payloads, 7% of each end's at 8 KiB (docs/PERFORMANCE.md, "Fewer objects per
    packet at the sender"). Cycles are still collected, in batches. A command's process only:
    the library leaves an embedding program's collector alone."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


#: ``--scheduling``'s choices: the Linux scheduling policy a command's process runs under
#: (the default first)
SCHEDULING = ("batch", "normal")


def add_scheduling_arg(parser: argparse._ActionsContainer) -> None:
    """``--scheduling {batch,normal}``, as mrc-send and mrc-recv both take it."""
    parser.add_argument(
        "--scheduling",
        choices=SCHEDULING,
        default=SCHEDULING[0],
        help="the Linux scheduling policy of this process's threads (default batch): batch "
        "(SCHED_BATCH), a thread that wakes waits for a free core or the end of the running "
        "thread's turn instead of preempting it, which saves context switches where both "
        "ends or other work share the cores, and the end-to-end hash gives its core up to "
        "them at once (SCHED_IDLE) while it keeps up, where the process may raise it again "
        "(root or CAP_SYS_NICE); normal (SCHED_OTHER), the system's default, for all",
    )


def set_scheduling(policy: str) -> str | None:
    """Put the calling thread, and so every thread it starts later, under ``policy`` (one of
    :data:`SCHEDULING`); None, or why the kernel refused (the process then runs as it was).

    A transfer's threads wake each other all the time: the event loop for an ACK, the hash
    thread for a range to hash, and, where the peer shares the host's cores, the other end's
    loop. Under SCHED_OTHER each wake-up may take the core from the thread running there, in
    the middle of its sendmsg(): one QP on a veth lost about 0.5 s in 4 GiB to ACK sends
    preempted that way. Under SCHED_BATCH a woken thread waits for a free core or the end of
    the running one's slice (docs/PERFORMANCE.md, "A woken thread waits its turn"). No
    privilege is needed, and nothing else changes: priorities and nice values are as they
    were. A command's process only: the library leaves an embedding program's policy alone."""
    wanted = os.SCHED_BATCH if policy == "batch" else os.SCHED_OTHER
    try:
        os.sched_setscheduler(0, wanted, os.sched_param(0))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def run_command(
    prog: str,
    main: Coroutine[Any, Any, int],
    answer: JsonAnswer | None = None,
    scheduling: str = SCHEDULING[0],
) -> int:
    """:func:`run_main` for a command whose body is a coroutine (run on the fast loop, with
    the collector set for a transfer, :func:`tune_gc`, and the process under ``scheduling``,
    :func:`set_scheduling`; under batch, hash steps give way too: mrc.app.hashpolicy)."""
    from mrc.transport.loop import run

    tune_gc()
    refused = set_scheduling(scheduling)
    if refused is not None:
        print(
            f"{prog}: warning: scheduling policy {scheduling} refused ({refused}); "
            "running under the one inherited",
            file=sys.stderr,
        )
    hashpolicy.allow(scheduling == "batch" and refused is None)
    return run_main(prog, lambda: run(main), answer=answer)


def _stdout_gone() -> bool:
    """True if stdout is a pipe whose reader has gone, rather than a socket of ours failing."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _fd, ev in poller.poll(0))
    except (OSError, ValueError):
        return False
