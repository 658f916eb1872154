"""The one printer of the lab's human tables: columns of text, each aligned to a width.

Each report builds its rows as strings (its numbers already formatted) and hands them here:

* :func:`render` lays out a whole table: the widths are the widest cell of each column, or
  minimum widths given (as ``format`` pads: a longer cell pushes the line, never cut), with an
  optional head line and a rule of dashes under it;
* :func:`line` is one row at given widths (a table printed a row at a time, as progress);
* :func:`markdown` is a Markdown table (the bench's report).

``align`` is a character per column, ``"<"`` (left) or ``">"`` (right); its last one holds for
every further column. ``sep`` goes between two columns: one string for every gap, or one per
gap.
"""

from __future__ import annotations

from collections.abc import Sequence


def _seps(sep: str | Sequence[str], gaps: int) -> list[str]:
    if isinstance(sep, str):
        return [sep] * gaps
    if len(sep) < gaps:
        raise ValueError(f"{len(sep)} separators for {gaps} gaps")
    return list(sep[:gaps])


def line(
    cells: Sequence[str], widths: Sequence[int], align: str = "<", sep: str | Sequence[str] = "  "
) -> str:
    """One row: cell ``i`` padded to ``widths[i]`` on the side ``align`` says (a missing width
    is 0: the cell as it is)."""
    if not align:
        raise ValueError("align needs at least one of '<' or '>'")
    seps = _seps(sep, max(len(cells) - 1, 0))
    out = []
    for i, cell in enumerate(cells):
        a = align[min(i, len(align) - 1)]
        w = widths[i] if i < len(widths) else 0
        padded = cell.rjust(w) if a == ">" else cell.ljust(w)
        out.append(padded if i == 0 else seps[i - 1] + padded)
    return "".join(out)


def render(
    rows: Sequence[Sequence[str]],
    align: str = "<",
    *,
    sep: str | Sequence[str] = "  ",
    widths: Sequence[int] | None = None,
    head: Sequence[str] | None = None,
    rule: bool = False,
) -> str:
    """The table of ``rows`` (and ``head`` above them, underlined by dashes as long as it when
    ``rule``), lines joined by newlines. ``widths``: minimum widths (default: each column's
    widest cell, the head's included)."""
    every = ([head] if head is not None else []) + list(rows)
    if widths is None:
        n = max((len(r) for r in every), default=0)
        widths = [max((len(r[i]) for r in every if i < len(r)), default=0) for i in range(n)]
    lines = [line(r, widths, align, sep) for r in rows]
    if head is not None:
        top = line(head, widths, align, sep)
        lines = [top, *(["-" * len(top)] if rule else []), *lines]
    return "\n".join(lines)


def markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: ``| a | b |``, the ``|---|---|`` under the head, a line per row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
