"""The lab's one table printer (mrc.lab.harness.table): widths, sides, separators, head, rule."""

from __future__ import annotations

import pytest

from mrc.lab.harness.table import line, markdown, render


def test_render_pads_each_column_to_its_widest_cell() -> None:
    rows = [("", "MRC", "TCP"), ("finished", "yes", "no"), ("max stall", "12.5 ms", "-")]
    assert render(rows, "<>").splitlines() == [
        "               MRC  TCP",
        "finished       yes   no",
        "max stall  12.5 ms    -",
    ]


def test_render_head_rule_and_minimum_widths() -> None:
    text = render([("1", "x")], ">", sep=" ", widths=(3, 2), head=("a", "bb"), rule=True)
    assert text.splitlines() == ["  a bb", "------", "  1  x"]
    # a cell wider than its width pushes the line, as format() does: never cut
    assert render([("12345", "x")], ">", sep=" ", widths=(3, 2)) == "12345  x"


def test_line_per_gap_separators_and_alignment() -> None:
    got = line(("law", "2", "ok"), (5, 3, 0), "<><", ("", "  "))
    assert got == "{:<5}{:>3}  {}".format("law", "2", "ok")
    assert line(("a",), (3,), ">") == "  a"
    with pytest.raises(ValueError):
        line(("a", "b", "c"), (1, 1, 1), "<", ("",))


def test_markdown() -> None:
    assert markdown(("a", "b"), [("1", "2")]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    assert markdown(("a",), []) == "| a |\n|---|"
