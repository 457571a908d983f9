"""What a doctor's report states, surface by surface, checked against references measured apart from it (issue 34's
acceptance). Shared by the CPU tests and `benchmarks/doctor_models.py` (the H200 set). Not collected by pytest.

Surfaces: the terminal summary (`format_summary`), the HTML page (its card, its headings, its text), the JSON (as
written and as read back), the advice (the recommendation's reason and code) and the checklist. Each states the
count of graph breaks; with fixes applied (`with_=`), the terminal, HTML and JSON also state the count read again
with them, per dtype. `check` returns one `Check` per acceptance point: a short text for a table cell, and whether
it holds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch

from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose.html import render_html
from fullgraph.diagnose.report import Report
from fullgraph.diagnose.summary import format_summary

COUNT = re.compile(r"(\d+) graph breaks?\b")
SURFACES = ("terminal", "html", "json", "advice", "checklist")
CEILING_MAX = 105.0  # percent: above this a rate is a bug, not measurement noise (issue 34, item 3)
WIDE = 2000  # terminal columns: no table cell wraps a count away from its words
# The terminal's and the HTML's line of the fixes' effect: "graph breaks, bf16: 25 ... (as written: 27 ...)".
_TERMINAL_APPLIED = re.compile(r"^\s*graph breaks, (\w+): (.*) \(as written: (.*)\)$", re.M)
_HTML_APPLIED = re.compile(r"<tr><td>graph breaks, (\w+)</td><td>(.*?)</td><td>(.*?)</td></tr>", re.S)


def counts(text: str) -> set[int]:
    """Every number stated as a count of graph breaks in `text`."""
    return {int(n) for n in COUNT.findall(text)}


def html_sections(page: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', page, re.S))


def html_text(fragment: str) -> str:
    """The visible text of an HTML fragment, whitespace collapsed."""
    inline = re.sub(r"</?(?:b|i|span|code|a)\b[^>]*>", "", fragment)
    return " ".join(re.sub(r"<[^>]+>", " ", inline).split())


@dataclass(frozen=True)
class Stated:
    """The counts of graph breaks a report states: per surface (as written), and per dtype and surface with the
    report's fixes applied (None where that surface says Dynamo failed)."""

    surfaces: dict[str, set[int]]
    applied: dict[str, dict[str, set[int] | None]]


def _applied(into: dict, dtype: str, surface: str, text: str) -> None:
    into.setdefault(dtype, {})[surface] = None if "Dynamo failed" in text else counts(text)


def stated(report: Report) -> Stated:
    """Every count of breaks `report` states, read from its renderings as a user reads them."""
    applied: dict[str, dict[str, set[int] | None]] = {}
    out: dict[str, set[int]] = {}

    text = format_summary(report, width=WIDE)
    terminal = {int(n) for n in re.findall(r"^graph breaks: (\d+)", text, re.M)}
    for dtype, with_fixes, as_written in _TERMINAL_APPLIED.findall(text):
        _applied(applied, dtype, "terminal", with_fixes)
        terminal |= counts(as_written)
    out["terminal"] = terminal | counts(_TERMINAL_APPLIED.sub("", text))

    page = render_html(report)
    heading = html_sections(page).get("graph-breaks", "")
    html = {int(n) for n in re.findall(r'<h2>Graph breaks <span class="count">\((\d+)', heading)}
    for dtype, as_written, with_fixes in _HTML_APPLIED.findall(page):
        _applied(applied, dtype, "html", html_text(with_fixes))
        html |= counts(html_text(as_written))
    out["html"] = html | counts(html_text(_HTML_APPLIED.sub("", page)))

    d = json.loads(report.to_json())
    back = Report.from_dict(d)
    out["json"] = {d["graph_break_count"], back.graph_break_count}
    for c in back.applied_breaks:
        _applied(applied, c.dtype, "json", f"Dynamo failed: {c.error}" if c.error else c.break_summary)

    rec = report.recommendation
    out["advice"] = counts(f"{rec.reason}\n{rec.code}") if rec else set()
    out["checklist"] = set().union(*(counts(c.evidence) for c in report.checklist))
    return Stated(out, applied)


