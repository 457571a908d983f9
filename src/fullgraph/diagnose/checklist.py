"""The deployment checklist of the torch.compile chapter (its best-practice list), each item judged from the
report's own measurements: pass, fail, or not-measured when this run has no data for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fullgraph.diagnose.report import ChecklistItem, Report


def _item(name: str, status: str, evidence: str) -> ChecklistItem:
    return ChecklistItem(name, status, evidence)


def build_checklist(report: Report, vary: Sequence[str], gpu: bool) -> list[ChecklistItem]:
    breaks, recompiles = report.graph_break_count, [r for r in report.recompiles if r.trigger != "inputs"]
    same_input = [r for r in report.recompiles if r.trigger == "inputs"]
    ok = [c for c in report.configs if c.ok]
    rec = report.recommendation
    best = next((c for c in report.configs if rec and c.name == rec.config), None)
    items = [
        _item(
            "Graph breaks analysed and removed",
            "pass" if breaks == 0 else "fail",
            f"{breaks} graph break(s) in {report.graph_count} graph(s)",
        ),
        _item(
            "Python interaction with the graph minimised (lint)",
            "pass" if not report.lint else "fail",
            f"{len(report.lint)} lint finding(s)",
        ),
        _item(
            "Stable inputs do not recompile",
            "pass" if not same_input else "fail",
            f"{len(same_input)} recompile(s) when called again with the same inputs",
        ),
        _item(
            "Dynamic shapes handled (fixed, bucketed or declared dynamic)",
            "not-measured" if not vary else ("pass" if not recompiles else "fail"),
            "no --vary given" if not vary else f"{len(recompiles)} recompile(s) varying {', '.join(vary)}",
        ),
        _item(
            "Compile mode chosen by measurement",
            "pass" if rec else "fail",
            f"{len(report.configs)} configuration(s) timed; best: {rec.config}"
            + (f" at {rec.versus}" * bool(rec.versus))
            if rec
            else "no configuration ran within tolerance",
        ),
        _item(
            "Compile time weighed against the speed-up",
            "pass" if best and (best.compile_s is not None or best.mode == "eager") else "not-measured",
            f"{best.name}: first call {best.compile_s:.1f} s" if best and best.compile_s is not None else "–",
        ),
        _item(
            "Numerics checked against eager float32",
            "pass" if ok else "fail",
            f"{len(ok)} of {len(report.configs)} configuration(s) within tolerance",
        ),
        _item(
            "Memory use monitored",
            "pass" if any(c.peak_memory_bytes is not None for c in report.configs) else "not-measured",
            "peak device memory per configuration" if gpu else "no allocator statistics on the CPU",
        ),
        _item(
            "CUDA graphs run without skips",
            "not-measured" if not gpu else ("pass" if not report.cudagraph_skips else "fail"),
            "CPU run" if not gpu else f"{len(report.cudagraph_skips)} skip(s)",
        ),
        _item("Compile cache warmed before serving", "not-measured", "warm-up and cache artifacts: not measured here"),
        _item("Fallback to eager prepared", "not-measured", "not measured here"),
    ]
    return items
