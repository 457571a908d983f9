"""lint_scope.py: lint_target lints a model's own classes (or a function's own code) at their real file:line, and
nothing else in their files; small transformers models lint to what Dynamo shows for them."""

import importlib.util
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers

from fullgraph.diagnose.lint_scope import lint_target
from tests.diagnose import models

TWO_MODELS = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.history = []
            self.inner = Inner()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, scale=1.0):
            self.history.append(x)
            return self.inner(self.lin(x) * scale, 2.0)


    class Inner(nn.Module):
        def forward(self, x, gain=1.0):  # called by First's code: its arguments are First's business
            return helper(x) * gain


    class Second(nn.Module):
        def forward(self, x):
            print(x)
            return x.item()


    class Sub(First):
        pass


    def helper(x):
        return x[x > 0].sum()


    def unrelated(x):
        return x.nonzero()


    @torch.compile
    def step(x, lr=0.1):
        return x - lr * x.grad
    """
)


def import_file(tmp_path, monkeypatch, name: str, text: str):
    """`text` imported from a file, as a user's model file is."""
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def two(tmp_path, monkeypatch):
    return import_file(tmp_path, monkeypatch, "two_models", TWO_MODELS)


def line_of(code: str) -> int:
    [line] = [i for i, text in enumerate(TWO_MODELS.splitlines(), 1) if code in text]
    return line


def found(target) -> list[tuple[int, str]]:
    """(line, rule) of each finding, all of them in the file of TWO_MODELS."""
    findings, notes = lint_target(target)
    assert notes == [] and {f.path for f in findings} <= {sys.modules["two_models"].__file__}
    return [(f.line, f.rule) for f in findings]


FIRST = [
    (line_of("def forward(self, x, scale=1.0)"), "FG010"),
    (line_of("self.history.append(x)"), "FG005"),
    (line_of("return x[x > 0].sum()"), "FG008"),  # helper, called by the submodule Inner
]


def test_a_model_is_linted_alone_not_with_the_rest_of_its_file(two):
    assert found(two.First()) == FIRST
    assert found(two.Second()) == [(line_of("print(x)"), "FG004"), (line_of("return x.item()"), "FG002")]


def test_an_inherited_forward_and_a_compiled_model_lint_the_same(two):
    assert found(two.Sub()) == FIRST
    assert found(torch.compile(two.First())) == FIRST


def test_submodules_are_included_and_torch_classes_skipped(two):
    model = torch.nn.Sequential(two.Second(), torch.nn.ReLU())  # the root's forward is torch's
    assert found(model) == [(line_of("print(x)"), "FG004"), (line_of("return x.item()"), "FG002")]


def test_function_targets_plain_bound_and_compiled(two):
    assert found(two.helper) == [(line_of("return x[x > 0].sum()"), "FG008")]
    assert found(torch.compile(two.unrelated)) == [(line_of("return x.nonzero()"), "FG008")]
    assert found(two.step) == [(line_of("def step(x, lr=0.1)"), "FG010")]  # decorated with @torch.compile
    assert found(two.First().forward) == FIRST[:2]  # the method and what it calls in its class, not submodules


def test_unreadable_source_is_a_note_and_the_rest_is_still_linted(two):
    scope: dict = {"__name__": "made_by_exec"}
    exec("import torch\nclass Gone(torch.nn.Module):\n    def forward(self, x):\n        return x.item()\n", scope)
    model = torch.nn.Sequential(two.First(), scope["Gone"]())
    findings, notes = lint_target(model)
    assert [(f.line, f.rule) for f in findings] == [(line, rule) for line, rule in FIRST if rule != "FG010"]
    [note] = notes
    assert note.startswith("lint: made_by_exec.Gone: source not readable (")
    with pytest.raises(TypeError, match=r"nn\.Module or a function"):
        lint_target(3)


def test_a_class_defined_in_both_branches_of_an_if_is_the_one_that_ran(tmp_path, monkeypatch):
    """transformers' xLSTM does this (an external library's block, else its own); inspect names the first."""
    text = (
        "from torch import nn\n\nEXTERNAL = False\nif EXTERNAL:\n\n    class Block(nn.Module):\n"
        "        def forward(self, x):\n            print(x)\n\nelse:\n\n    class Block(nn.Module):\n"
        "        def forward(self, x):\n            return x.item()\n"
    )
    module = import_file(tmp_path, monkeypatch, "either", text)
    findings, notes = lint_target(module.Block())
    assert [(f.line, f.rule) for f in findings] == [(14, "FG002")] and notes == []


@pytest.mark.parametrize("model", [*models.BROKEN, models.Clean], ids=lambda c: c.__name__)
def test_the_doctor_test_models_are_found_where_their_comments_say(model):
    """Each `# break` comment in the classes the model is built from, and nothing from the file's other classes."""
    instance = model()
    marked = set()
    for cls in {type(m) for m in instance.modules()} - {torch.nn.Linear}:
        lines, start = inspect.getsourcelines(cls)
        marked |= {start + i for i, text in enumerate(lines) if re.search(r"#\s*break\b", text)}
    findings, notes = lint_target(instance)
    assert notes == [] and {f.path for f in findings} <= {models.__file__}
    assert {f.line for f in findings} == marked


TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.mark.parametrize(
    "build",
    [
        lambda: transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=100, **TINY)),
        lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100)),
        lambda: transformers.ViTForImageClassification(transformers.ViTConfig(image_size=32, patch_size=8, **TINY)),
    ],
    ids=["bert", "gpt2", "vit"],
)
def test_transformers_models_that_compile_as_one_graph_have_no_findings(build):
    """torch._dynamo.explain: one graph, no break, for each (torch 2.13, transformers 5.24). Linting their whole files
    reported use_cache/logits_to_keep flags (FG010), kwargs.pop (FG005) and the loss's set-once problem_type (FG009)."""
    with torch.device("meta"):
        model = build().eval()
    assert lint_target(model) == ([], [])


def test_mixtral_eager_experts_are_found_where_dynamo_breaks():
    """The experts' eager loop (transformers' `eager` experts implementation) picks tokens with nonzero and
    torch.where(mask): explain shows the graph breaking at the nonzero, 10 breaks in a 2-layer model."""
    config = transformers.MixtralConfig(
        vocab_size=100, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **TINY
    )
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(config).eval()
    findings, notes = lint_target(model)
    assert notes == [] and {f.rule for f in findings} == {"FG008"}
    for f in findings:
        assert f.path.endswith("modeling_mixtral.py")
        text = Path(f.path).read_text().splitlines()[f.line - 1]
        assert "nonzero" in text or "torch.where(" in text