@dataclass(frozen=True)
class Check:
    text: str  # a table cell: the value when it holds, what differs when it does not
    ok: bool


def _count_cell(found: set[int] | None, ref: int, optional: bool = False) -> Check:
    if found is None:
        return Check("Dynamo failed", False)
    if not found:
        return Check("-", optional)  # the advice names no count unless it rests on the breaks
    if found == {ref}:
        return Check(str(ref), True)
    return Check(f"{'/'.join(map(str, sorted(found)))} (ref {ref})", False)


def surface_checks(report: Report, explain: int) -> dict[str, Check]:
    """Each surface's count against explain's (the report's own where explain's is not sane, < 0: then the
    surfaces must at least agree with one another)."""
    ref = explain if explain >= 0 else report.graph_break_count
    found = stated(report).surfaces
    return {s: _count_cell(found[s], ref, optional=s == "advice") for s in SURFACES}


def fix_break_check(report: Report, explain_with: dict[str, int | None]) -> Check:
    """The counts stated with the fixes on, per dtype and surface, against explain run with the fixes on (None:
    explain failed too, so every surface must say Dynamo failed)."""
    if not report.applied:
        return Check("n/a", True)
    applied = stated(report).applied
    if not explain_with:
        return Check("no reference: " + "; ".join(f"{d} {per}" for d, per in applied.items()), False)
    cells, ok = [], True
    for dtype, ref in explain_with.items():
        per = applied.get(dtype, {})
        if ref is None:
            wrong = sorted(s for s in ("terminal", "html", "json") if per.get(s, set()) is not None)
            wrong = [f"{s} states a count where explain failed" for s in wrong]
        else:
            wrong = sorted(
                {c.text for s in ("terminal", "html", "json") if not (c := _count_cell(per.get(s, set()), ref)).ok}
            )
        ok &= not wrong
        cells.append(f"{dtype} {'failed' if ref is None else ref}" if not wrong else f"{dtype} {', '.join(wrong)}")
    return Check("; ".join(cells), ok)


def fix_row_check(report: Report) -> Check:
    """Rows as written that failed and ran with the fixes: the acceptance wants the bf16 row running where it
    failed before; every pair is listed as before -> after. A model whose rows all ran as written has nothing for
    the fixes to show (RetinaNet on torch 2.11: torchvision's NMS takes bf16 there); that the set shows a rescued
    row somewhere is `rescued_somewhere`'s to say."""
    if not report.applied:
        return Check("n/a", True)
    pairs = [(b, a) for b, a in report.fix_pairs if b.error and not b.error.startswith("skipped")]
    if not pairs:
        return Check("no row failed as written", True)
    rescued = [f"{b.name}: failed -> {a.outcome}" for b, a in pairs if a.median_ms is not None]
    still = [f"{b.name}: failed -> {'skipped' if (a.error or '').startswith('skipped') else 'failed'}"
             for b, a in pairs if a.median_ms is None]  # fmt: skip
    return Check("; ".join(rescued + still), bool(rescued))


RESCUED = re.compile(r"failed -> [0-9]")  # a fix_row_check cell naming a row that ran with the fixes


def rescued_somewhere(cells: list[str]) -> bool:
    """Whether any model's `with_fix_rows` cell shows a row that failed as written and ran with our fixes."""
    return any(RESCUED.search(c or "") for c in cells)


def row_names(report: Report) -> list[str]:
    """Every row name the doctor can form for this report, longest first (so "compile default bf16 with nms" is
    read before "compile default bf16")."""
    with_ = [""] + ([f" with {'+'.join(report.applied)}"] if report.applied else [])
    names = {cfg.config_name(m, d) + w for m in (*cfg.GPU_MODES, *cfg.PRESET_ROWS) for d in cfg.TOLERANCE
             for w in with_}  # fmt: skip
    return sorted(names | {c.name for c in report.configs}, key=len, reverse=True)


def named_rows(text: str, names: list[str]) -> list[str]:
    """The row names (of `names`, longest first) that `text` mentions, each occurrence read once."""
    found = []
    for name in names:
        pattern = re.compile(re.escape(name) + r"(?![\w-])")
        if pattern.search(text):
            found.append(name)
            text = pattern.sub(" ", text)
    return found


