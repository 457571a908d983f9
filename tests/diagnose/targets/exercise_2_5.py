"""TARGET: the chapter's exercise 2.5 as written, a `@torch.compile`-decorated function with a Python float argument.

fullgraph doctor tests/diagnose/targets/exercise_2_5.py:build --mode eager

`x.shape[0] > 32` is a condition on a shape (specialized and guarded, no break); `scores.max() > threshold`
is a condition on a tensor's value: one break.
"""

import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).eval()


def special_process(x):
    return x.flip(-1) * 2 + 1


@torch.compile
def process(x, threshold):
    if x.shape[0] > 32:
        x = x[:32]
    scores = model(x)
    if scores.max() > threshold:
        x = special_process(x)
    return x


def inputs(batch: int = 48) -> tuple[torch.Tensor, float]:
    """A batch over 32 (so the slice runs) and a threshold the scores' maximum exceeds (so the branch runs)."""
    x = torch.randn(batch, 16)
    with torch.no_grad():
        threshold = float(model(x[:32]).max()) - 0.1
    return x, threshold


def build():
    return process, inputs()
