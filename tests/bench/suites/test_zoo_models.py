import importlib

import pytest
import torch

from fullgraph.bench.suites import zoo_models
from fullgraph.bench.suites.zoo_models import MODELS, SMALL, import_library, primary_output


def test_the_catalog_holds_the_issues_models():
    libraries = [e.library for e in MODELS]
    assert libraries.count("timm") >= 6 and libraries.count("transformers") >= 3
    assert libraries.count("torchvision") >= 2
    for e in MODELS:  # a small batch (1-4) and a large one
        assert len(e.batches) == 2 and 1 <= e.batches[0] <= 4 < e.batches[1], e.name
    for e in (*MODELS, *SMALL):
        assert e.name.startswith(f"{e.library or 'small'}/") and len(e.batches) == 2
    assert len({e.name for e in MODELS}) == len(MODELS)


def test_import_library_says_why_a_library_cannot_be_used(monkeypatch):
    assert import_library("") == (None, "")
    assert import_library("fullgraph_zoo_missing_package") == (None, "fullgraph_zoo_missing_package is not installed")
    module, why = import_library("json")
    assert module is importlib.import_module("json") and why == ""

    def broken(name):  # torchvision built for another torch: installed, and its import fails
        raise OSError("libtorchvision.so: undefined symbol")

    monkeypatch.setattr(zoo_models.importlib, "import_module", broken)
    assert import_library("torchvision") == (None, "torchvision does not import: OSError: libtorchvision.so: "
                                                   "undefined symbol")  # fmt: skip


def test_primary_output_is_the_tensor_a_model_is_judged_by():
    t = torch.randn(2, 3)
    assert primary_output(t) is t
    assert primary_output({"last_hidden_state": t, "pooler_output": torch.randn(2)}) is t
    assert primary_output((t, torch.randn(1))) is t
    assert primary_output([{"logits": t}]) is t
    with pytest.raises(TypeError, match="of type str"):
        primary_output("text")


def test_text_inputs_are_keyword_tensors_with_padding_in_every_other_sequence():
    args, kwargs = zoo_models.text_input(1000, token_types=True)(3)
    assert args == () and set(kwargs) == {"input_ids", "attention_mask", "token_type_ids"}
    mask = kwargs["attention_mask"]
    assert mask.shape == (3, zoo_models.TOKENS) and mask.dtype == torch.long
    assert mask[0].all() and mask[2].all() and mask[1].sum() == zoo_models.TOKENS - zoo_models.PADDED
    assert kwargs["input_ids"].min() >= 0 and kwargs["input_ids"].max() < 1000


@pytest.mark.slow
@pytest.mark.parametrize("entry", MODELS + SMALL, ids=lambda e: e.name)
def test_each_model_builds_and_runs_eagerly_as_the_suite_calls_it(entry):
    """What the GPU run will do first, on the CPU at batch 2: build with random weights, draw inputs, call."""
    library, why = import_library(entry.library)
    if why:
        pytest.skip(why)
    torch.manual_seed(0)
    model = entry.build(library).eval()
    args, kwargs = entry.inputs(2)
    with torch.no_grad():
        out = primary_output(model(*args, **kwargs))
    assert out.shape[0] == 2 and out.is_floating_point() and torch.isfinite(out).all()


def test_a_classifier_started_at_zero_is_drawn_again_in_every_copy_the_suite_times():
    # torchvision's ViT-B/16 zeroes its head when built without weights: every output 0, every error 0/0 (NaN)
    from torch import nn

    from fullgraph.bench.suites import zoo

    def build(_):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))
        nn.init.zeros_(model[2].weight)
        nn.init.zeros_(model[2].bias)
        return model

    kept = build(None)[0].weight.clone()
    entry = zoo_models.Entry("small/zero_head", "", build, lambda b: ((torch.randn(b, 8),), {}), (2,))
    models = zoo._build(entry, None, torch.device("cpu"), torch.float32)
    heads = [m[2].weight for m in models.values()]
    assert all(h.abs().sum() > 0 for h in heads) and all(torch.equal(h, heads[0]) for h in heads)
    assert torch.equal(models["reference"][0].weight, kept)  # a layer that was not all zero keeps its weights
    x = torch.randn(5, 8)
    expected = models["reference"](x)
    assert expected.norm() > 0 and zoo._rel_err(models["plain"](x), expected) == 0.0  # judged, not 0/0
    assert zoo_models.redraw_zero_weights(build(None)) == 1 and zoo_models.redraw_zero_weights(models["plain"]) == 0
