"""Models the deploy tests build in child processes: importable by name, so a fresh interpreter can find them."""

import json
import sys

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16, out: int = 4):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Linears(nn.Module):
    """Two matrix multiplies: Inductor calls them out (no C++ kernel to build), so a CPU compile takes seconds."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


def linears() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """What fullgraph.deploy.save_cache_in_child builds: (model, example inputs)."""
    return Linears().eval(), (torch.randn(4, 8),)


class Tokens(nn.Module):
    """Token ids and token types into two tables (50 and 2 rows), as a language model's embeddings."""

    def __init__(self):
        super().__init__()
        self.words, self.types, self.out = nn.Embedding(50, 8), nn.Embedding(2, 8), nn.Linear(8, 4)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)  # through a view: still the ids
        x = self.words(flat).view(*input_ids.shape, 8) + self.types(token_type_ids)
        return self.out(x) * scale


class Gather(nn.Module):
    """Advanced indexing with an index tensor, which wraps negative indices as Python does."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 3))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[idx] * 2


def tiny_bert() -> nn.Module:
    """transformers' BertModel, one small layer (a vocabulary of 1000: the CLI draws integer inputs below it), random
    weights: its graph carries guards on Python objects' identity (ID_MATCH) that torch cannot write to a
    precompiled file (torch 2.13; on 2.11 unchecked)."""
    import transformers

    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=1000
    )
    return transformers.BertModel(config).eval()


def load_and_run(path: str, signature: str) -> None:
    """A fresh process: load the cache file, compile the same model, run it; print torch's cache counters and the
    error against eager as JSON on the last line of stdout."""
    import fullgraph.compile
    from fullgraph.deploy import load_cache

    load_cache(path, preset="dev", signature=signature)
    model, (x,) = linears()
    out = fullgraph.compile(model, "dev")(x)
    counters = torch._dynamo.utils.counters
    with torch.no_grad():
        err = (out - model(x)).abs().max().item()
    report = {"inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"]), "err": err}
    print(json.dumps(report))
    sys.stdout.flush()
