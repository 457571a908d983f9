import re

import pytest
import torch
from torch import nn

from fullgraph.diagnose import target
from fullgraph.diagnose.inputs import spec_of
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
    assert spec_of(t).startswith("x".join(map(str, shape)))


@pytest.mark.parametrize("bad", ["4xAx3", "", "4x3:float99", "x:fp32"])
def test_bad_specs(bad):
    with pytest.raises(UsageError, match=r"spec|dtype"):
        target.parse_input_spec(bad)


def test_an_integer_spec_takes_an_inclusive_value_range():
    t = target.make_input("3x500:int64:2-4", torch.device("cpu"))
    assert t.dtype == torch.int64 and t.shape == (3, 500)
    assert set(t.unique().tolist()) == {2, 3, 4}  # both ends drawn, nothing outside
    plain = target.make_input("3x500:int32", torch.device("cpu"))
    assert plain.min() >= 0 and plain.max() <= 999 and plain.max() > 900
    assert target.make_input("50:int64:7-7", torch.device("cpu")).eq(7).all()


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("2x16:int64:1", "the value range '1' does not parse; write LOW-HIGH, both included"),
        ("2x16:int64:5-2", "the value range '5-2' does not parse"),
        ("2x16:int64:-1-3", "the value range '-1-3' does not parse"),
        ("2x16:fp32:0-1", "a value range is for integer inputs; drop it for torch.float32"),
        ("2x16:bool:0-1", "a value range is for integer inputs"),
    ],
)
def test_bad_value_ranges_are_refused_by_name(bad, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        target.make_input(bad, torch.device("cpu"))


def test_an_index_out_of_range_on_drawn_integers_says_how_to_bound_them():
    table = nn.Embedding(2, 4)  # a token-type table: ids 0 and 1 only
    ex = target.inputs_from_specs(["2x16:int64"], torch.device("cpu"))
    try:
        table(*ex.args)
    except IndexError as e:
        err = target.eager_failure(e, ex)
    assert isinstance(err, FullgraphError) and str(err).startswith("the model fails in eager mode: IndexError")
    assert "integer inputs are drawn from 0-999 unless their spec gives a range" in str(err)
    floats = target.inputs_from_specs(["2x16"], torch.device("cpu"))
    assert "drawn from" not in str(target.eager_failure(IndexError("index out of range in self"), floats))
    assert "drawn from" not in str(target.eager_failure(ValueError("shapes differ"), ex))


def write(tmp_path, body: str) -> str:
    path = tmp_path / "m.py"
    path.write_text("import torch\nfrom torch import nn\n" + body)
    return str(path)


def test_file_target_with_inputs(tmp_path):
    path = write(tmp_path, "def build():\n    return nn.Linear(5, 3), torch.randn(2, 5)\n")
    model, example = target.load_target(f"{path}:build", [], torch.device("cpu"))
    assert isinstance(model, torch.nn.Linear) and not model.training
    assert example.args[0].shape == (2, 5)
    _, example = target.load_target(f"{path}:build", ["4x5"], torch.device("cpu"))
    assert example.args[0].shape == (4, 5)  # --input overrides the callable's own inputs


def test_module_target():
    model, example = target.load_target("fullgraph.diagnose.demo:demo", [], torch.device("cpu"))
    assert type(model).__name__ == "DemoNet" and example.args[0].dim() == 4


@pytest.mark.parametrize(
    ("body", "name", "message"),
    [
        ("raise RuntimeError('boom')\n", "build", "does not import: RuntimeError: boom"),
        ("def build():\n    raise ValueError('no weights')\n", "build", "raised while building the model: ValueError"),
        ("def build():\n    return 3\n", "build", "returned int, not an nn.Module or a callable"),
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


def test_structured_returns_and_keyword_specs(tmp_path):
    path = write(
        tmp_path,
        "def images():\n    return nn.Identity(), [torch.randn(3, 4, 4), torch.randn(3, 5, 5)]\n"
        "def kw():\n    return nn.Identity(), (torch.randn(2, 3),), {'scale': 0.5}\n",
    )
    _, ex = target.load_target(f"{path}:images", [], torch.device("cpu"))
    assert len(ex.args) == 1 and len(ex.args[0]) == 2  # a list of images is one argument
    _, ex = target.load_target(f"{path}:kw", [], torch.device("cpu"))
    assert ex.args[0].shape == (2, 3) and ex.kwargs == {"scale": 0.5}
    ex = target.inputs_from_specs(["2x16:int64", "attention_mask=2x16:int64"], torch.device("cpu"))
    assert ex.args[0].dtype == torch.int64 and ex.kwargs["attention_mask"].shape == (2, 16)
    with pytest.raises(UsageError, match="positional inputs come before"):
        target.inputs_from_specs(["mask=2x3", "2x3"], torch.device("cpu"))
    with pytest.raises(UsageError, match="name=spec"):
        target.inputs_from_specs(["1bad=2x3"], torch.device("cpu"))


def test_a_function_or_compiled_function_is_the_model(tmp_path):
    path = write(
        tmp_path,
        "@torch.compile\ndef process(x, threshold):\n    return x * threshold\ndef plain(x):\n    return x + 1\n",
    )
    fn, _ = target.load_target(f"{path}:process", ["3x4"], torch.device("cpu"))
    assert fn.__name__ == "process" and not hasattr(fn, "_torchdynamo_orig_callable")  # unwrapped
    fn, _ = target.load_target(f"{path}:plain", ["3x4"], torch.device("cpu"))
    assert fn(torch.zeros(1)).item() == 1


def test_a_target_file_imports_its_sibling(tmp_path):
    (tmp_path / "helper_layers.py").write_text("from torch import nn\ndef block():\n    return nn.Linear(3, 3)\n")
    path = write(tmp_path, "import helper_layers\ndef build():\n    return helper_layers.block(), torch.randn(2, 3)\n")
    model, _ = target.load_target(f"{path}:build", [], torch.device("cpu"))
    assert isinstance(model, nn.Linear)
    assert str(tmp_path) not in __import__("sys").path  # only while it imports
