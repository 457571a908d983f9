"""Two models whose forwards run through one code object, as transformers' decorators make every decorated forward
run one `wrapper`: Dynamo keeps its cache entries per code object, so the second model's first compile is filed as a
recompile (the first model's entry failed its guards)."""

import torch
from torch import nn


def through_one_wrapper(fn):
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return wrapper


class WrappedA(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    @through_one_wrapper
    def forward(self, x):
        return self.fc(x)


class WrappedB(WrappedA):
    @through_one_wrapper
    def forward(self, x):
        return torch.relu(self.fc(x)) * 2
