"""Models with known graph breaks (and one without), for the doctor's tests. Not collected by pytest."""

import torch
from torch import nn


class ValueBranch(nn.Module):
    def forward(self, x):
        y = x.sin()
        if y.sum() > 0:  # break: branch on a value
            y = y * 2
        return y.cos()


class ItemCall(nn.Module):
    def forward(self, x):
        y = x * 3
        s = y.max().item()  # break: host sync
        return y + s


class PrintCall(nn.Module):
    def forward(self, x):
        y = x + 1
        print("shape", y.shape)  # break: print
        return y.exp()


class MaskIndex(nn.Module):
    def forward(self, x):
        y = x.relu() + 0.5
        z = y[y > 1.0]  # break: data-dependent shape
        return z.sum() + y.mean()


class Several(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ItemCall()

    def forward(self, x):
        y = self.inner(x)
        if y.mean() > 0:  # break
            y = y - 1
        print("done")  # break
        return y * y


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        if x.shape[0] > 10:  # shape-only: no break
            x = x * 2
        return torch.where(x.sum(-1, keepdim=True) > 0, self.lin(x), x)


BROKEN = [ValueBranch, ItemCall, PrintCall, MaskIndex, Several]
