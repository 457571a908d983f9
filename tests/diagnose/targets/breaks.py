"""Two small models whose graph breaks the doctor must count and fix right (issue 34, items 1 and 4).

- `ThreeHits`: one break site (a `print` in a helper) hit three times in one call: explain counts 3 breaks,
  at 1 place.
- `SkippedLoop`: a forward that loops over a list of images with a data-dependent `if` and a `print` inside the
  loop. The `if` breaks the graph inside a loop, so Dynamo skips the whole function and runs it eagerly (torch
  2.13's explain: `graph_break_count` -1, 0 graphs). The doctor must say so, before any count, and give the `if`
  the fix for a condition on a tensor's value.

fullgraph doctor tests/diagnose/targets/breaks.py:skipped --mode eager,default
"""

import torch
from torch import nn


def noisy(x):
    print("step")  # the one break site
    return x * 2


class ThreeHits(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        # Written out, not a loop: a break inside a loop makes Dynamo skip the whole function (SkippedLoop).
        x = noisy(self.lin(x))
        x = noisy(self.lin(x))
        return noisy(self.lin(x))


class SkippedLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, images):
        outs = []
        for img in images:
            y = self.conv(img)
            if y.mean() > 0:  # a branch on a tensor value, inside a loop: Dynamo gives up on forward
                y = y * 0.5
            print("image done")
            outs.append(y)
        return outs


def three_hits():
    return ThreeHits(), (torch.randn(4, 16),)


def skipped():
    return SkippedLoop(), ([torch.randn(1, 3, 16, 16) for _ in range(3)],)
