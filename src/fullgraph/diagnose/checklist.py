"""The deployment checklist of the torch.compile chapter (its best-practice list), each item judged from the
report's own measurements: pass, fail, or not-measured when this run has no data for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fullgraph.diagnose.report import ChecklistItem, Report, plural


def _item(name: str, status: str, evidence: str) -> ChecklistItem:
    return ChecklistItem(name, status, evidence)


def _dynamic_item(report: Report, vary: Sequence[str]) -> ChecklistItem:
    """Pass when a second new size compiles nothing: one recompile on the first new size is Dynamo's automatic
    dynamic marking the dim dynamic, which is the expected, handled case."""
    name = "Dynamic shapes handled (fixed, bucketed or declared dynamic)"
    if not vary:
        return _item(name, "not-measured", "no --vary given")
    first = sum(r.count for r in report.recompiles if r.trigger in vary)
    second = sum(r.count for r in report.recompiles if r.trigger.endswith("(another size)"))
    evidence = f"varying {', '.join(vary)}: {first} recompile(s) on the first new size, {second} on the next"
    if first and not second:
        evidence += " (automatic dynamic took over after one recompile)"
    return _item(name, "pass" if not second else "fail", evidence)


def _compile_time_item(report: Report, best, base) -> ChecklistItem:
    """Compile seconds against the time saved per call: how many calls before compiling has paid for itself."""
    name = "Compile time weighed against the speed-up"
    compiled = [c for c in report.configs if c.mode != "eager" and c.median_ms]
    if best is None or not compiled:
        return _item(name, "not-measured", "no compile mode was measured")
    if best.mode == "eager":
        return _item(name, "pass", f"eager recommended: no compile time to pay ({len(compiled)} compiled row(s) timed)")
    if base is None or best.compile_s is None or base.median_ms <= best.median_ms:
        return _item(name, "not-measured", "no eager row to weigh the compile time against")
    saved_ms = base.median_ms - best.median_ms
    calls = best.compile_s * 1e3 / saved_ms
    return _item(
        name,
        "pass",
        f"{best.name}: {best.compile_s:.1f} s to compile, {saved_ms:.3g} ms saved per call over {base.name}: pays for"
        f" itself after {calls:,.0f} calls",
    )


def build_checklist(report: Report, vary: Sequence[str], gpu: bool) -> list[ChecklistItem]:
    breaks = report.graph_break_count
    same_input = [r for r in report.recompiles if r.trigger == "inputs"]
    ok = [c for c in report.configs if c.ok]
    rec = report.recommendation
    best = next((c for c in report.configs if rec and c.name == rec.config), None)
    base = next((c for c in report.configs if rec and c.name == rec.baseline), None)
    modes = {c.mode for c in report.configs if c.median_ms}
    timed = [c.name for c in report.configs if c.median_ms]  # the rows a judgement may rest on
    items = [
        _item(
            "Graph breaks analysed and removed",
            "pass" if breaks == 0 and not report.skipped_frames else "fail",
            f"{report.break_summary} ({plural(report.graph_count, 'graph')} captured)"
            + "".join(f"; {g.function or 'a function'} ran eagerly: {g.skipped}" for g in report.skipped_frames),
        ),
        _item(
            "Python interaction with the graph minimised (lint)",
            "pass" if not report.lint else "fail",
            f"{len(report.lint)} lint finding(s) in the model's own code",
        ),
        _item(
            "Stable inputs do not recompile",
            "pass" if not same_input else "fail",
            f"{sum(r.count for r in same_input)} recompile(s) when called again with the same inputs",
        ),
        _dynamic_item(report, vary),
        _item(
            "Compile mode chosen by measurement",
            "not-measured" if len(modes) < 2 else ("pass" if rec else "fail"),
            "only one mode was timed"
            if len(modes) < 2
            else (
                f"timed {', '.join(timed)}; {rec.config}: {rec.reason}" + (f", {rec.versus}" if rec.versus else "")
                if rec
                else "the model returns nothing to check, so no configuration is recommended"
                if report.nothing_checked
                else "no configuration ran within tolerance"
            ),
        ),
        _compile_time_item(report, best, base),
        _item(
            "Numerics checked against eager float32",
            "not-measured" if report.nothing_checked else "pass" if ok else "fail",
            "the model returns no tensor and holds no buffers: nothing to compare"
            if report.nothing_checked
            else f"{len(ok)} of {len(report.configs)} configuration(s) within tolerance"
            + (f": {', '.join(c.name for c in ok)}" if ok else ""),
        ),
        _item(
            "Memory use monitored",
            "pass" if any(c.peak_memory_bytes is not None for c in report.configs) else "not-measured",
            "peak device memory per configuration" if gpu else "no allocator statistics on the CPU",
        ),
        _item(
            "CUDA graphs run without skips",
            "not-measured"
            if not gpu or not modes & {"reduce-overhead", "max-autotune"}
            else ("pass" if not report.cudagraph_skips else "fail"),
            "CPU run" if not gpu else f"{len(report.cudagraph_skips)} skip(s)",
        ),
        _item("Compile cache warmed before serving", "not-measured", "warm-up and cache artifacts: not measured here"),
        _item("Fallback to eager prepared", "not-measured", "not measured here"),
    ]
    return items
