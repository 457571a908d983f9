"""Terminal tables through rich: numbers right-aligned, plain text (no ANSI codes) unless stdout is a terminal."""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Sequence

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

LOG_WIDTH = 200  # off a terminal (logs, files, pipes) a table is as wide as its cells, up to this


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return "-" if v is None else str(v)


def _numeric(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def new_table(headers: Sequence[str], right: Sequence[bool] = ()) -> Table:
    """An empty table in the house style: a rule under the header, no outer frame; `right` columns right-aligned and
    never wrapped (a number split over two lines misreads), the others wrapped between words when space runs out."""
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, header_style="bold", expand=False
    )
    for i, h in enumerate(headers):
        number = i < len(right) and right[i]
        table.add_column(h, justify="right" if number else "left", no_wrap=number, overflow="fold")
    return table


def to_text(renderable: RenderableType, width: int | None = None, color: bool | None = None) -> str:
    """What `renderable` prints as: ANSI-styled only when `color` (default: stdout is a terminal and NO_COLOR is
    unset), trailing spaces stripped. `width` defaults to the terminal's, or LOG_WIDTH off a terminal."""
    if color is None:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    if width is None:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else LOG_WIDTH
    console = Console(
        file=io.StringIO(),
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
    )
    with console.capture() as captured:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """`rows` under `headers`; a column whose values are all numbers (or None, shown as "-") is right-aligned."""
    right = [
        any(_numeric(r[i]) for r in rows) and all(_numeric(r[i]) or r[i] is None for r in rows)
        for i in range(len(headers))
    ]
    table = new_table(headers, right)
    for row in rows:
        table.add_row(*(Text(_cell(v)) for v in row))
    return to_text(table)
