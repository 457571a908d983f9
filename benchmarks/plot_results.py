"""Markdown tables and a PNG chart from `fullgraph bench vit|nms|robot` results (docs/results.md).

Reads one or more long-format CSVs (`--csv` of the suites; `fullgraph.bench.read_csv`) and writes:

- one markdown table per suite: per point and variant, ms median with p20-p80, throughput where it has one (img/s
  for vit, boxes/s for nms: boxes x batch per call), peak MiB, first call s, the error column of the suite (vit: the
  logits' relative error against eager fp32; nms: exactness; robot: recompiles after warm-up and the largest
  |difference| from eager) and the speed-up over the suite's baseline: vit the reference's eager fp32 ("x eager
  fp32"), nms torchvision (or ours eager without it), robot eager. To stdout, or to `--markdown FILE`.
- with `--png FILE`: one panel per suite present, grouped bars: vit throughput (img/s) per variant per batch size,
  nms boxes/s per variant per point, robot median ms per request per way (p20-p80 as error bars). Needs matplotlib.

Rows are grouped by (suite, point, variant); a later row of the same metric replaces an earlier one, so a CSV
appended to by several runs shows the newest. Columns no row of a suite fills are left out.

Run: python benchmarks/plot_results.py benchmarks/results/{vit,nms,robot}_h200.csv \
         --markdown benchmarks/results/results_h200.md --png docs/results.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fullgraph.bench.results import Result, read_csv
from fullgraph.errors import UsageError

SUITES = ("vit", "nms", "robot")
# suite -> the baseline variant's name (or the end of it, for vit's "<reference>, eager fp32"), in preference order
BASELINES = {"vit": (", eager fp32",), "nms": ("torchvision, eager", "ours, eager"), "robot": ("eager",)}


@dataclass
class Entry:
    """One (suite, point, variant): its metrics and the point's parameters."""

    suite: str
    point: str
    variant: str
    params: dict
    metrics: dict[str, float] = field(default_factory=dict)

    def get(self, metric: str) -> float | None:
        return self.metrics.get(metric)


def collect(results: Sequence[Result]) -> dict[str, list[Entry]]:
    """suite -> its entries, points and variants in the order they first appear."""
    entries: dict[tuple[str, str, str], Entry] = {}
    for r in results:
        if r.suite not in SUITES:
            continue
        key = (r.suite, r.case, r.variant)
        if key not in entries:
            entries[key] = Entry(r.suite, r.case, r.variant, json.loads(r.params or "{}"))
        entries[key].metrics[r.metric] = r.value
    out: dict[str, list[Entry]] = {}
    for e in entries.values():
        if e.get("median_ms") is not None:  # vit's breakdown-only rows share a timed variant's key
            out.setdefault(e.suite, []).append(e)
    return out


def baseline(suite: str, entries: Sequence[Entry]) -> Entry | None:
    for name in BASELINES[suite]:
        found = [e for e in entries if e.variant == name or (name.startswith(",") and e.variant.endswith(name))]
        if found:
            return found[0]
    return None


def boxes_per_s(e: Entry) -> float | None:
    """nms: boxes in per second (boxes per image x images per call / median)."""
    if e.suite != "nms" or "boxes" not in e.params or "batch" not in e.params:
        return None
    return e.params["boxes"] * e.params["batch"] / e.metrics["median_ms"] * 1e3


def throughput(e: Entry) -> float | None:
    """Items per second where the suite has a throughput: vit images, nms boxes."""
    return e.get("images_per_s") if e.suite == "vit" else boxes_per_s(e)


def _num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def _spread(e: Entry) -> str | None:
    p20, p80 = e.get("p20_ms"), e.get("p80_ms")
    return None if p20 is None or p80 is None else f"{_ms(p20)}-{_ms(p80)}"


def _small(v: float) -> str:
    return "0" if v == 0 else f"{v:.1e}"


def _opt(v: float | None, fmt: Callable[[float], str]) -> str | None:
    return None if v is None else fmt(v)


# (header, cell of an entry or None); a column none of a suite's entries fills is dropped
COLUMNS: tuple[tuple[str, Callable[[Entry], str | None]], ...] = (
    ("ms", lambda e: _ms(e.metrics["median_ms"])),
    ("p20-p80", _spread),
    ("img/s", lambda e: _opt(e.get("images_per_s"), lambda v: f"{v:.1f}" if v < 100 else f"{v:.0f}")),
    ("boxes/s", lambda e: _opt(boxes_per_s(e), lambda v: f"{v:.0f}")),
    ("peak MiB", lambda e: _opt(e.get("peak_memory_bytes"), lambda v: f"{v / 2**20:.0f}")),
    ("first call s", lambda e: _opt(e.get("first_call_s"), lambda v: f"{v:.3g}")),
    ("rel err", lambda e: _opt(e.get("rel_err"), _small)),
    ("exact", lambda e: _opt(e.get("exact"), lambda v: "yes" if v else "NO")),
    ("recompiles after warm-up", lambda e: _opt(e.get("recompiles_after_warmup"), lambda v: f"{v:.0f}")),
    ("compile s", lambda e: _opt(e.get("compile_seconds"), lambda v: f"{v:.3g}")),
    ("max abs diff", lambda e: _opt(e.get("max_abs_diff_vs_eager"), _small)),
)


