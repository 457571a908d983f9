"""gelu_formula (issue 33): a GELU written out as arithmetic becomes F.gelu, found by what it computes; and
gelu_epilogue over transformers' Conv1D (`addmm(bias, x, w).view(...)`, GPT-2's MLP). On the CPU, forced, against a
float64 eager reference."""

import copy
import math

import pytest
import torch
from torch import nn

import fullgraph
from tests.rewrite.test_rewrites import reference, run

FORMS = {
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0)))),
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "erf": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "erf_methods": lambda x: x.mul(0.5).mul(x.div(math.sqrt(2.0)).erf().add(1.0)),
}


class Written(nn.Module):
    def __init__(self, form, conv1d=False):
        super().__init__()
        self.form, self.conv1d = FORMS[form], conv1d
        self.fc = nn.Linear(8, 16)
        self.weight = nn.Parameter(torch.randn(8, 16) * 0.3)  # Conv1D's [in, out]
        self.bias = nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        if self.conv1d:  # transformers' Conv1D, as GPT-2's MLP calls it
            h = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(x.size()[:-1] + (16,))  # noqa: RUF005
        else:
            h = self.fc(x)
        return self.form(h)


@pytest.mark.parametrize("form", list(FORMS))
def test_a_written_gelu_becomes_f_gelu_and_keeps_its_values(form):
    torch.manual_seed(0)
    model, x = Written(form).eval(), torch.randn(3, 5, 8)
    out, cm = run(model, x, rewrites=["gelu_formula"])
    (applied,) = cm.stats.rewrites
    assert applied.rewrite == "gelu_formula"
    assert ("tanh GELU" if "gelu" in form else "exact (erf) GELU") in applied.detail
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_an_exact_written_gelu_after_conv1d_takes_the_cpus_epilogue():
    """The CPU's epilogue computes the exact GELU: a written erf GELU after a Conv1D becomes one fused GEMM."""
    torch.manual_seed(1)
    model, x = Written("erf", conv1d=True).eval(), torch.randn(3, 5, 8)
    out, cm = run(model, x, rewrites=["gelu_formula", "gelu_epilogue"])
    assert cm.stats.rewrite_counts() == {"gelu_formula": 1, "gelu_epilogue": 1}
    assert next(a.detail for a in cm.stats.rewrites if a.rewrite == "gelu_epilogue") == "linear 8 -> 16 + GELU (erf)"
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    # a tanh one is not the CPU epilogue's GELU: the formula becomes F.gelu, the GEMM stays, with the reason
    tanh = Written("gelu_new", conv1d=True).eval()
    _, cm = run(tanh, x, rewrites=["gelu_formula", "gelu_epilogue"])
    assert cm.stats.rewrite_counts() == {"gelu_formula": 1}
    assert [s.reason for s in cm.stats.rewrites_skipped] == [
        "the tanh GELU, where the epilogue on cpu computes the exact (erf) one"
    ]


class NotGelu(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.fc = kind, nn.Linear(8, 8)

    def forward(self, x, y):
        h = self.fc(x)
        if self.kind == "quick":  # QuickGELU: another function
            return h * torch.sigmoid(1.702 * h)
        if self.kind == "two tensors":
            return 0.5 * h * (1.0 + torch.tanh(y))
        inner = torch.tanh(0.7978845608028654 * (h + 0.044715 * h**3))  # used twice: a GELU and something else
        return 0.5 * h * (1.0 + inner), inner


@pytest.mark.parametrize("kind", ["quick", "two tensors", "inner used elsewhere"])
def test_what_is_not_a_gelu_of_one_tensor_is_left_as_it_is(kind):
    torch.manual_seed(2)
    model = NotGelu(kind).eval()
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch._dynamo.reset()
    cm = fullgraph.compile(copy.deepcopy(model), "dev", rewrites=["gelu_formula"])
    with torch.no_grad():
        out, want = cm(x, y), model(x, y)
    assert cm.stats.rewrites == ()
    torch.testing.assert_close(out, want)


@pytest.mark.slow
def test_gpt2s_written_gelus_become_f_gelu_with_gpt2s_values():
    """Code we did not write: transformers' GPT-2 (gelu_new, Conv1D), tiny config, keyword inputs with padding."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(3)
    model = tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, -4:] = 0
    inputs = {"input_ids": torch.randint(0, 100, (2, 12)), "attention_mask": mask}
    torch._dynamo.reset()
    cm = fullgraph.compile(copy.deepcopy(model), "dev", rewrites=["gelu_formula", "gelu_epilogue"])
    with torch.no_grad():
        out = cm(**inputs).last_hidden_state
        ref = copy.deepcopy(model).double()(**inputs).last_hidden_state
    assert cm.stats.rewrite_counts() == {"gelu_formula": 2}  # one per layer; the CPU epilogue's GELU is not tanh
    assert {s.rewrite for s in cm.stats.rewrites_skipped} == {"gelu_epilogue"}
    assert cm.stats.graph_breaks == 0
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


@pytest.mark.gpu
def test_on_cuda_auto_puts_a_written_tanh_gelu_after_conv1d_in_cublaslts_epilogue():
    torch.manual_seed(4)
    model = Written("gelu_new", conv1d=True).eval().cuda()
    x = torch.randn(3, 5, 8, device="cuda")
    ref = reference(model, x)
    out, cm = run(model.to(torch.bfloat16), x.to(torch.bfloat16))
    assert cm.stats.rewrite_counts() == {"gelu_formula": 1, "gelu_epilogue": 1}
    assert (out.double() - ref).norm().item() < 2e-2 * ref.norm().item()
