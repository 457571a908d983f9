import pytest
import torch

from fullgraph.diagnose import target
from fullgraph.errors import FullgraphError, UsageError


@pytest.mark.parametrize(
    ("spec", "shape", "dtype"),
    [
        ("4x3x224x224:bf16", (4, 3, 224, 224), torch.bfloat16),
        ("7", (7,), torch.float32),
        ("2x5:int64", (2, 5), torch.int64),
    ],
)
def test_input_specs(spec, shape, dtype):
    assert target.parse_input_spec(spec) == (shape, dtype)
    t = target.make_input(spec, torch.device("cpu"))
    assert t.shape == shape and t.dtype == dtype
    assert target.spec_of(t).startswith("x".join(map(str, shape)))


@pytest.mark.parametrize("bad", ["4xAx3", "", "4x3:float99", "x:fp32"])
def test_bad_specs(bad):
    with pytest.raises(UsageError, match=r"spec|dtype"):
        target.parse_input_spec(bad)


def write(tmp_path, body: str) -> str:
    path = tmp_path / "m.py"
    path.write_text("import torch\nfrom torch import nn\n" + body)
    return str(path)


def test_file_target_with_inputs(tmp_path):
    path = write(tmp_path, "def build():\n    return nn.Linear(5, 3), torch.randn(2, 5)\n")
    model, inputs = target.load_target(f"{path}:build", [], torch.device("cpu"))
    assert isinstance(model, torch.nn.Linear) and not model.training
    assert inputs[0].shape == (2, 5)
    _, inputs = target.load_target(f"{path}:build", ["4x5"], torch.device("cpu"))
    assert inputs[0].shape == (4, 5)  # --input overrides the callable's own inputs


def test_module_target():
    model, inputs = target.load_target("fullgraph.diagnose.demo:demo", [], torch.device("cpu"))
    assert type(model).__name__ == "DemoNet" and inputs[0].dim() == 4


@pytest.mark.parametrize(
    ("body", "name", "message"),
    [
        ("raise RuntimeError('boom')\n", "build", "does not import: RuntimeError: boom"),
        ("def build():\n    raise ValueError('no weights')\n", "build", "raised while building the model: ValueError"),
        ("def build():\n    return 3\n", "build", "returned int, not an nn.Module"),
        ("def build():\n    return nn.Linear(2, 2)\n", "build", "returned no example inputs; pass --input"),
        ("x = 1\n", "build", "has no callable named 'build'"),
    ],
)
def test_target_errors_are_one_line(tmp_path, body, name, message):
    path = write(tmp_path, body)
    with pytest.raises(FullgraphError) as e:
        target.load_target(f"{path}:{name}", [], torch.device("cpu"))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_file_and_missing_colon():
    with pytest.raises(FullgraphError, match="does not exist"):
        target.load_target("nowhere/model.py:build", [], torch.device("cpu"))
    with pytest.raises(UsageError, match="needs a callable"):
        target.load_target("fullgraph.diagnose.demo", [], torch.device("cpu"))
