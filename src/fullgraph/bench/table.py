"""Plain-text tables for terminal output (no dependency; right-aligned numbers)."""

from __future__ import annotations

from collections.abc import Sequence


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return "-" if v is None else str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])
