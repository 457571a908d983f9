"""The doctor's report as one self-contained HTML file: inline CSS and an inline SVG chart, no scripts, no network.

Every string from the report goes through `html.escape`: graph-break reasons and source lines carry `<`, `&` and
quotes. Missing numbers read "–"; empty sections say "none found" so a reader knows they were checked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: report.py imports this module to render itself, so no import back at run time
    from fullgraph.diagnose.report import ConfigResult, Report

HIGHLIGHT = "#2563eb"  # the recommended config's bar; used nowhere else, so a screenshot can be searched for it
_BAR = "#94a3b8"
_GREYED = "#d1d5db"
_DASH = "–"
_NONE = '<p class="none">none found</p>'
_KEY_FACTS = (  # the environment entries worth a line in the summary; the rest sits in a collapsed block
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

_CSS = """
body { margin: 0; background: #fff; color: #1f2937;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #e5e7eb; }
h2 .count { color: #6b7280; font-weight: normal; }
nav { color: #6b7280; margin-bottom: 8px; }
nav a { color: #374151; margin-right: 12px; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #f8fafc; border: 1px solid #e5e7eb; border-radius: 6px; padding: 10px 12px; overflow-x: auto; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0; }
dt { color: #6b7280; } dd { margin: 0; }
.stats { display: flex; gap: 12px; margin: 12px 0; }
.stat { border: 1px solid #e5e7eb; border-radius: 6px; padding: 6px 14px; min-width: 96px; }
.stat b { display: block; font-size: 20px; }
.stat span { color: #6b7280; font-size: 12px; }
.wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; vertical-align: top; padding: 5px 8px; border-bottom: 1px solid #e5e7eb; }
th { background: #f3f4f6; font-weight: 600; white-space: nowrap; }
tbody tr:nth-child(even) { background: #f9fafb; }
tbody tr.recommended { background: #eef2ff; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td code { word-break: break-word; }
td code.loc { white-space: nowrap; }
.badge { display: inline-block; padding: 0 8px; border-radius: 9px; font-size: 12px; font-weight: 600;
  white-space: nowrap; }
.pass { background: #dcfce7; color: #166534; } .fail { background: #fee2e2; color: #991b1b; }
.na { background: #f3f4f6; color: #4b5563; }
.none { color: #6b7280; font-style: italic; }
.muted { color: #6b7280; }
svg { max-width: 100%; height: auto; }
"""


def render_html(report: Report) -> str:
    """The whole report as one HTML page: inline CSS and SVG, no script, nothing fetched, so it opens offline."""
    sections = [
        ("summary", "Summary", None, _summary(report)),
        ("chart", "Latency", None, _chart_svg(report) if report.configs else _NONE),
        ("configs", "Configurations", len(report.configs), _configs_table(report)),
        ("graph-breaks", "Graph breaks", len(report.graph_breaks), _breaks_table(report)),
        ("recompiles", "Recompiles", len(report.recompiles), _recompiles_table(report)),
        ("cudagraph-skips", "CUDA-graph skips", len(report.cudagraph_skips), _list(report.cudagraph_skips)),
        ("lint", "Lint", len(report.lint), _lint_table(report)),
        ("checklist", "Checklist", len(report.checklist), _checklist_table(report)),
        ("notes", "Notes", len(report.notes), _list(report.notes)),
    ]
    nav = "".join(f'<a href="#{sid}">{title}</a>' for sid, title, _, _ in sections)
    body = "\n".join(
        f'<section id="{sid}"><h2>{title}{_count(n)}</h2>\n{html}</section>' for sid, title, n, html in sections
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>fullgraph doctor: {_e(report.target)}</title>\n<style>{_CSS}</style></head>\n"
        f"<body><main>\n<h1>fullgraph doctor: <code>{_e(report.target)}</code></h1>\n"
        f"<nav>{nav}</nav>\n{body}\n"
        f'<p class="muted">report schema {report.schema_version}</p>\n</main></body></html>\n'
    )


def _count(n: int | None) -> str:
    return "" if n is None else f' <span class="count">({n})</span>'


def _e(value: Any) -> str:
    """Escaped text of any report value; None reads as a dash."""
    return _DASH if value is None else escape(str(value), quote=True)


def _num(value: float | None) -> str:
    """Three significant figures or so, without drifting into exponents for ordinary timings."""
    if value is None:
        return _DASH
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _sci(value: float | None) -> str:
    return _DASH if value is None else f"{value:.1e}"


def _mib(nbytes: int | None) -> str:
    return _DASH if nbytes is None else f"{nbytes / 2**20:,.1f}"


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{_e(text)}</span>'


def _code(value: Any) -> str:
    return f"<code>{_e(value)}</code>" if value not in (None, "") else _DASH


def _where(file: str, line: int, col: int | None = None) -> str:
    return f'<code class="loc">{_e(f"{file}:{line}" if col is None else f"{file}:{line}:{col}")}</code>'


def _table(head: list[str], rows: list[list[str]], num_cols: tuple[int, ...] = (), marked: int | None = None) -> str:
    """A table of already-escaped cells; `num_cols` are right-aligned, row `marked` is tinted as recommended.

    Empty tables become "none found"."""
    if not rows:
        return _NONE
    ths = "".join(f"<th>{h}</th>" for h in head)
    trs = []
    for n, row in enumerate(rows):
        tds = "".join(f'<td class="num">{c}</td>' if i in num_cols else f"<td>{c}</td>" for i, c in enumerate(row))
        trs.append(f'<tr class="recommended">{tds}</tr>' if n == marked else f"<tr>{tds}</tr>")
    return (
        '<div class="wrap"><table><thead><tr>'
        + ths
        + "</tr></thead><tbody>\n"
        + "\n".join(trs)
        + "</tbody></table></div>"
    )


def _list(items: list[str]) -> str:
    return ("<ul>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>") if items else _NONE


def _summary(r: Report) -> str:
    stats = [
        ("graphs", r.graph_count),
        ("graph breaks", len(r.graph_breaks)),
        ("recompiles", len(r.recompiles)),
        ("CUDA-graph skips", len(r.cudagraph_skips)),
        ("lint findings", len(r.lint)),
    ]
    facts = [(k, r.environment[k]) for k in _KEY_FACTS if k in r.environment]
    parts = [
        "<dl>",
        f"<dt>target</dt><dd>{_code(r.target)}</dd><dt>device</dt><dd>{_e(r.device)}</dd>",
        f"<dt>inputs</dt><dd>{', '.join(_code(i) for i in r.inputs) or _DASH}</dd>",
        *(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts),
        "</dl>",
        '<div class="stats">',
        *(f'<div class="stat"><b>{n}</b><span>{label}</span></div>' for label, n in stats),
        "</div>",
    ]
    if r.environment:
        env = json.dumps(r.environment, indent=2, sort_keys=True, default=str)
        parts.append(f"<details><summary>full environment</summary><pre>{_e(env)}</pre></details>")
    rec = r.recommendation
    if rec is None:
        parts.append('<p><b>Recommendation:</b> <span class="none">none found</span></p>')
    else:
        parts.append(
            f"<p><b>Recommendation:</b> use <b>{_e(rec.config)}</b>"
            + (f", {rec.speedup:.2f}× the speed of {_e(rec.baseline)}" if rec.versus else "")
            + f":</p><pre><code>{_e(rec.code)}</code></pre>"
        )
    return "\n".join(parts)


def _status(c: ConfigResult) -> tuple[str, str]:
    """(label, badge class) for a config: failed and over-tolerance configs are not candidates."""
    if c.error is not None:
        return "failed", "fail"
    if c.rel_err is None:
        return "not checked", "na"
    return ("ok", "pass") if c.ok else ("over tolerance", "fail")


def _configs_table(r: Report) -> str:
    rec = r.recommendation.config if r.recommendation else None
    rows = []
    for c in r.configs:
        label, kind = _status(c)
        status = _badge(label, kind) + (f"<br><code>{_e(c.error)}</code>" if c.error else "")
        name = _e(c.name) + (" " + _badge("recommended", "pass") if c.name == rec else "")
        cells = [name, _e(c.mode), _e(c.dtype), _num(c.median_ms), _num(c.p20_ms), _num(c.p80_ms)]
        cells += [_num(c.compile_s), _mib(c.peak_memory_bytes), _sci(c.rel_err), _sci(c.tolerance), status]
        rows.append(cells)
    marked = next((i for i, c in enumerate(r.configs) if c.name == rec), None)
    head = ["config", "mode", "dtype", "median ms", "p20 ms", "p80 ms", "compile s", "peak MiB", "rel err"]
    return _table([*head, "tolerance", "status"], rows, num_cols=(3, 4, 5, 6, 7, 8, 9), marked=marked)


def _breaks_table(r: Report) -> str:
    rows = [
        [
            _where(g.file, g.line),
            _code(g.function),
            _code(g.source),
            _e(g.reason),
            # The id is shown as text: the report must open offline, and torch's registry names it well enough.
            f'{_code(g.gb_id)}<br><span class="muted">{_e(g.gb_type)}</span>' if g.gb_id else _e(g.gb_type or None),
            _e(g.hint or None),
            _e(g.fix),
        ]
        for g in r.graph_breaks
    ]
    return _table(["where", "function", "source", "reason", "gb id", "torch hint", "fix"], rows)


def _recompiles_table(r: Report) -> str:
    rows = [
        [_code(c.function), _where(c.file, c.line), _e(c.trigger), _code(c.guard_failure), _e(c.fix)]
        for c in r.recompiles
    ]
    return _table(["function", "where", "trigger", "guard failure", "fix"], rows)


def _lint_table(r: Report) -> str:
    rows = [[_where(f.path, f.line, f.col), _code(f.rule), _e(f.message), _e(f.fix)] for f in r.lint]
    return _table(["where", "rule", "message", "fix"], rows)


def _checklist_table(r: Report) -> str:
    kinds = {"pass": "pass", "fail": "fail"}
    rows = [[_e(c.item), _badge(c.status, kinds.get(c.status, "na")), _e(c.evidence)] for c in r.checklist]
    return _table(["item", "status", "evidence"], rows)


def _nice_step(top: float) -> float:
    """A round tick step giving about five ticks up to `top`."""
    raw = top / 5
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Chart geometry in px: names left of X0, bars between X0 and X1, notes right of the bars.
_WIDTH, _X0, _X1, _ROW_H, _BAR_H, _TOP, _AXIS_H = 1040, 250, 810, 30, 16, 8, 40


def _chart_svg(r: Report) -> str:
    """Horizontal bars of median latency with p20–p80 whiskers, one row per config, on a shared linear axis."""
    timed = [c for c in r.configs if c.median_ms is not None]
    top = max((max(c.median_ms, c.p80_ms or 0.0) for c in timed), default=1.0) or 1.0
    step = _nice_step(top)
    ticks = [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]
    bottom = _TOP + _ROW_H * len(r.configs)
    height = bottom + _AXIS_H

    def x(ms: float) -> float:
        return _X0 + (_X1 - _X0) * ms / ticks[-1]

    out = [
        f'<svg role="img" aria-label="median latency per configuration" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" font-size="12">'
    ]
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{_TOP}" x2="{x(t):.1f}" y2="{bottom}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{x(t):.1f}" y="{bottom + 16}" text-anchor="middle" fill="#6b7280">{t:.6g}</text>')
    out.append(
        f'<text x="{(_X0 + _X1) / 2}" y="{bottom + 34}" text-anchor="middle" fill="#6b7280">'
        "median ms (whiskers: p20–p80)</text>"
    )
    for i, c in enumerate(r.configs):
        out += _chart_row(c, _TOP + (i + 0.5) * _ROW_H, x, r)
    out.append("</svg>")
    return "\n".join(out)


def _chart_row(c: ConfigResult, cy: float, x: Callable[[float], float], r: Report) -> list[str]:
    """One config's name, bar, whisker and note, centred on `cy`.

    The recommended config is drawn in HIGHLIGHT; failed and over-tolerance configs are greyed and carry their
    reason, so a fast but wrong bar is never mistaken for a usable one.
    """
    label, _ = _status(c)
    usable = label in ("ok", "not checked")
    is_rec = r.recommendation is not None and c.name == r.recommendation.config
    weight = ' font-weight="bold"' if is_rec else ""
    ink = "#1f2937" if usable else "#9ca3af"
    y = cy - _BAR_H / 2
    out = [f'<text x="{_X0 - 10}" y="{cy + 4}" text-anchor="end" fill="{ink}"{weight}>{_e(_clip(c.name, 36))}</text>']
    cls = "bar recommended" if is_rec else "bar" if usable else "bar greyed"
    rect = f'<rect class="{cls}" data-config="{_e(c.name)}" x="{_X0}" y="{y}" height="{_BAR_H}"'
    tip = f"<title>{_e(c.name)}: {_num(c.median_ms)} ms, {label}</title>"
    if c.median_ms is None:  # nothing timed: a pale band across the plot holds the reason
        why = _clip(f"{label}: {c.error or 'not timed'}", 120)
        out.append(f'{rect} width="{_X1 - _X0}" fill="#f3f4f6">{tip}</rect>')
        return [*out, f'<text x="{_X0 + 6}" y="{cy + 4}" fill="#6b7280">{_e(why)}</text>']
    fill = HIGHLIGHT if is_rec else _BAR if usable else _GREYED
    out.append(f'{rect} width="{max(x(c.median_ms) - _X0, 1.0):.1f}" fill="{fill}">{tip}</rect>')
    end = x(c.median_ms)
    if c.p20_ms is not None and c.p80_ms is not None:
        lo, hi = x(c.p20_ms), x(c.p80_ms)
        end = max(end, hi)
        path = f"M{lo:.1f} {cy}H{hi:.1f}M{lo:.1f} {cy - 5}V{cy + 5}M{hi:.1f} {cy - 5}V{cy + 5}"
        out.append(f'<path d="{path}" stroke="{"#1e293b" if usable else "#9ca3af"}" stroke-width="1.5" fill="none"/>')
    if is_rec:
        rec = r.recommendation
        note = f"{_num(c.median_ms)} ms · recommended" + (f", {rec.speedup:.2f}×" if rec.versus else "")
    elif usable:
        note = f"{_num(c.median_ms)} ms"
    else:
        note = f"{_num(c.median_ms)} ms · {label}: {c.error or f'rel err {_sci(c.rel_err)} > {_sci(c.tolerance)}'}"
    room = int((_WIDTH - end - 8) / 6.5)  # characters that fit before the edge at 12 px, about 6.5 px each
    return [*out, f'<text x="{end + 8:.1f}" y="{cy + 4}" fill="{ink}"{weight}>{_e(_clip(note, room))}</text>']
