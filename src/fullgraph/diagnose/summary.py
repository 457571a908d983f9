"""The doctor's terminal summary: what broke, what recompiled, the measured table and the recommendation."""

from __future__ import annotations

import contextlib
import os

from fullgraph.bench.table import format_table
from fullgraph.diagnose.report import Report


def _where(path: str, line: int) -> str:
    with contextlib.suppress(ValueError):  # another drive on Windows: keep the absolute path
        path = os.path.relpath(path)
    return f"{path}:{line}"


def format_summary(r: Report) -> str:
    out = [f"fullgraph doctor: {r.target} on {r.device}, inputs {', '.join(r.inputs)}", ""]
    out.append(
        f"graph breaks: {r.graph_break_count} ({r.graph_count} graphs, as explain counts), "
        f"at {len(r.graph_breaks)} place(s)"
    )
    for b in r.graph_breaks:
        gb = f" [{b.gb_id}]" if b.gb_id else ""
        out.append(f"  {_where(b.file, b.line)}  {b.source}\n    {b.reason}{gb}\n    fix: {b.fix}")
    out.append(f"recompiles: {len(r.recompiles)}")
    for c in r.recompiles:
        out.append(
            f"  {_where(c.file, c.line)} {c.function} (varying {c.trigger}): {c.guard_failure}\n    fix: {c.fix}"
        )
    if r.cudagraph_skips:
        out.append(f"CUDA-graph skips: {len(r.cudagraph_skips)}")
        out += [f"  {s}" for s in r.cudagraph_skips]
    out.append(f"lint findings: {len(r.lint)}")
    out += [f"  {_where(f.path, f.line)}:{f.col} {f.rule} {f.message}" for f in r.lint]
    out.append("")
    rows = [
        [c.name, c.median_ms, c.p20_ms, c.p80_ms, c.compile_s, c.rel_err, "ok" if c.ok else (c.error or "over tol")]
        for c in r.configs
    ]
    out.append(format_table(["configuration", "median ms", "p20", "p80", "compile s", "rel err", "status"], rows))
    out.append("")
    if r.recommendation:
        rec = r.recommendation
        out.append(f"recommendation: {rec.config}{', ' + rec.versus if rec.versus else ''}\n")
        out += ["    " + line for line in rec.code.splitlines()]
    else:
        out.append("recommendation: none (no configuration ran within tolerance)")
    out.append("")
    out.append("checklist:")
    out += [f"  [{c.status:^12}] {c.item}: {c.evidence}" for c in r.checklist]
    out += [f"note: {n}" for n in r.notes]
    return "\n".join(out)
