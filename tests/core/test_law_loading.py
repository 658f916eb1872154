"""A window law given as code (``MODULE:CLASS``) is loaded where a user names it, and nowhere
else (issue 41, item 3): ``QPConfig.validate``, ``burst_max``, the registry's look-ups and
``apply_settings`` only look laws up, so a config, or a ``cc=`` setting from elsewhere, never
runs code; ``mrc.core.cc.load`` runs it, and the commands' edges (``cc_arg``, ``--qp cc=``,
mrc-bench's options, an agent's own ``--cc``) call it.

Every law file here appends a line to a marker file when it runs: the tests read the marker,
so "not executed" and "executed once" are facts, not the absence of a crash."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from mrc.cli.common import cc_arg
from mrc.cli.qpopts import apply_settings, qp_setting
from mrc.core import QPConfig
from mrc.core.cc import create, law_class, load, names, param_from_text, params_of
from mrc.core.cc.fixed import FixedWindow

LAW_FILE = """\
import pathlib
with pathlib.Path({marker!r}).open("a") as f:
    f.write("ran\\n")
from dataclasses import dataclass

from mrc.core.cc.fixed import FixedWindow


@dataclass(frozen=True)
class Knobs:
    window: int = 1


class Law(FixedWindow):
    Params = Knobs
    default_burst = 3  # a value of this law's own, to tell it from the laws that ship


NotALaw = 42
"""


def _law_file(tmp_path: Path, name: str = "mylaw") -> tuple[Path, Path]:
    """A law file in ``tmp_path`` and the marker it appends to each time it runs."""
    marker = tmp_path / f"{name}-ran"
    law = tmp_path / f"{name}.py"
    law.write_text(LAW_FILE.format(marker=str(marker)))
    return law, marker


def _runs(marker: Path) -> int:
    return marker.read_text().count("ran\n") if marker.exists() else 0


def test_checking_a_config_that_names_an_unloaded_law_runs_no_code(tmp_path: Path) -> None:
    law, marker = _law_file(tmp_path)
    spec = f"{law}:Law"
    cfg = QPConfig(cc=spec)
    with pytest.raises(ValueError) as err:
        cfg.validate()
    assert str(err.value) == (
        f"cc must be one of {', '.join(names())} or a law loaded with"
        f' mrc.core.cc.load("MODULE:CLASS"), not {spec!r}'
    )
    for look_up in (
        lambda: law_class(spec),
        lambda: params_of(spec, {}),
        lambda: param_from_text(spec, "x", "1"),
        lambda: create(spec, {}, QPConfig()),
        lambda: QPConfig(cc=spec).burst_max,
    ):
        with pytest.raises(ValueError, match=r"mrc\.core\.cc\.load\(\"MODULE:CLASS\"\)"):
            look_up()
    assert _runs(marker) == 0, "looking a law up ran its file"
    # a plain name that is not registered: the same one line, not code either
    with pytest.raises(ValueError, match=r"^cc must be one of .* not 'vegas'$"):
        QPConfig(cc="vegas").validate()


def test_a_module_named_in_a_config_is_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _law, marker = _law_file(tmp_path, "lawmod_unimported")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="lawmod_unimported:Law"):
        QPConfig(cc="lawmod_unimported:Law").validate()
    assert "lawmod_unimported" not in sys.modules and _runs(marker) == 0


def test_load_runs_the_file_once_and_then_the_config_is_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    law, marker = _law_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = load("mylaw.py:Law")
    assert spec == f"{law}:Law"  # a relative path made absolute, for other processes
    assert _runs(marker) == 1
    cls = law_class(spec)
    assert issubclass(cls, FixedWindow) and cls.__name__ == "Law"
    cfg = QPConfig(cc=spec)
    cfg.validate()
    assert cfg.burst_max == 3  # the loaded law's own default
    assert isinstance(create(spec, {}, cfg), cls)
    assert load(spec) == spec and load("mylaw.py:Law") == spec
    assert _runs(marker) == 1  # loaded once per process, however often it is named
    assert spec not in names() and "fixed" in names()  # names() lists registered names only
    assert load("fixed") == "fixed"


def test_load_of_a_module_imports_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _law, marker = _law_file(tmp_path, "lawmod_loaded")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load("lawmod_loaded:Law") == "lawmod_loaded:Law"  # a module keeps its name
    assert _runs(marker) == 1 and "lawmod_loaded" in sys.modules
    assert QPConfig(cc="lawmod_loaded:Law").burst_max == 3
    assert load("lawmod_loaded:Law") == "lawmod_loaded:Law" and _runs(marker) == 1


def test_load_refuses_what_is_not_a_law_and_registers_nothing(tmp_path: Path) -> None:
    law, _marker = _law_file(tmp_path)
    for text, why in (
        ("vegas", r"^cc must be one of .* or MODULE:CLASS, not 'vegas'$"),
        (f"{law}:NotALaw", "is not a window law"),
        (f"{law}:Nothing", "has no 'Nothing'"),
        (f"{tmp_path / 'missing.py'}:Law", "cannot load"),
        (":Law", "want MODULE:CLASS"),
    ):
        with pytest.raises(ValueError, match=why) as err:
            load(text)
        assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match="cc must be one of"):
            law_class(text)  # nothing was registered under it


def test_the_command_line_loads_a_law_where_the_user_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cc`` (``cc_arg``) and ``--qp cc=`` (``qp_setting``) load the law and give the
    text that names it; ``apply_settings`` (what an agent does with settings it is sent)
    loads nothing."""
    monkeypatch.chdir(tmp_path)
    by_cc, cc_marker = _law_file(tmp_path, "by_cc")
    by_qp, qp_marker = _law_file(tmp_path, "by_qp")
    sent, sent_marker = _law_file(tmp_path, "sent")

    assert apply_settings(QPConfig(), [f"cc={sent}:Law"]).cc == f"{sent}:Law"
    with pytest.raises(ValueError, match="mrc.core.cc.load"):
        apply_settings(QPConfig(), [f"cc={sent}:Law"]).validate()
    assert _runs(sent_marker) == 0

    assert cc_arg("by_cc.py:Law") == f"{by_cc}:Law"
    assert _runs(cc_marker) == 1 and law_class(f"{by_cc}:Law").default_burst == 3
    assert qp_setting("cc=by_qp.py:Law") == f"cc={by_qp}:Law"
    assert _runs(qp_marker) == 1
    cfg = apply_settings(QPConfig(), [f"cc={by_qp}:Law", "cc.window=2"])
    cfg.validate()
    assert (cfg.cc, cfg.cc_params, cfg.burst_max) == (f"{by_qp}:Law", {"window": 2}, 3)
    assert qp_setting("cc=fixed") == "cc=fixed" and qp_setting("cc = nscc") == "cc = nscc"

    with pytest.raises(argparse.ArgumentTypeError, match=r"or MODULE:CLASS, not 'vegas'"):
        cc_arg("vegas")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a window law"):
        qp_setting(f"cc={sent}:NotALaw")
    assert _runs(sent_marker) == 1  # the user named it: loaded, then refused


