"""Models the doctor must judge by what they compute, not by a flat comparison that cannot apply: random numbers drawn
in forward (diagnose.rng), state kept across calls, inputs written in place, outputs that are a Python number or
nothing at all. It must not call their numerics broken, nor call a stateful model's drift agreement."""

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.diagnose import doctor as doc
from fullgraph.diagnose.html import render_html
from fullgraph.diagnose.report import Report
from fullgraph.diagnose.rng import random_draws, seeded
from fullgraph.diagnose.summary import format_summary


class Masked(nn.Module):
    """ViTMAE's pre-training forward in small: a random half of the tokens kept (noise, argsort, gather), then a
    diffusion policy's noise added: two draws, both from the user's code."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        noise = torch.rand(x.shape[0], x.shape[1], device=x.device)  # the masking draw
        keep = noise.argsort(dim=1)[:, : x.shape[1] // 2]
        kept = torch.gather(x, 1, keep[..., None].expand(-1, -1, x.shape[2]))
        h = self.proj(kept)
        return h + 0.1 * torch.randn_like(h)  # the noise draw


class Counter(nn.Module):
    """Keeps state across calls: each call adds how many calls came before."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.fc(x) + self.calls


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_draws_are_read_with_their_lines_and_dropout_that_draws_nothing_is_not_one():
    x, model, linear = torch.randn(3, 10, 16), Masked(), nn.Linear(8, 8)  # built outside: their init draws
    draws = random_draws(lambda: model(x))
    assert sorted(d.op for d in draws) == ["aten.rand", "aten.randn_like"]
    rand = next(d for d in draws if d.op == "aten.rand")
    assert rand.where.endswith(f"test_rng.py:{_line(Masked.forward, 'the masking draw')}") and rand.count == 1
    q = torch.randn(1, 2, 5, 8)
    assert random_draws(lambda: F.scaled_dot_product_attention(q, q, q)) == []  # dropout_p=0: tagged, draws nothing
    assert random_draws(lambda: F.dropout(q, 0.5, training=False)) == []
    assert [d.op for d in random_draws(lambda: F.dropout(q, 0.5, training=True))] == ["aten.bernoulli_"]
    assert random_draws(lambda: linear(q)) == []
    before = torch.get_rng_state()
    with seeded(torch.device("cpu")):
        a = torch.rand(4)
    with seeded(torch.device("cpu")):
        assert torch.equal(torch.rand(4), a)
    assert torch.equal(torch.get_rng_state(), before)  # the user's generator is put back


@pytest.fixture(scope="module")
def masked_report():
    torch.manual_seed(0)
    return doc.doctor(Masked(), (torch.randn(4, 12, 16),), modes=["eager", "default"], reps=3, profile=False)


def test_a_model_drawing_random_numbers_is_checked_seeded_and_its_compiled_rows_drawing_as_eager(masked_report):
    r = masked_report
    rows = {c.name: c for c in r.configs}
    eager, compiled = rows["eager fp32"], rows["compile default fp32"]
    # unseeded, eager differs from itself by O(1) here; seeded it reproduces its reference exactly
    assert eager.ok and eager.rel_err == 0.0 and eager.rng == "seeded"
    # Inductor draws its own numbers: the compiled row is checked again with fallback_random, and agrees
    assert compiled.ok and compiled.rel_err < 1e-5 and compiled.rng == "seeded, fallback_random"
    assert r.recommendation is not None
    note = next(n for n in r.notes if n.startswith("the model draws random numbers"))
    assert f"aten.rand at tests/diagnose/test_rng.py:{_line(Masked.forward, 'the masking draw')}" in note
    text = format_summary(r, width=250)
    assert "(seeded)" in text and "(fallback_random)" in text and "over tolerance" not in text
    back = Report.from_json(r.to_json())
    assert [c.rng for c in back.configs] == [c.rng for c in r.configs]


def _denoise(obs):
    """A diffusion policy's sampling loop, as a function (the doctor compiles it with torch.compile)."""
    x = torch.randn(obs.shape[0], 8)
    for i in range(3):
        x = x - 0.1 * torch.tanh(x + obs * i) + 0.01 * torch.randn_like(x)
    return x


