"""TuneResult: a JSON round-trip that keeps every field, refusals that name the fix, and `preset="auto"` reading
its compile settings from the object, its dict or its file."""

import json

import pytest
import torch
from torch import nn

import fullgraph
from fullgraph.compile.choice import read_choice
from fullgraph.compile.tuned import TuneResult, as_tune_result, ops_text
from fullgraph.errors import UsageError


def _result(**changes) -> TuneResult:
    fields = dict(config="compile fusion bf16", ops={"all": "native"}, speedup=1.7, baseline="eager fp32",
                  reason="the fastest", tie=("compile dev bf16",), table=({"name": "eager fp32", "median_ms": 2.0},),
                  skipped=("compile edge bf16 (about 90 s)",), notes=("n",), target="m.py:build", device="cpu",
                  inputs=("2x8:float32",), environment={"torch": torch.__version__}, budget_s=60.0,
                  elapsed_s=12.5)  # fmt: skip
    fields.update(changes)
    return TuneResult(**fields)


def test_the_json_file_gives_back_the_same_result(tmp_path):
    r = _result()
    path = r.save(tmp_path / "tuned.json")
    assert TuneResult.load(path) == r
    with open(path) as f:
        assert json.load(f)["format"] == "fullgraph-tune/1"
    assert r.name == "compile fusion bf16 ops=native"


def test_ops_text_names_a_single_all_by_its_policy_and_the_rest_by_op():
    assert ops_text({"all": "kernel"}) == "kernel"
    assert ops_text({"rope": "native", "attention": "kernel"}) == "attention=kernel,rope=native"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ("{not json", "is not a JSON tune result"),
        ("[1, 2]", "holds a JSON list"),
        ('{"config": "eager fp32"}', "is not a fullgraph tune result"),
        ('{"format": "fullgraph-tune/1", "config": "eager fp32", "colour": 1}', "unknown fields ['colour']"),
    ],
)
def test_a_file_that_is_not_a_tune_result_is_refused_by_name(tmp_path, content, expected):
    path = tmp_path / "tuned.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        TuneResult.load(path)


def test_op_policies_outside_the_vocabulary_are_refused():
    with pytest.raises(UsageError, match="not 'native', 'kernel' or 'auto'"):
        _result(ops={"rms_norm": "fast"})


@pytest.mark.parametrize("form", ["object", "dict", "path"])
def test_preset_auto_reads_the_compile_settings_of_each_form(tmp_path, form):
    r = _result(config="compile planning bf16")
    choice = {"object": r, "dict": r.to_dict(), "path": str(r.save(tmp_path / "t.json"))}[form]
    assert as_tune_result(choice) == r
    picked = read_choice(choice)
    assert (picked.preset, picked.dtype, picked.eager) == ("planning", torch.bfloat16, False)
    cm = fullgraph.compile(nn.Linear(4, 4), "auto", choice=choice)
    assert "preset='auto: compile planning bf16'" in cm.describe()
    assert cm(torch.randn(3, 4)).dtype == torch.bfloat16


def test_an_eager_pick_runs_the_model_uncompiled():
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    cm = fullgraph.compile(model, "auto", choice=_result(config="eager fp32", ops={}))
    torch.testing.assert_close(cm(x), model(x))
    assert cm.stats.frames_compiled == 0


def test_around_enters_its_context_on_every_call_and_warmup_only():
    entered = []

    class Ctx:
        def __enter__(self):
            entered.append("in")

        def __exit__(self, *exc):
            entered.append("out")

    cm = fullgraph.compile(nn.Linear(4, 4), around=Ctx)
    cm.warmup(torch.randn(2, 4))
    cm(torch.randn(2, 4))
    assert entered == ["in", "out", "in", "out"]
    with pytest.raises(UsageError, match="around=3: give a callable"):
        fullgraph.compile(nn.Linear(4, 4), around=3)
