"""tune: presets x dtypes first, op policies on the finalists, the budget honoured by estimate with what it left out
named, every row timed side by side, and a pick that is the fastest within tolerance or the simplest of its tie."""

import time

import pytest
import torch
from torch import nn

from fullgraph import ops
from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose import tune as tune_mod
from fullgraph.diagnose.inputs import Example
from fullgraph.diagnose.tune import _Budget, ops_in, policy_variants, tune
from fullgraph.errors import UsageError


class Normed(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc, self.norm = nn.Linear(dim, dim), ops.RMSNorm(dim)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)))


class Plain(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def test_ops_in_finds_the_ops_a_call_runs_and_only_those():
    x = Example.of((torch.randn(3, 16),))
    assert ops_in(Normed().eval(), x) == ["rms_norm"]
    assert ops_in(Plain().eval(), x) == []
    assert policy_variants([], torch.device("cpu")) == []
    variants = policy_variants(["rms_norm"], torch.device("cpu"))
    assert variants[0] == {"all": "native"}
    assert ({"all": "kernel"} in variants) == ops.custom_op.kernel_runs_on("cpu")


def test_estimates_scale_the_largest_compile_seen_by_each_modes_cost():
    clock = _Budget(80.0, time.monotonic())
    dev, edge = cfg.Candidate("dev", torch.float32), cfg.Candidate("edge", torch.float32)
    assert clock.estimate(dev) == tune_mod.FIRST_GUESS_S * tune_mod.MARGIN
    dev.compile_s = 4.0
    clock.observe(dev)
    cached = cfg.Candidate("fusion", torch.float32, compile_s=0.2)
    clock.observe(cached)  # served from Inductor's cache: says nothing about the next row
    assert clock.estimate(edge) == pytest.approx(cfg.COST["max-autotune-no-cudagraphs"] * 4.0 * tune_mod.MARGIN)
    assert not clock.fits(edge)  # 72 s estimated > 80 s less the 12 s kept for timing
    assert clock.fits(cfg.Candidate("eager", torch.float32))
    edge.compile_s = 20.0  # edge in fp32 took 20 s: edge in bf16 is estimated from it, not from the cost table
    clock.observe(edge)
    assert clock.estimate(cfg.Candidate("edge", torch.bfloat16)) == pytest.approx(20.0 * tune_mod.SEEN_MARGIN)
    assert clock.fits(cfg.Candidate("edge", torch.bfloat16))


def test_a_stage_runs_the_cheapest_estimate_first_and_of_equal_ones_the_lower_precision():
    clock = _Budget(600.0, time.monotonic())
    names = [c.name for c in tune_mod.stage_order(clock, [cfg.Candidate(p, d) for p in ("edge", "dev")
                                                          for d in (torch.float32, torch.bfloat16)])]  # fmt: skip
    assert names == ["compile dev bf16", "compile dev fp32", "compile edge bf16", "compile edge fp32"]
    cheap_first = tune_mod.stage_order(
        clock, [cfg.Candidate("edge", torch.bfloat16), cfg.Candidate("dev", torch.float32)]
    )
    assert [c.name for c in cheap_first] == ["compile dev fp32", "compile edge bf16"]  # the estimate comes first


def test_a_budget_too_small_for_any_compile_keeps_eager_and_names_what_it_left_out(monkeypatch):
    monkeypatch.setattr(tune_mod, "FIRST_GUESS_S", 1000.0)
    r = tune(Plain(), (torch.randn(4, 16),), budget=30, presets=["dev", "edge"], reps=6)
    assert [t["name"] for t in r.table] == ["eager fp32"]
    assert r.config == "eager fp32" and r.ops == {}
    assert any("compile dev fp32 (about 1500 s)" in s for s in r.skipped)
    assert any("compile edge fp32" in s for s in r.skipped)
    assert any("raise --budget" in n for n in r.notes)


def test_policies_are_tried_on_the_finalists_and_each_row_runs_under_its_own():
    before = ops.counters[("rms_norm", "compiled", "native")]
    r = tune(Normed(), (torch.randn(8, 16),), budget=120, presets=["dev"], ops=[{"all": "native"}], reps=6)
    names = [t["name"] for t in r.table]
    assert names[:2] == ["eager fp32", "compile dev fp32"]
    assert "compile dev fp32 ops=native" in names and "eager fp32 ops=native" in names
    assert ops.counters[("rms_norm", "compiled", "native")] > before  # the native row traced rms_norm as native
    ok = [t for t in r.table if t["ok"]]
    assert all(t["rel_err"] <= t["tolerance"] for t in ok) and len(ok) == len(r.table)
    fastest = min(ok, key=lambda t: t["median_ms"])
    pick = next(t for t in r.table if t["name"] == r.name)
    if pick is not fastest:  # the simplest of a tie, named in it
        assert fastest["name"] in r.tie and "tie" in r.reason
    assert r.elapsed_s <= r.budget_s
    assert any("rms_norm" in n for n in r.notes)


def test_policies_on_a_model_without_our_ops_are_skipped_with_a_note():
    r = tune(Plain(), (torch.randn(4, 16),), budget=60, presets=["dev"], ops=[{"all": "native"}], reps=6)
    assert not any("ops=" in t["name"] for t in r.table)
    assert any("op policies change nothing" in n for n in r.notes)


def test_bad_arguments_are_refused_before_anything_runs():
    with pytest.raises(UsageError, match="unknown mode or preset 'fast'"):
        tune(Plain(), (torch.randn(2, 16),), presets=["fast"])
    with pytest.raises(UsageError, match="budget=0: give a positive"):
        tune(Plain(), (torch.randn(2, 16),), budget=0)
    with pytest.raises(UsageError, match="tune compiles modules"):
        tune(torch.tanh, (torch.randn(2, 16),))