def suite_table(suite: str, entries: Sequence[Entry]) -> str:
    """The markdown table of one suite, under a line naming where and with what it ran."""
    base = baseline(suite, entries)
    over = f"x {'eager fp32' if suite == 'vit' else base.variant}" if base else None
    header, cells = ["point", "variant"], [[e.point, e.variant] for e in entries]
    for name, cell in COLUMNS:
        column = [cell(e) for e in entries]
        if any(c is not None for c in column):
            header.append(name)
            for row, c in zip(cells, column, strict=True):
                row.append("-" if c is None else c)
    if base is not None:
        header.append(over)
        for row, e in zip(cells, entries, strict=True):
            same = [b for b in entries if b.point == e.point and b.variant == base.variant]
            row.append(f"{same[0].metrics['median_ms'] / e.metrics['median_ms']:.2f}" if same else "-")
    lines = [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
    return "\n".join(lines + [f"| {' | '.join(row)} |" for row in cells])


def environment(results: Sequence[Result], suite: str) -> str:
    """`cpu, torch 2.13.0, triton 3.6.0, fullgraph 0.1.0 (abc1234), 2025-01-02` for one suite's rows."""
    rows = [r for r in results if r.suite == suite]
    seen = {(r.gpu, r.torch, r.triton, r.fullgraph, r.commit[:7]) for r in rows}
    dates = sorted({r.date[:10] for r in rows})
    runs = "; ".join(f"{g}, torch {t}, triton {tr or '-'}, fullgraph {f}" + (f" ({c})" if c else "")
                     for g, t, tr, f, c in sorted(seen))  # fmt: skip
    return f"{runs}; {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "")


def breakdown_table(entries: Sequence[Entry]) -> str | None:
    """vit --breakdown: GPU kernel ms per call by class for the variants profiled, largest classes first."""
    profiled = [e for e in entries if any(m.startswith("class_ms_") for m in e.metrics)]
    if not profiled:
        return None
    totals: dict[str, float] = {}
    for e in profiled:
        for m, v in e.metrics.items():
            if m.startswith("class_ms_"):
                totals[m] = totals.get(m, 0.0) + v
    classes = sorted(totals, key=lambda m: -totals[m])
    header = ["point", "variant", *(m.removeprefix("class_ms_") for m in classes)]
    lines = [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
    for e in profiled:
        row = [e.point, e.variant, *(_opt(e.get(m), lambda v: f"{v:.3f}") or "-" for m in classes)]
        lines.append(f"| {' | '.join(row)} |")
    return "\n".join(lines)


def markdown(results: Sequence[Result]) -> str:
    data = collect(results)
    parts = []
    for suite in SUITES:
        if suite not in data:
            continue
        parts += [f"### {suite}", "", environment(results, suite), "", suite_table(suite, data[suite]), ""]
        where = breakdown_table(data[suite])
        if where:
            parts += ["Where the GPU time goes (kernel ms per call, torch.profiler, by kernel class):", "", where, ""]
    return "\n".join(parts)


def bar(e: Entry) -> tuple[float, float, float]:
    """A bar's height and its p20-p80 span: throughput for vit and nms (at p80 and p20), median ms for robot."""
    med = e.metrics["median_ms"]
    p20, p80 = e.get("p20_ms") or med, e.get("p80_ms") or med
    tp = throughput(e)
    return (med, p20, p80) if tp is None else (tp, tp * med / p80, tp * med / p20)


def chart(results: Sequence[Result], data: dict[str, list[Entry]], path: str, plt) -> None:
    """One panel per suite, grouped bars: points along x, one bar per variant, p20-p80 as error bars."""
    suites = [s for s in SUITES if s in data]
    fig, axes = plt.subplots(len(suites), 1, figsize=(11, 4.2 * len(suites)), squeeze=False)
    for ax, suite in zip(axes[:, 0], suites, strict=True):
        entries = data[suite]
        points = list(dict.fromkeys(e.point for e in entries))
        variants = list(dict.fromkeys(e.variant for e in entries))
        width = 0.8 / len(variants)
        values: list[float] = []
        for i, variant in enumerate(variants):
            by_point = {p: e for p in points for e in entries if e.point == p and e.variant == variant}
            xs = [points.index(p) + (i - (len(variants) - 1) / 2) * width for p in by_point]
            bars_of = [bar(e) for e in by_point.values()]  # (height, low, high) per point, in order
            ys = [y for y, _, _ in bars_of]
            err = [[y - lo for y, lo, _ in bars_of], [hi - y for y, _, hi in bars_of]]
            bars = ax.bar(xs, ys, width, yerr=err, capsize=2, error_kw={"linewidth": 0.8}, label=variant)
            ax.bar_label(bars, labels=[f"{y:.0f}" if y >= 100 else f"{y:.3g}" for y in ys], fontsize=6)
            values += [y for y in ys if y > 0]
        if values and max(values) / min(values) > 50:
            ax.set_yscale("log")  # batch 1 and batch 256 differ by two orders of magnitude
        ax.set_xticks(range(len(points)), points)
        unit = {"vit": "images / s (higher is better)", "nms": "boxes / s (higher is better)"}
        ax.set_ylabel(unit.get(suite, "median ms per request (lower is better)"))
        ax.set_title(f"{suite}: {environment(results, suite)}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+", help="result CSVs of fullgraph bench vit / nms / robot")
    parser.add_argument("--markdown", help="write the tables here (default: stdout)")
    parser.add_argument("--png", help="write the chart here")
    args = parser.parse_args(argv)
    plt = None
    if args.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("plot_results.py --png needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
    try:
        results = [r for path in args.csv for r in read_csv(path)]
    except (OSError, UsageError) as e:
        print(f"plot_results.py: {e}", file=sys.stderr)
        return 2
    data = collect(results)
    if not data:
        print(f"{', '.join(args.csv)}: no rows of the {', '.join(SUITES)} suites", file=sys.stderr)
        return 2
    text = markdown(results)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
        print(f"wrote {args.markdown}")
    else:
        print(text)
    if plt is not None:
        chart(results, data, args.png, plt)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
