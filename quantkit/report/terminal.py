"""The comparison as a person reads it in a terminal: the columns that answer "how much smaller,
how much worse, how much faster", laid out to the terminal's width.

Numbers are never cut: columns are dropped (least important first) until the table fits, and
below the width where the essential columns no longer fit, each run becomes a block of
``label  value`` lines. ``--wide`` gives every column (``render.to_rich``); ``--columns`` picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantkit.errors import UserInputError
from quantkit.report.table import Comparison, Group, Row, fixed_columns, format_cell, optional_columns

if TYPE_CHECKING:
    from rich.console import RenderableType

_NAME_WIDTH = 28  # run names longer than this are shortened in the middle (full in --wide and JSON)


@dataclass(frozen=True)
class ViewColumn:
    """One column of the terminal view: its key, a short heading, and how to read a row."""

    key: str
    heading: str
    text: bool = False  # left-aligned

    def cell(self, row: Row, baseline: Row) -> str:
        if self.key == "name":
            return _short(str(row.get("name") or ""))
        if self.key == "size_ratio":
            size, base = row.get("disk_bytes"), baseline.get("disk_bytes")
            if isinstance(size, (int, float)) and isinstance(base, (int, float)) and base:
                return f"{size / base:.2f}×"
            return "—"
        if self.key == "gate":
            verdict = row.get("gate_passed")
            return "—" if verdict is None else ("pass" if verdict else "FAIL")
        return format_cell(self.key, row.get(self.key))


# In order of display; DROP_ORDER says which go first when the terminal is narrow (the run's
# name, Δppl, KLD, decode speed and the gate verdict are never dropped).
DEFAULT_VIEW: list[ViewColumn] = [
    ViewColumn("name", "run", text=True),
    ViewColumn("scheme", "scheme", text=True),
    ViewColumn("file_bpw", "bpw"),
    ViewColumn("disk_bytes", "size"),
    ViewColumn("size_ratio", "× base"),
    ViewColumn("ppl_increase_pct", "Δppl %"),
    ViewColumn("kld_mean", "KLD"),
    ViewColumn("top1_agreement_pct", "top-1 %"),
    ViewColumn("decode_speed_ratio", "decode ×"),
    ViewColumn("peak_memory_bytes", "peak mem"),
    ViewColumn("gate", "gate", text=True),
]
DROP_ORDER = ("peak_memory_bytes", "size_ratio", "disk_bytes", "top1_agreement_pct", "file_bpw", "scheme")
_SHOWN_WHEN_MEASURED = ("decode_speed_ratio", "peak_memory_bytes", "gate")


def _known_columns() -> dict[str, ViewColumn]:
    """Every column ``--columns`` can name: the default view's and the wide table's."""
    known = {column.key: column for column in DEFAULT_VIEW}
    known |= {key: ViewColumn(key, title, text=key in ("run_id", "method")) for key, title in fixed_columns()}
    known |= {key: ViewColumn(key, title) for key, title in optional_columns()}
    known["name"] = DEFAULT_VIEW[0]
    return known


def parse_columns(text: str | None) -> list[str] | None:
    """``--columns a,b,c`` as column keys (None: the default view); an unknown key is a usage
    error, found before anything runs."""
    if text is None:
        return None
    keys = [key.strip() for key in text.split(",") if key.strip()]
    known = _known_columns()
    unknown = [key for key in keys if key not in known]
    if unknown or not keys:
        named = ", ".join(repr(key) for key in unknown)
        raise UserInputError(
            f"unknown column {named}" if unknown else "--columns names no column",
            f"columns: {', '.join(sorted(known))}",
        )
    return keys


def view_columns(comparison: Comparison, keys: list[str] | None) -> list[ViewColumn]:
    """The default view's columns with a value in some row, or the ``keys`` asked for (any
    column of the wide table or of the default view); an unknown key is a usage error."""
    if keys is not None:
        known = _known_columns()
        return [known[key] for key in parse_columns(",".join(keys)) or []]
    rows = comparison.rows
    present = {
        key
        for key in _SHOWN_WHEN_MEASURED
        if any(row.get("gate_passed" if key == "gate" else key) is not None for row in rows[1:] or rows)
    }
    return [
        column for column in DEFAULT_VIEW if column.key not in _SHOWN_WHEN_MEASURED or column.key in present
    ]


def _short(name: str) -> str:
    if len(name) <= _NAME_WIDTH:
        return name
    keep = _NAME_WIDTH - 1
    return name[: (keep + 1) // 2] + "…" + name[len(name) - keep // 2 :]


def _cells(group: Group, columns: list[ViewColumn]) -> list[list[str]]:
    baseline = group.rows[0]
    return [[column.cell(row, baseline) for column in columns] for row in group.rows]


def table_width(columns: list[ViewColumn], cells: list[list[str]]) -> int:
    """The width Rich's default box needs for these cells: each column its widest cell or
    heading, plus one space of padding either side and one border, plus the closing border."""
    widths = [
        max(len(column.heading), *(len(row[index]) for row in cells)) for index, column in enumerate(columns)
    ]
    return sum(width + 3 for width in widths) + 1


def fitted(comparison: Comparison, width: int, keys: list[str] | None = None) -> RenderableType:
    """The view for a terminal ``width`` columns wide (see the module docstring)."""
    from rich.console import Group as RichGroup

    columns = view_columns(comparison, keys)
    parts: list[RenderableType] = []
    for group in comparison.groups:
        chosen = list(columns)
        for key in DROP_ORDER if keys is None else ():
            if table_width(chosen, _cells(group, chosen)) <= width:
                break
            chosen = [column for column in chosen if column.key != key]
        title = _title(comparison, group)
        if table_width(chosen, _cells(group, chosen)) <= width:
            parts.append(_table(title, group, chosen))
        else:
            parts.append(_blocks(title, group, columns))
    return RichGroup(*parts)


def _title(comparison: Comparison, group: Group) -> str:
    title = "quantkit: quantized vs baseline"
    return title + (f" — {group.title()}" if len(comparison.groups) > 1 else "")


def _table(title: str, group: Group, columns: list[ViewColumn]) -> RenderableType:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), show_lines=False)
    for column in columns:
        table.add_column(column.heading, justify="left" if column.text else "right", no_wrap=True)
    for index, cells in enumerate(_cells(group, columns)):
        table.add_row(*[escape(cell) for cell in cells], style="bold" if index == 0 else None)
    return table


def _blocks(title: str, group: Group, columns: list[ViewColumn]) -> RenderableType:
    """One block per run: its name, then a ``heading  value`` line per column."""
    from rich.text import Text

    label = max(len(column.heading) for column in columns[1:])
    text = Text(title + "\n", style="italic")
    for cells in _cells(group, columns):
        text.append(cells[0] + "\n", style="bold")
        for column, cell in zip(columns[1:], cells[1:], strict=True):
            text.append(f"  {column.heading:<{label}}  {cell}\n")
    return text