def test_a_function_drawing_random_numbers_is_checked_the_same_way():
    r = doc.doctor(_denoise, (torch.randn(4, 8),), modes=["eager", "default"], reps=3, profile=False)
    rows = {c.name: c for c in r.configs}
    assert rows["eager fp32"].rng == "seeded" and rows["eager fp32"].rel_err == 0.0
    compiled = rows["compile default fp32"]
    assert compiled.error is None and compiled.rng == "seeded, fallback_random" and compiled.ok, compiled
    assert not [n for n in r.notes if "check failed" in n]


def test_a_model_keeping_state_is_said_to_drift_and_a_plain_model_gets_no_such_note():
    torch.manual_seed(0)
    r = doc.doctor(Counter(), (torch.randn(2, 8),), modes=["eager"], reps=3, profile=False)
    note = next(n for n in r.notes if "gave another output for the same inputs" in n)
    assert "draws no random numbers" in note and "keeps state across calls" in note
    assert all(c.rng == "" for c in r.configs)
    plain = doc.doctor(nn.Linear(8, 8), (torch.randn(2, 8),), modes=["eager"], reps=3, profile=False)
    assert not [n for n in plain.notes if "random" in n or "another output" in n]
    assert all(c.rng == "" and c.check == "0.0e+00" for c in plain.configs)


class Writes(nn.Module):
    """Normalises its input in place and consumes a mask, as some preprocessing does: every call changes both."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, mask):
        x.mul_(1.5)
        out = self.fc(x) * mask.sum()
        mask.zero_()
        return out


def test_a_forward_writing_into_its_inputs_leaves_the_users_alone_and_is_checked_on_fresh_copies():
    x, mask = torch.randn(2, 8), torch.ones(2, 8)
    given = (x.clone(), mask.clone())
    r = doc.doctor(Writes(), (x,), {"mask": mask}, modes=["eager", "default"], reps=3, profile=False)
    assert torch.equal(x, given[0]) and torch.equal(mask, given[1])  # the doctor wrote into copies only
    # checked on fresh copies: every row agrees with the reference (on one reused copy, eager read rel err 2.4)
    assert [c.name for c in r.configs if not c.ok] == [] and r.recommendation is not None
    note = next(n for n in r.notes if n.startswith("forward writes into its inputs"))
    assert "args[0], mask in place" in note
    assert not [n for n in r.notes if "another output" in n]  # fresh inputs: the reference repeats itself


def test_a_float64_model_gets_rows_and_code_in_float64():
    model = nn.Linear(8, 8).double()
    r = doc.doctor(model, (torch.randn(2, 8, dtype=torch.float64),), modes=["eager"], reps=3, profile=False)
    assert [c.name for c in r.configs] == ["eager fp64"] and r.configs[0].ok
    assert r.recommendation is not None and "torch.float64" in r.recommendation.code


class ToBuffer(nn.Module):
    """Returns nothing: writes its result into a buffer, as a model feeding a preallocated output does."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("out", torch.zeros(2, 8))

    def forward(self, x):
        self.out.copy_(self.fc(x).tanh())


class ToFloat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return float(self.fc(x).square().sum())


def _nothing(x):
    torch.tanh(x)


def test_outputs_without_tensors_are_judged_by_what_they_hold_or_said_to_hold_nothing():
    x = torch.randn(2, 8)
    number = doc.doctor(ToFloat(), (x,), modes=["eager", "default"], reps=3, profile=False)
    assert all(c.ok and c.rel_err < 1e-5 for c in number.configs) and number.recommendation is not None
    assert not [n for n in number.notes if "another output" in n]  # once read as rel err inf and state
    buffer = doc.doctor(ToBuffer(), (x,), modes=["eager", "default"], reps=3, profile=False)
    assert all(c.ok and c.rel_err < 1e-5 for c in buffer.configs) and buffer.recommendation is not None
    assert any("judged by the model's 1 buffer(s)" in n for n in buffer.notes)
    none = doc.doctor(_nothing, (x,), modes=["eager", "default"], reps=3, profile=False)
    assert none.nothing_checked and none.recommendation is None
    assert all(c.rel_err is None and c.error is None for c in none.configs)
    assert "recommendation: none (the model returns nothing to check)" in format_summary(none, width=200)
    assert "none: the model returns nothing to check" in render_html(none)
    assert "none found" in render_html(dataclasses.replace(number, recommendation=None))  # rows were checked
    numerics = next(i for i in none.checklist if i.item == "Numerics checked against eager float32")
    assert numerics.status == "not-measured" and "nothing to compare" in numerics.evidence
