"""FG007 planted: Python loops whose trip count is a tensor size."""

import torch
from torch import nn


class RowLoop(nn.Module):
    def forward(self, x):
        out = torch.zeros_like(x)
        for i in range(x.shape[0]):  # expect: FG007
            out[i] = x[i] * 2
        for j in range(x.size(1)):  # expect: FG007
            out[:, j] = out[:, j] + 1
        for i in range(len(x)):  # expect: FG007
            out[i] = out[i].relu()
        batch, width = x.shape
        for b in range(batch):  # expect: FG007
            out[b] = out[b] / width
        halves = [x[i] for i in range(x.shape[0] // 2)]  # expect: FG007
        for k in range(0, width, 2):  # expect: FG007
            out[:, k] = 0
        return out, halves
