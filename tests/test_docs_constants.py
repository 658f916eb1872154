"""The constants the documents state are the code's: a change on either side fails here.

As tests/test_docs_defaults.py does for the retransmission timer, each test finds the sentence
or table row that states a value (whitespace folded, so a rewrapped line still matches) and
compares the value with the one imported from the code. They had drifted: docs/PROTOCOL.md
gave ``MAX_EVS`` as 65535 where the code has 52428 (with a quarter more as backups, every EV's
flow label fits 16 bits), and no document listed the window laws a process has.

A sentence that no longer matches its pattern fails too, naming the sentence: rewording one
means updating its pattern here, not losing the check.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from mrc import wire
from mrc.cli.recv import build_parser as recv_parser
from mrc.cli.send import build_parser as send_parser
from mrc.connection import ConnectConfig, ListenerConfig
from mrc.core import QPConfig
from mrc.transport.messages import MAX_EVS, MAX_PLANES, PROTOCOL_VERSION

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _text(name: str) -> str:
    """A document with every run of whitespace folded to one space."""
    return " ".join((DOCS / name).read_text().split())


def _one(pattern: str, text: str, what: str) -> re.Match[str]:
    m = re.search(pattern, text)
    assert m, f"{what} is no longer stated in the expected form ({pattern!r})"
    return m


def _words(listed: str) -> list[str]:
    """The `code` words of a list such as "`fixed`, `nscc` and `x`"."""
    return re.findall(r"`([^`]+)`", listed)


def _default(config: type, name: str) -> object:
    """The default of dataclass ``config``'s field ``name``."""
    return next(f.default for f in dataclasses.fields(config) if f.name == name)


def _registered_names() -> list[str]:
    """``mrc.core.cc.names()`` in a fresh process: what mrc registers itself, whatever laws
    other tests of this session registered or loaded."""
    out = subprocess.run(
        [sys.executable, "-c", "from mrc.core.cc import names; print(' '.join(names()))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return out.stdout.split()


# ---- MAX_EVS, MAX_PLANES ------------------------------------------------------------------


def test_max_evs_in_protocol_md_is_the_code_s() -> None:
    text = _text("PROTOCOL.md")
    row = _one(
        r"`ev`: up to `MAX_EVS` \((\d+)\) EVs per connection \(`evs=`; backups, a quarter "
        r"more, come on top: (\d+) in all, one 16-bit flow label each\)",
        text,
        "mrc_ctl_device_attr's MAX_EVS",
    )
    assert int(row[1]) == MAX_EVS
    # the backups (a quarter more) keep every EV's flow label (its index + 1) within 16 bits
    assert int(row[2]) == MAX_EVS + MAX_EVS // 4 == (1 << wire.EV_LABEL_BITS) - 1
    hello = _one(
        r"\| `evs` \| optional integer, 1 \.\. (\d+) \(`MAX_EVS`", text, "the hello's evs range"
    )
    assert int(hello[1]) == MAX_EVS


def test_max_planes_in_protocol_md_is_the_code_s() -> None:
    text = _text("PROTOCOL.md")
    row = _one(r"at most `MAX_PLANES` \((\d+)\)", text, "mrc_ctl_device_attr's MAX_PLANES")
    hello = _one(
        r"\| `addrs` \| optional list of at most (\d+) IP address literals \(one per plane: "
        r"an ACK's Port State has (\d+) bits",
        text,
        "the hello's addrs bound",
    )
    assert int(row[1]) == int(hello[1]) == int(hello[2]) == MAX_PLANES == wire.MAX_PLANES


# ---- the default EV counts ----------------------------------------------------------------


def test_default_ev_counts_in_ev_health_md_are_the_commands_and_the_library_s() -> None:
    text = _text("EV_HEALTH.md")
    prose = _one(
        r"mrc-send: `--evs`, default (\d+); mrc-recv's ACK EVs: `--evs`, default (\d+)",
        text,
        "the EV counts of EV_HEALTH.md's States",
    )
    row = _one(
        r"\| sender EVs / receiver ACK EVs \| (\d+) / (\d+) \|",
        text,
        "the EV counts of EV_HEALTH.md's Constants",
    )
    sender, receiver = send_parser().get_default("evs"), recv_parser().get_default("evs")
    assert (sender, receiver) == (128, 16)  # as issue 39 read them; a change is deliberate
    assert (int(prose[1]), int(prose[2])) == (sender, receiver)
    assert (int(row[1]), int(row[2])) == (sender, receiver)
    # the row names the library's defaults too
    assert (_default(ConnectConfig, "evs"), _default(ListenerConfig, "evs")) == (sender, receiver)


# ---- the side channel's version -----------------------------------------------------------


def test_every_mrc_version_in_protocol_md_is_protocol_version() -> None:
    text = _text("PROTOCOL.md")
    examples = [int(v) for v in re.findall(r'"mrc": (\d+)', text)]
    assert len(examples) >= 5, "PROTOCOL.md's set-up messages no longer show their version"
    assert set(examples) == {PROTOCOL_VERSION}
    row = _one(r"\| `mrc` \| integer, (\d+) \| side-channel version \|", text, "hello's mrc")
    assert int(row[1]) == PROTOCOL_VERSION


# ---- window laws --------------------------------------------------------------------------


def test_the_default_window_law_in_the_docs_is_the_code_s() -> None:
    default = QPConfig().cc
    assert send_parser().get_default("cc") == default
    congestion = _text("CONGESTION.md")
    stated = [
        _one(r'`QPConfig\(\)` has `cc="([^"]+)"`', congestion, "CONGESTION.md's default")[1],
        _one(r"## UET's NSCC \(`([^`]+)`, the default", congestion, "its heading")[1],
        _one(r'\| `cc` \| `"([^"]+)"` \| the window law', congestion, "its QPConfig row")[1],
        _one(r'The default law \(`cc="([^"]+)"`\)', _text("PROTOCOL.md"), "Deviations, 18")[1],
    ]
    assert stated == [default] * len(stated)


def test_the_window_laws_the_docs_list_are_the_registered_ones() -> None:
    registered = _registered_names()
    congestion = _one(
        r"The registered names \(`mrc\.core\.cc\.names\(\)`\): ((?:`[^`]+`(?:, )?)+)\.",
        _text("CONGESTION.md"),
        "CONGESTION.md's list of registered names",
    )
    protocol = _one(
        r"`names\(\)` lists the window laws \(((?:`[^`]+`(?:, )?)+)",
        _text("PROTOCOL.md"),
        "mrc_ctl_device_attr's cc.algorithms",
    )
    assert _words(congestion[1]) == registered
    assert _words(protocol[1]) == registered
    assert "uet-1.0-nscc" in registered  # mrc_ctl.h's name for UET 1.0 NSCC