def advice_rows_check(report: Report) -> Check:
    """No advice (the recommendation, the checklist, our fixes' reasons) names a row that did not run: one the
    budget skipped or never started. The rows the recommendation rests on must also have been timed."""
    ran = {c.name for c in report.configs if not (c.error or "").startswith("skipped")}
    timed = {c.name for c in report.configs if c.median_ms is not None}
    names = row_names(report)
    rec = report.recommendation
    texts = [c.evidence for c in report.checklist] + [why for f in report.fixes for why in f.reasons]
    if rec:
        texts += [rec.reason, rec.code]
    wrong = {n for t in texts for n in named_rows(t, names) if n not in ran}
    if rec:
        wrong |= {n for n in (rec.config, rec.baseline, *rec.tie) if n and n not in timed}
    return Check("ok" if not wrong else "names " + ", ".join(sorted(wrong)), not wrong)


def ceiling_check(report: Report) -> Check:
    """No class's rate above CEILING_MAX percent of its ceiling, in any breakdown; the highest one is shown."""
    rated = [(c.pct_of_ceiling, f"{b.label}: {c.name}") for b in report.breakdowns for c in b.classes
             if c.pct_of_ceiling is not None]  # fmt: skip
    if not rated:
        return Check("no rate" if report.breakdowns else "no breakdown", True)
    over = [f"{w} {p:.0f}%" for p, w in rated if p > CEILING_MAX]
    if over:
        return Check("over: " + ", ".join(over), False)
    top, where = max(rated)
    return Check(f"max {top:.0f}% ({where})", True)


def detection_check(report: Report) -> Check:
    """Every compiled row that ran is judged by matched detections (a detector's rows), and at least one ran."""
    compiled = [c for c in report.configs if c.mode != "eager" and c.error is None and c.median_ms is not None]
    if not compiled:
        return Check("no compiled row ran", False)
    flat = [c.name for c in compiled if c.matched is None]
    if flat:
        return Check("flat error only: " + ", ".join(flat), False)
    low = min(compiled, key=lambda c: c.matched)
    return Check(f"{len(compiled)} rows, lowest {low.matched:.1%} ({low.name})", True)


def budget_check(report: Report, modes: tuple[str, ...], dtypes: tuple[torch.dtype, ...]) -> Check:
    """Every row asked for and not run (skipped by the plan, or cut when the budget ran out) is named in the
    notes; a row run with fixes counts as named when its row as written is."""
    with_ = f" with {'+'.join(report.applied)}" if report.applied else ""
    asked = [cfg.config_name(m, d) + w for m in modes for d in dtypes for w in dict.fromkeys(("", with_))]
    present = {c.name: c for c in report.configs}
    cut = [n for n in asked if n not in present or (present[n].error or "").startswith("skipped")]
    notes = "\n".join(n for n in report.notes if "--budget" in n)
    unnamed = [n for n in cut if n not in notes and n.removesuffix(with_) not in notes]
    if unnamed:
        return Check("not named: " + ", ".join(unnamed), False)
    return Check("skipped " + ", ".join(cut) if cut else "all rows ran", True)


def check(
    report: Report,
    explain: int,
    modes: tuple[str, ...],
    dtypes: tuple[torch.dtype, ...],
    explain_with: dict[str, int] | None = None,
    detector: bool = False,
) -> dict[str, Check]:
    """Every acceptance point for one model's report, by column name. `modes` and `dtypes`: what the doctor was asked to
    run; `explain_with`: explain's count with the report's fixes on, per dtype."""
    out = surface_checks(report, explain)
    out["with_fix_breaks"] = fix_break_check(report, explain_with or {})
    out["with_fix_rows"] = fix_row_check(report)
    out["advice_rows"] = advice_rows_check(report)
    out["ceilings"] = ceiling_check(report)
    out["detections"] = detection_check(report) if detector else Check("n/a", True)
    out["budget"] = budget_check(report, modes, dtypes)
    return out
