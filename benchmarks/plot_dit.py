"""Chart of `fullgraph bench dit` results: each compiled variant's speed over the compiled plain twin, per point.

Reads the long-format CSV the suite writes (`--csv`), draws one group of bars per (mode, tokens) point, and writes a
PNG (docs/dit-benchmark.png by default). Needs matplotlib (on the GPU image; `pip install matplotlib` elsewhere).

Run: python3 benchmarks/plot_dit.py benchmarks/results/dit_h200.csv [-o docs/dit-benchmark.png]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict

VARIANTS = (
    "plain again (second instance), compiled",
    "ours auto, compiled",
    "ours native, compiled",
    "ours native + linear_gelu kernel, compiled",
    "ours auto, fused norms native, compiled",
    "ours kernel, compiled",
)


def ratios(path: str) -> dict[tuple[str, int], dict[str, float]]:
    """{(mode, tokens): {variant: plain compiled time / variant time}} from a bench dit CSV."""
    out: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["suite"] != "dit" or row["metric"] != "over_plain_compiled":
                continue
            params = json.loads(row["params"])
            out[(params.get("mode", "default"), int(params["tokens"]))][row["variant"]] = 1 / float(row["value"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("-o", "--output", default="docs/dit-benchmark.png")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_dit.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    data = ratios(args.csv)
    if not data:
        print(f"{args.csv}: no `bench dit` rows with over_plain_compiled", file=sys.stderr)
        return 2
    points = sorted(data, key=lambda p: (p[0] != "default", p[1]))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(VARIANTS)
    for i, variant in enumerate(VARIANTS):
        xs = [j + (i - (len(VARIANTS) - 1) / 2) * width for j in range(len(points))]
        ax.bar(xs, [data[p].get(variant, 0) for p in points], width, label=variant.removesuffix(", compiled"))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.05, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(points)), [f"{mode}\n{tokens} tokens" for mode, tokens in points])
    ax.set_ylim(0.6, 1.12)
    ax.set_ylabel("speed over plain PyTorch, compiled (x)")
    ax.set_title("DiT stack (dim 3072, 24 heads, 4 blocks, bf16, batch 1), H200, torch.compile(fullgraph=True)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
