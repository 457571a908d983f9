"""FG010 planted: Python numbers that forward and compiled functions compute with (arithmetic on a tensor, a loop's
bound)."""

import torch
from torch import nn


class Scaled(nn.Module):
    def forward(
        self,
        x,
        scale=1.0,  # expect: FG010
        steps: int = 4,  # expect: FG010
        temperature: float | None = None,  # expect: FG010
        shift: float = 0.0,  # expect: FG010
        *,
        eps=1e-6,  # expect: FG010
        offset=-1,  # expect: FG010
    ):
        for _ in range(steps):
            x = x * scale + offset
        half = shift / 2  # through a local
        return x / (temperature or 1.0) + eps + half


@torch.compile
def step(x, lr=0.1):  # expect: FG010
    return x - lr * x.grad


def apply_gain(x, gain: "float"):  # expect: FG010
    return x * gain


fast_gain = torch.compile(apply_gain)
