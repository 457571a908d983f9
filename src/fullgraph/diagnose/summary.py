"""The doctor's terminal summary through rich: the measured table and the recommendation first, then what broke,
what recompiled, lint, where the time goes, captured output and the checklist.

`print_summary` prints to a console (stdout by default, styled on a terminal); `format_summary` returns the same as
plain text, for logs and tests. Every string from the report is printed as text, never as rich markup.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from fullgraph._paths import display_path
from fullgraph.bench.breakdown import Breakdown
from fullgraph.bench.kernel_classes import short_name
from fullgraph.bench.table import new_table, to_text
from fullgraph.diagnose.report import ConfigResult, Report, plural

LOG_WIDTH = 120  # print_summary's width off a terminal
_DASH = "-"


def format_summary(report: Report, width: int = 100) -> str:
    """The summary as plain text `width` columns wide (no ANSI codes, trailing spaces stripped)."""
    return to_text(Group(*_blocks(report)), width=width, color=False)


def print_summary(report: Report, console: Console | None = None) -> None:
    """Print the summary to `console`: by default stdout, as wide as the terminal, or LOG_WIDTH off one."""
    console = console or Console(width=None if sys.stdout.isatty() else LOG_WIDTH)
    for block in _blocks(report):
        console.print(block, highlight=False)


def _num(v: float | None, fmt: str = ".3g") -> str:
    return _DASH if v is None else format(v, fmt)


def _pct(fraction: float | None) -> str:
    return _DASH if fraction is None else f"{100 * fraction:.0f}%"


def _where(file: str, line: int, col: int | None = None) -> str:
    return f"{display_path(file)}:{line}" + ("" if col is None else f":{col}")


def _indented(renderable: RenderableType, n: int = 2) -> Padding:
    """`renderable` indented by `n` columns, its wrapped lines too."""
    return Padding(renderable, (0, 0, 0, n))


def _title(text: str) -> Text:
    return Text(text, style="bold")


def _label(text: str, style: str) -> Text:
    return Text(text, style=style)


def _blocks(r: Report) -> Iterator[RenderableType]:
    """The summary, block by block; a blank line between sections."""
    yield Text.assemble(
        ("fullgraph doctor: ", "bold"),
        (r.target, "bold cyan"),
        f" on {r.device}, inputs {', '.join(r.inputs) or _DASH}",
    )
    if r.timing:
        yield Text("timing: " + " · ".join(f"{k} {v}" for k, v in r.timing.items()), style="dim")
    yield Text()
    skipped = list(_skipped(r))
    yield from skipped
    if skipped:
        yield Text()
    yield from _configs(r)
    yield Text()
    yield from _recommendation(r)
    yield Text()
    fixes = list(_fixes(r))
    yield from fixes
    if fixes:
        yield Text()
    yield from _breaks(r)
    yield Text()
    yield from _recompiles(r)
    if r.cudagraph_skips:
        yield Text()
        yield _title(f"CUDA-graph skips: {len(r.cudagraph_skips)}")
        yield from (_indented(Text(f"- {s}")) for s in r.cudagraph_skips)
    yield Text()
    yield from _lint(r)
    for b in r.breakdowns:
        yield Text()
        yield from _breakdown(b)
    if r.output:
        yield Text()
        yield _title(f"captured output: {len(r.output)}")
        yield from (_indented(Text(line)) for line in r.output)
    yield Text()
    yield _title("checklist:")
    if r.checklist:
        table = new_table(["status", "item", "evidence"])
        styles = {"pass": "green", "fail": "bold red"}
        for c in r.checklist:
            table.add_row(_label(c.status, styles.get(c.status, "dim")), Text(c.item), Text(c.evidence))
        yield table
    yield from (Text(f"note: {n}") for n in r.notes)


def _status(c: ConfigResult, recommended: bool) -> Text:
    if c.error is not None:
        return _label("failed", "bold red")
    if c.rel_err is None:
        return _label("not checked", "dim")
    if not c.ok:
        return _label("over tolerance", "red")
    return _label("recommended", "bold green") if recommended else _label("ok", "green")


def _configs(r: Report) -> Iterator[RenderableType]:
    yield _title(f"configurations: {len(r.configs)}") + Text(" (ms; compile: s; peak memory: MiB)", style="dim")
    if not r.configs:
        return
    rec = r.recommendation.config if r.recommendation else None
    head = ["configuration", "median", "p20-p80", "spread", "compile", "memory", "rel err", "status"]
    table = new_table(head, right=[False, True, True, True, True, True, True, False])
    for c in r.configs:
        p20_80 = f"{_num(c.p20_ms)}-{_num(c.p80_ms)}" if c.p20_ms is not None and c.p80_ms is not None else _DASH
        spread = Text(_pct(c.spread))
        if c.noisy:
            spread = Text.assemble(("noisy ", "yellow"), _pct(c.spread))
        mib = None if c.peak_memory_bytes is None else c.peak_memory_bytes / 2**20
        cells = [_num(c.median_ms), p20_80, spread, _num(c.compile_s, ".1f"), _num(mib, ",.0f"), c.check or _DASH]
        style = "bold" if c.name == rec else ""
        table.add_row(
            Text(c.name, style=style), *(Text(x) if isinstance(x, str) else x for x in cells), _status(c, c.name == rec)
        )
    yield table
    for c in r.configs:
        if c.error is not None:
            yield _indented(Text.assemble((f"{c.name} failed: ", "red"), c.error))


def _recommendation(r: Report) -> Iterator[RenderableType]:
    rec = r.recommendation
    if rec is None:
        why = "the model returns nothing to check" if r.nothing_checked else "no configuration ran within tolerance"
        yield _title(f"recommendation: none ({why})")
        return
    yield Text.assemble(
        ("recommendation: ", "bold"), (rec.config, "bold green"), f", {rec.versus}" if rec.versus else ""
    )
    if rec.reason:
        yield _indented(Text(f"why: {rec.reason}"))
    if rec.tie:
        names = [rec.config, *rec.tie]
        tied = ", ".join(names[:-1]) + f" and {names[-1]}"
        yield _indented(Text.assemble(("tie: ", "yellow"), f"{tied} are within 3% or within noise of the fastest"))
    yield Text()
    yield _indented(Text(rec.code, style="cyan"), 4)


def _skipped(r: Report) -> Iterator[RenderableType]:
    """Before the count: a function Dynamo skipped is not compiled at all, whatever the count says."""
    for g in r.skipped_frames:
        yield Text.assemble(
            ("ran eagerly: ", "bold red"), (g.function or "a function", "bold"), f" was not compiled: {g.skipped}"
        )


def _breaks(r: Report) -> Iterator[RenderableType]:
    places = f" at {plural(len(r.breaks), 'place')}" if r.breaks else ""
    yield _title(
        f"graph breaks: {r.graph_break_count}{places} ({plural(r.graph_count, 'graph')} captured, as explain counts)"
    )
    for g in r.graph_breaks:
        # A list, not a table: a source line or a fix is often longer than a table cell leaves room for.
        skipped = (" (skipped: the function ran eagerly)", "red") if g.skipped else ""
        yield _indented(
            Text.assemble(
                (_where(g.file, g.line), "bold"), f" in {g.function}", f" ×{g.count}" if g.count > 1 else "", skipped
            )
        )
        yield _indented(Text(g.source, style="cyan"), 4)
        reason = Text(g.reason)
        if g.gb_id and g.gb_id not in g.reason:
            reason.append(f" [{g.gb_id}]", style="dim")
        yield _indented(reason, 4)
        if g.hint and g.hint != g.fix:
            yield _indented(Text(f"torch's hint: {g.hint}", style="dim"), 4)
        yield _indented(Text.assemble(("fix: ", "green"), g.fix), 4)
        if g.code:
            yield _indented(Text(g.code, style="cyan"), 6)


def _fixes(r: Report) -> Iterator[RenderableType]:
    """Our fixes offered for this report, then, when the run applied some (--with), what they measured."""
    if r.fixes:
        yield _title(f"our fixes: {', '.join(f.name for f in r.fixes)}")
    for f in r.fixes:
        yield _indented(Text.assemble((f.name, "bold green"), f": {f.what}"))
        yield from (_indented(Text(f"for: {why}"), 4) for why in f.reasons)
        yield _indented(Text(f.code, style="cyan"), 4)
    if not r.applied:
        return
    names = "+".join(r.applied)
    yield _title(f"measured with {names}") + Text(f' (rows "... with {names}", timed with the rows as written)', "dim")
    for c in r.applied_breaks:
        counted = f"Dynamo failed: {c.error}" if c.error else c.break_summary
        yield _indented(Text(f"graph breaks, {c.dtype}: {counted} (as written: {r.break_summary})"))
        for g in c.graph_breaks:
            yield _indented(Text.assemble((_where(g.file, g.line), "bold"), f" in {g.function}: {g.reason}"), 4)
            yield _indented(Text.assemble(("fix: ", "green"), g.fix), 6)
    for before, after in r.fix_pairs:
        yield _indented(Text(f"{before.name}: {before.outcome} -> {after.name}: {after.outcome}"))


def _recompiles(r: Report) -> Iterator[RenderableType]:
    total = sum(c.count for c in r.recompiles)
    causes = f" from {plural(len(r.recompiles), 'cause')}" if total != len(r.recompiles) else ""
    yield _title(f"recompiles: {total}{causes}")
    if not r.recompiles:
        return
    table = new_table(["where", "varied", "guard that failed", "fix"])
    table.columns[0].no_wrap = table.columns[1].no_wrap = True  # a path cut in two is no longer a path
    for c in r.recompiles:
        varied = c.trigger + (f" ×{c.count}" if c.count > 1 else "")
        guard = Text(f"in {c.function}\n", style="dim") + Text(c.guard_failure, style="cyan")
        table.add_row(Text(_where(c.file, c.line)), Text(varied), guard, Text(c.fix))
    yield table


def _lint(r: Report) -> Iterator[RenderableType]:
    yield _title(f"lint findings: {len(r.lint)}")
    if not r.lint:
        return
    table = new_table(["where", "rule", "message", "fix"])
    table.columns[0].no_wrap = table.columns[1].no_wrap = True
    for f in r.lint:
        table.add_row(Text(_where(f.path, f.line, f.col)), Text(f.rule), Text(f.message), Text(f.fix))
    yield table


def _breakdown(b: Breakdown) -> Iterator[RenderableType]:
    unit = "GPU kernels" if b.device == "cuda" else "ops"
    idle = f", GPU idle {_pct(b.idle_share)}" if b.idle_share is not None else ""
    yield _title(f"where the time goes: {b.label} on {b.device}")
    yield _indented(Text(f"{b.call_ms:.3g} ms per call, {b.kernel_ms:.3g} ms in {unit}{idle}"))
    if b.classes:
        table = new_table(["class", "ms", "share", "launches", "rate", "% of ceiling"], [False, *[True] * 5])
        for c in b.classes:
            rate = f"{c.rate:.3g} {c.unit}" if c.rate is not None else _DASH
            ceiling = _DASH if c.pct_of_ceiling is None else f"{c.pct_of_ceiling:.0f}%"
            table.add_row(c.name, f"{c.ms:.3g}", _pct(c.share), str(c.kernels), rate, ceiling)
        yield table
    if b.top:
        table = new_table([f"top {unit}", "class", "ms", "launches", "source"], [False, False, True, True, False])
        for k in b.top:
            table.add_row(Text(short_name(k.name)), Text(k.cls), f"{k.ms:.3g}", str(k.calls), Text(k.source or _DASH))
        yield table
    if b.flags:
        table = new_table(["flag", "ms", "what", "fix"], [False, True, False, False])
        for f in b.flags:
            table.add_row(Text(f.kind, style="yellow"), f"{f.ms:.3g}", Text(f.message), Text(f.fix))
        yield table
