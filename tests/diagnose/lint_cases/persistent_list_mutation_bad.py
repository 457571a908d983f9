"""FG005 planted: lists that outlive the call (on the module, global, or passed in) mutated in forward."""

from torch import nn

SEEN = []


class Recorder(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.history = []
        self.queue = []

    def forward(self, x, sink: list):
        self.history.append(x.shape[0])  # expect: FG005
        self.queue.insert(0, x)  # expect: FG005
        self.history.sort()  # expect: FG005
        oldest = self.queue.pop()  # expect: FG005
        SEEN.extend([1])  # expect: FG005
        sink.append(oldest)  # expect: FG005
        self._forget(x)
        return self.proj(x)

    def _forget(self, x):
        self.queue.clear()  # expect: FG005
        self.history.remove(x.shape[0])  # expect: FG005
