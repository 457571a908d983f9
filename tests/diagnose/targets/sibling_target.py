"""TARGET importing a sibling module from its own folder, as a user's model file often does.

fullgraph doctor tests/diagnose/targets/sibling_target.py:build --mode eager
"""

import torch
from sibling_parts import GatedBlock
from torch import nn

DIM = 24


def build():
    model = nn.Sequential(GatedBlock(DIM), GatedBlock(DIM))
    return model, (torch.randn(3, DIM),)
