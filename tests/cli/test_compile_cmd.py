"""`fullgraph compile`: bad input is one line and exit 2 before anything compiles; a good run prints the stats, the
speed, the error and the code that reproduces it."""

import ast
import re
import textwrap

import pytest
from torch._dynamo.utils import counters

from fullgraph.cli.main import main

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(3))
            self.head = nn.Linear(32, 8)

        def forward(self, x):
            for b in self.blocks:
                x = x + b(x)
            return self.head(x)


    def net():
        torch.manual_seed(0)
        return Net(), (torch.randn(5, 32),)
    """
)


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MODEL)
    return f"{path}:net"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--plan", '{"blokcs": "perception"}'], "'blokcs'"),
        (["--dynamic", '{"x": {"0": [8, 2]}}'], "min 8 > max 2"),
        (["--dynamic", '{"x": {"0": [1, 8]'], "--dynamic: not JSON"),
        (["--buckets", ""], "non-empty"),
        (["--buckets", "8,2,4"], "not sorted"),
        (["--backend", "tensorrt"], "torch-tensorrt"),
        (["--backend", "onnxrt"], "onnxrt"),
        (["--option", "freeze=True"], "freezing"),
        (["--option", "freezing"], "KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_compiles(target, capsys, flags, expected):
    before = counters["frames"]["total"]
    assert main(["compile", target, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    last = err[-1]
    assert last.startswith("fullgraph compile: error:") and expected in last, err
    assert not any("Traceback" in line for line in err)
    assert counters["frames"]["total"] == before  # Dynamo was never asked to compile a frame


def test_a_plan_error_lists_the_valid_paths(target, capsys):
    assert main(["compile", target, "--plan", '{"blokcs": "perception"}']) == 2
    assert "blocks" in capsys.readouterr().err


@pytest.mark.slow
def test_buckets_compile_once_per_bucket_used_and_print_the_reproducing_code(target, capsys):
    assert main(["compile", target, "--buckets", "1,2,4,8", "--stream", "12", "--reps", "3"]) == 0
    out = capsys.readouterr().out
    used, graphs = re.search(r"used buckets \[([\d, ]+)\]: (\d+) graphs", out).groups()
    assert int(graphs) == len(used.split(","))  # static shapes per bucket: one graph each, none per size
    err = float(re.search(r"error against eager fp32: (\S+)", out).group(1))
    assert err < 1e-5
    assert re.search(r"eager [\d.]+ ms, compiled [\d.]+ ms: [\d.]+x", out)
    code = out[out.index("model = fullgraph.compile(") :]
    ast.parse(code)  # valid Python, as printed
    assert 'fullgraph.compile(model, "dev", dynamic=False)' in code and "buckets=(1, 2, 4, 8)" in code