def test_mrc_bench_loads_its_laws_and_its_agents_load_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mrc-bench's --cc and --qp cc= load at its command line; the laws given as code are
    what its agents load from their own --cc (and all a request may name); an agent refuses
    any other code in one line, and runs none of it."""
    from mrc.lab.bench.agent import Agent, Peer, load_laws
    from mrc.lab.bench.schema import Refused
    from mrc.lab.cli.bench import build_parser, config_from_args

    monkeypatch.chdir(tmp_path)
    by_cc, cc_marker = _law_file(tmp_path, "bench_cc")
    by_qp, qp_marker = _law_file(tmp_path, "bench_qp")
    other, other_marker = _law_file(tmp_path, "bench_other")
    args = build_parser().parse_args(
        ["--cc", "bench_cc.py:Law", "--qp", "cc=bench_qp.py:Law", "--qp", "tlp_max=1"]
    )
    cfg = config_from_args(args)
    assert (_runs(cc_marker), _runs(qp_marker)) == (1, 1)
    assert cfg.cc == f"{by_cc}:Law" and cfg.qp == [f"cc={by_qp}:Law", "tlp_max=1"]
    assert cfg.code_laws() == {f"{by_cc}:Law", f"{by_qp}:Law"}
    assert cfg.window_for("clean") == 4  # the loaded law is not adaptive (FixedWindow's)

    laws = load_laws(sorted(cfg.code_laws()))
    assert laws == cfg.code_laws()
    assert (_runs(cc_marker), _runs(qp_marker)) == (1, 1)  # loaded already in this process
    agent = Agent(0, [Peer(0, "h0", ("::1",))], [], None, 4096, 1, laws=laws)
    settings = cfg.qp_settings("clean")
    assert agent.check_laws({"qp": settings}) == settings
    for text in (f"cc={other}:Law", "cc=vegas"):
        with pytest.raises(Refused, match="names code"):
            agent.check_laws({"qp": [text]})
    assert _runs(other_marker) == 0
    with pytest.raises(ValueError, match="cannot load"):
        load_laws([f"{tmp_path / 'missing.py'}:Law"])
