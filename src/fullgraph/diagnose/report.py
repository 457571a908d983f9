"""The doctor's report: the data of `schema.py` (frozen dataclasses with a JSON round trip, schema in
docs/doctor.md), and saving it as an HTML page through `html.py`. The arrows point one way: report -> html ->
schema, and report -> schema.
"""

from __future__ import annotations

import os

from fullgraph._files import write_atomic
from fullgraph.diagnose.html import render_html
from fullgraph.diagnose.schema import (
    SCHEMA_VERSION,
    ChecklistItem,
    ConfigResult,
    Finding,
    FixCapture,
    FixOffer,
    GraphBreak,
    Recommendation,
    Recompile,
    ReportData,
    break_count,
    break_summary,
    plural,
)


class Report(ReportData):
    """The doctor's report: its data (`ReportData`), saved as JSON or as one self-contained HTML page."""

    def save_html(self, path: str | os.PathLike) -> None:
        write_atomic(path, render_html(self))


__all__ = [
    "SCHEMA_VERSION", "ChecklistItem", "ConfigResult", "Finding", "FixCapture", "FixOffer", "GraphBreak",
    "Recommendation", "Recompile",
    "Report", "ReportData", "break_count", "break_summary", "plural",
]  # fmt: skip
