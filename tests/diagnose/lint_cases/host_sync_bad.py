"""FG002 planted: values copied to the host inside forward."""

import torch
from torch import nn


class Scores(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        logits = self.head(x)
        top = logits.argmax(-1).tolist()  # expect: FG002
        peak = logits.max().item()  # expect: FG002
        on_host = logits.detach().cpu()  # expect: FG002
        moved = logits.to("cpu")  # expect: FG002
        count = int(logits.sum())  # expect: FG002
        ratio = float(logits.mean())  # expect: FG002
        torch.cuda.synchronize()  # expect: FG002
        probs = logits.softmax(-1).cpu().numpy()  # expect: FG002
        return logits / peak, top, on_host, moved, count, ratio, probs
