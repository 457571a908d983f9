"""ViT-B/16 batch 1 on the GPU: eager fp32 and compile default bf16, timed with autograd on and under no_grad.

The doctor times under no_grad (inference); this checks whether DESIGN.md's anchors (eager fp32 4.30 ms,
compile default bf16 3.66 ms) were taken with autograd enabled.
Run: PYTHONPATH=src python3 benchmarks/probes/vit_grad_mode.py
"""

import functools
import sys
from pathlib import Path

import torch

from fullgraph.bench import measure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, where targets/ lives
from targets.vit import vit_b16


def main() -> int:
    model, x = vit_b16()
    model, x = model.cuda().eval(), x.cuda()
    rows = []
    for dtype, mode in ((torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, "default")):
        m = model.to(dtype)
        xi = x.to(dtype)
        fn = m if mode is None else torch.compile(m, mode=mode)
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                for _ in range(3):
                    fn(xi)  # compiles (one graph per grad mode) and warms up
                t = measure(functools.partial(fn, xi), reps=50)
            rows.append((f"{'eager' if mode is None else 'compile ' + mode} {str(dtype)[6:]}", grad, t.median_ms))
            print(f"{rows[-1][0]:<24} grad={'on ' if grad else 'off'} {t.median_ms:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
