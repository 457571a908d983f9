"""The doctor's report as one self-contained HTML file: inline CSS and SVG, no scripts, nothing fetched.

The page is the jinja2 template `templates/report.html.j2`, autoescaped: graph-break reasons and source lines carry
`<`, `&` and quotes. This module computes what a template should not: the charts' geometry and number formats.
Missing numbers read "–"; empty sections say "none found" so a reader knows they were checked.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import jinja2
from markupsafe import Markup, escape

from fullgraph._paths import display_path
from fullgraph.bench.breakdown import Breakdown
from fullgraph.diagnose.schema import ConfigResult, ReportData, plural

HIGHLIGHT = "#2563eb"  # the recommended config's bar; used nowhere else, so a screenshot can be searched for it
CLASS_COLOURS = {  # kernel classes in the breakdown bars; none near HIGHLIGHT
    "gemm": "#0f766e",
    "attention": "#c2410c",
    "elementwise": "#a21caf",
    "copy": "#65a30d",
    "other": "#64748b",
}
_IDLE = "#e5e7eb"
_BAR = "#94a3b8"
_GREYED = "#d1d5db"
_DASH = "–"
KEY_FACTS = (  # the environment entries worth a line in the summary; the rest sits in a collapsed block
    "gpu",
    "gpu_capability",
    "gpu_memory_gib",
    "driver",
    "torch",
    "torch_cuda",
    "triton",
    "python",
    "platform",
    "fullgraph",
    "git_commit",
)
_TIMING_ORDER = {"threads": 0, "rounds": 1, "method": 2}  # the timing facts first, in this order; the rest by name


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fullgraph.diagnose", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a misspelt field fails the render (and the tests), never shows blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=num, sci=sci, mib=mib, pct=pct, where=where)
    env.globals.update(status=status, plural=plural, DASH=_DASH, HIGHLIGHT=HIGHLIGHT)
    return env


def render_html(report: ReportData) -> str:
    """The whole report as one HTML page: inline CSS and SVG, no script, nothing fetched, so it opens offline."""
    rec = report.recommendation
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            r=report,
            rec_name=rec.config if rec else None,
            facts=[(k, report.environment[k]) for k in KEY_FACTS if k in report.environment],
            env_json=json.dumps(report.environment, indent=2, sort_keys=True, default=str),
            recompiled=sum(c.count for c in report.recompiles),
            timing=sorted(report.timing.items(), key=lambda kv: (_TIMING_ORDER.get(kv[0], len(_TIMING_ORDER)), kv[0])),
            chart=_chart(report) if report.configs else None,
            bars=[_stacked(b) for b in report.breakdowns],
        )
    )


def num(value: float | None) -> str:
    """Three significant figures or so, without drifting into exponents for ordinary timings."""
    if value is None:
        return _DASH
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def sci(value: float | None) -> str:
    return _DASH if value is None else f"{value:.1e}"


def mib(nbytes: int | None) -> str:
    return _DASH if nbytes is None else f"{nbytes / 2**20:,.1f}"


def pct(fraction: float | None, digits: int = 0) -> str:
    """A fraction as a percentage: 0.564 -> "56%"."""
    return _DASH if fraction is None else f"{100 * fraction:.{digits}f}%"


def where(file: str, line: int, col: int | None = None) -> Markup:
    """`file:line[:col]` with the file as a reader finds it (relative to the cwd, site-packages or the project),
    escaped, with a line-break opportunity after each separator so a narrow column breaks a path between folders."""
    path = Markup("<wbr>").join(escape(part) for part in re.split(r"(?<=[/\\])", display_path(file)))
    return path + f":{line}" + ("" if col is None else f":{col}")


def status(c: ConfigResult) -> tuple[str, str]:
    """(label, badge class) for a config: failed and over-tolerance configs are not candidates."""
    if c.error is not None:
        return "failed", "fail"
    if c.rel_err is None:
        return "not checked", "na"
    return ("ok", "pass") if c.ok else ("over tolerance", "fail")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Latency chart geometry in px: names left of X0, bars between X0 and X1, notes right of the bars.
_WIDTH, _X0, _X1, _ROW_H, _BAR_H, _TOP, _AXIS_H = 1120, 290, 880, 30, 16, 8, 40  # the page is 1120 px wide
_CHAR_PX = 7  # width of a character at 12 px, a little over the average, so clipped text stays inside its room
_LABEL_CHARS = (_X0 - 14) // _CHAR_PX  # a config's name left of the bars


@dataclass(frozen=True)
class ChartRow:
    """One config in the latency chart, centred on `cy`; `width` None draws a pale band holding `note`."""

    name: str
    label: str
    cy: float
    width: float | None
    fill: str
    cls: str
    ink: str
    bold: bool
    whisker: str  # SVG path of the p20–p80 whisker, "" without both
    note: str
    note_x: float
    tip: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    x0: int
    x1: int
    bar_h: int
    bottom: int
    ticks: list[tuple[float, str]]  # (x, label)
    rows: list[ChartRow]


def _nice_step(top: float) -> float:
    """A round tick step giving about five ticks up to `top`."""
    raw = top / 5
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _chart(r: ReportData) -> Chart:
    """Horizontal bars of median latency with p20–p80 whiskers, one row per config, on a shared linear axis."""
    timed = [c for c in r.configs if c.median_ms is not None]
    top = max((max(c.median_ms, c.p80_ms or 0.0) for c in timed), default=1.0) or 1.0
    step = _nice_step(top)
    ticks = [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]

    def x(ms: float) -> float:
        return _X0 + (_X1 - _X0) * ms / ticks[-1]

    rows = [_chart_row(c, _TOP + (i + 0.5) * _ROW_H, x, r) for i, c in enumerate(r.configs)]
    bottom = _TOP + _ROW_H * len(r.configs)
    return Chart(_WIDTH, bottom + _AXIS_H, _X0, _X1, _BAR_H, bottom, [(x(t), f"{t:.6g}") for t in ticks], rows)


def _chart_row(c: ConfigResult, cy: float, x: Any, r: ReportData) -> ChartRow:
    """The recommended config is drawn in HIGHLIGHT; failed and over-tolerance configs are greyed and carry their
    reason, so a fast but wrong bar is never mistaken for a usable one. A noisy row says so, with its spread."""
    label, _ = status(c)
    usable = label in ("ok", "not checked")
    rec = r.recommendation
    is_rec = rec is not None and c.name == rec.config
    ink = "#1f2937" if usable else "#9ca3af"
    cls = "bar recommended" if is_rec else "bar" if usable else "bar greyed"
    cls += " noisy" if c.noisy else ""
    tip = f"{c.name}: {num(c.median_ms)} ms, {label}"
    common = {"name": c.name, "label": _clip(c.name, _LABEL_CHARS), "cy": cy, "cls": cls, "ink": ink, "bold": is_rec}
    if c.median_ms is None:  # nothing timed: a pale band across the plot holds the reason
        note = _clip(f"{label}: {c.error or 'not timed'}", 120)
        return ChartRow(**common, width=None, fill="#f3f4f6", whisker="", note=note, note_x=_X0 + 6, tip=tip)
    end = x(c.median_ms)
    whisker = ""
    if c.p20_ms is not None and c.p80_ms is not None:
        lo, hi = x(c.p20_ms), x(c.p80_ms)
        end = max(end, hi)
        whisker = f"M{lo:.1f} {cy}H{hi:.1f}M{lo:.1f} {cy - 5}V{cy + 5}M{hi:.1f} {cy - 5}V{cy + 5}"
    note = f"{num(c.median_ms)} ms"
    if is_rec:
        note += " · recommended" + (f", {rec.speedup:.2f}×" if rec.versus else "")
    elif not usable:
        judged = f"{c.check} < {pct(c.matched_min)}" if c.matched is not None else ""
        note += f" · {label}: {c.error or judged or f'rel err {sci(c.rel_err)} > {sci(c.tolerance)}'}"
    if c.noisy:
        note += " · noisy" + (f", spread {pct(c.spread)}" if c.spread is not None else "")
    room = int((_WIDTH - end - 8) / _CHAR_PX)  # characters that fit before the edge
    fill = HIGHLIGHT if is_rec else _BAR if usable else _GREYED
    width = max(x(c.median_ms) - _X0, 1.0)
    return ChartRow(**common, width=width, fill=fill, whisker=whisker, note=_clip(note, room), note_x=end + 8, tip=tip)


# Breakdown bar geometry in px: one bar across the plot, labels inside the segments wide enough to hold them.
_BD_WIDTH, _BD_BAR_H = 1120, 28


@dataclass(frozen=True)
class Segment:
    name: str
    x: float
    width: float
    colour: str
    label: str  # drawn inside the segment; "" when it does not fit (the legend always has it)
    legend: str  # "gemm 12.8 ms · 56%"


@dataclass(frozen=True)
class Stacked:
    width: int
    bar_h: int
    basis_ms: float  # what the full width stands for: wall time per call, or summed kernel time if larger
    segments: list[Segment]


def _stacked(b: Breakdown) -> Stacked:
    """Kernel time per call by class, then the GPU's idle time, on one bar spanning the call's wall time."""
    parts = [(c.name, c.ms, c.share, CLASS_COLOURS.get(c.name, CLASS_COLOURS["other"])) for c in b.classes]
    if b.idle_share:
        parts.append(("idle", b.idle_share * b.call_ms, b.idle_share, _IDLE))
    basis = max(b.call_ms, sum(ms for _, ms, _, _ in parts)) or 1.0
    segments, x = [], 0.0
    for name, ms, share, colour in parts:
        width = _BD_WIDTH * ms / basis
        legend = f"{name} {num(ms)} ms · {pct(share)}"
        fits = next((t for t in (legend, f"{name} {pct(share)}", pct(share)) if len(t) * 7.5 + 12 <= width), "")
        segments.append(Segment(name, x, width, colour, fits, legend))
        x += width
    return Stacked(_BD_WIDTH, _BD_BAR_H, basis, segments)
