"""A chart of `fullgraph bench sweep` results (docs/decisions.md): per point, ours `auto` and all native against the
plain twin, with the point's noise floor, one panel per compile mode.

Reads the sweep's long-format CSVs (its parts, measured apart; a point measured in two files shows the later one)
and writes a PNG: per mode a panel of grouped bars, speed over plain (plain ms / this ms, above 1 is faster) of
ours `auto` and of all native at each point, a tick at "plain again" / plain (the second instance of the plain twin:
how far two runs of one model differ there), and lines at 1.0 and 0.99 (the noise rule: a point is a loss below
0.99 and below its "plain again"). Losses by that rule are named on stdout. Needs matplotlib.

Run: python benchmarks/plot_sweep.py benchmarks/results/sweep_parts_h100.csv,benchmarks/results/sweep_dit_ro_h100.csv
         --png docs/sweep-h100.png [--title "H100, torch 2.11"]
"""

from __future__ import annotations

import argparse
import json
import sys

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import NOISE as LOSS
from fullgraph.bench.suites import is_loss
from fullgraph.bench.suites.sweep import speeds
from fullgraph.errors import UsageError

MODES = ("default", "reduce-overhead")


def points(paths: list[str]) -> dict[str, list[tuple[str, dict]]]:
    """mode -> [(short label, speeds)] of every twin-compared point in the CSVs, in the order first seen."""
    rows = [r for path in paths for r in read_csv(path) if r.suite in ("dit", "vit")]
    if not rows:
        raise UsageError(f"no sweep rows (suites dit, vit) in {', '.join(paths)}")
    modes = {r.case: json.loads(r.params or "{}").get("mode") for r in rows}
    suites = {r.case: r.suite for r in rows}
    out: dict[str, list[tuple[str, dict]]] = {m: [] for m in MODES}
    for case, s in speeds(rows).items():
        if s["plain ms"] is None:
            continue
        mode = modes.get(case) or ("reduce-overhead" if case.endswith("reduce-overhead") else "default")
        label = case.removesuffix(" reduce-overhead").replace(" bf16", "").replace("h x4", "")
        label = f"ViT {label}" if suites[case] == "vit" else f"DiT {label}"
        out.setdefault(mode, []).append((label, s))
    return {m: ps for m, ps in out.items() if ps}


def losses(by_mode: dict[str, list[tuple[str, dict]]], variant: str) -> list[str]:
    """The points where `variant` loses to plain by the noise rule, as "mode point ratio (again ratio)"."""
    return [
        f"{mode} {label} {s[variant]:.3f} (again {s['again']:.3f})"
        for mode, ps in by_mode.items()
        for label, s in ps
        if is_loss(s[variant], s["again"])
    ]


def plot(by_mode: dict[str, list[tuple[str, dict]]], path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plot_sweep needs matplotlib: pip install matplotlib") from None
    fig, axes = plt.subplots(len(by_mode), 1, figsize=(14, 4.2 * len(by_mode)), squeeze=False)
    for ax, (mode, ps) in zip(axes[:, 0], by_mode.items(), strict=True):
        xs = range(len(ps))
        for offset, variant, color in ((-0.2, "auto", "tab:blue"), (0.2, "native", "tab:gray")):
            heights = [s[variant] or 0.0 for _, s in ps]
            ax.bar([x + offset for x in xs], [h - 1 for h in heights], 0.38, bottom=1, color=color,
                   label=f"ours {variant} / plain")  # fmt: skip
        ax.scatter(list(xs), [s["again"] or 1 for _, s in ps], marker="_", s=300, color="black",
                   label="plain again / plain (noise floor)", zorder=3)  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(LOSS, color="tab:red", linewidth=0.8, linestyle="--", label=f"{LOSS} (the loss line)")
        ax.set_xticks(list(xs), [label for label, _ in ps], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("speed over plain compiled")
        ax.set_title(f"{title}: {mode}" if title else mode)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csvs", help="comma-separated sweep CSVs")
    parser.add_argument("--png", required=True, help="the chart to write")
    parser.add_argument("--title", default="", help="the panels' title, e.g. the GPU and torch")
    args = parser.parse_args(argv)
    try:
        by_mode = points(args.csvs.split(","))
        plot(by_mode, args.png, args.title)
    except (UsageError, FileNotFoundError) as e:
        print(f"plot_sweep: {e}", file=sys.stderr)
        return 2
    n = sum(len(ps) for ps in by_mode.values())
    print(f"wrote {args.png}: {n} points ({', '.join(f'{m} {len(ps)}' for m, ps in by_mode.items())})")
    for variant in ("auto", "native"):
        found = losses(by_mode, variant)
        print(f"{variant} losses by the noise rule: {len(found)}" + "".join(f"\n  {f}" for f in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
