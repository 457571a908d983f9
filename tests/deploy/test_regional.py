"""Regional AOT: one package for a repeated block, run by every instance with its own weights; the package holds no
weights; dynamic dims of the block's inputs; refusals for models it cannot serve."""

import os

import pytest
import torch
from torch import nn

from fullgraph.deploy import DeployError
from fullgraph.deploy.regional import export_regional, load_regional
from fullgraph.errors import UsageError
from fullgraph.models.vit import ViT, config


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, dims=(16, 16, 16)):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for d in dims)
        self.head = nn.Linear(dims[-1], 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@pytest.mark.slow
def test_every_block_runs_the_one_package_with_its_own_weights_at_any_declared_batch(tmp_path):
    model = ViT(config("vit_tiny", depth=3, img_size=32, num_classes=5)).eval()
    x = torch.randn(2, 3, 32, 32)
    path = export_regional(model, (x,), tmp_path / "block.pt2", dynamic={"x": {0: (1, 8)}})
    weights = sum(p.numel() * p.element_size() for b in model.blocks for p in b.parameters())
    assert os.path.getsize(path) < weights  # code only: the weights stay in the model
    with torch.no_grad():
        inputs = {n: torch.randn(n, 3, 32, 32) for n in (1, 2, 5)}
        expected = {n: model(v) for n, v in inputs.items()}
    run = load_regional(model, path, probe_first=False)
    assert run.paths == ("blocks.0", "blocks.1", "blocks.2")
    for n, v in inputs.items():
        torch.testing.assert_close(run(v), expected[n], rtol=1e-4, atol=1e-4)
    run.restore()  # the instances' own forward comes back
    assert all("forward" not in b.__dict__ for b in model.blocks)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs[2]), expected[2])


def test_models_it_cannot_serve_are_refused_by_name(tmp_path):
    with pytest.raises(UsageError, match="repeats no block"):
        export_regional(nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),), tmp_path / "a.pt2")

    class Widening(Stack):  # blocks of one class whose inputs differ in shape
        def forward(self, x):
            for i, b in enumerate(self.blocks):
                x = b(x if i == 0 else torch.cat([x, x], 0)[: x.shape[0] + i])
            return self.head(x)

    with pytest.raises(UsageError, match=r"sees inputs shaped unlike blocks\.0's"):
        export_regional(Widening(), (torch.randn(2, 16),), tmp_path / "b.pt2")
    with pytest.raises(UsageError, match=r"names y, not an input of Block\.forward"):
        export_regional(Stack(), (torch.randn(2, 16),), tmp_path / "c.pt2", dynamic={"y": {0: (1, 4)}})


def test_loading_checks_the_description_and_the_blocks(tmp_path):
    pkg = tmp_path / "none.pt2"
    with pytest.raises(DeployError, match="no regional description beside it"):
        load_regional(Stack(), pkg)
