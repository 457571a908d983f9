"""Helpers the suites share (fullgraph.bench.suites)."""

from types import SimpleNamespace

import pytest

from fullgraph.bench.breakdown import KernelTime
from fullgraph.bench.suites import TOP_KERNELS, top_kernel_lines


def test_top_kernel_lines_list_the_slowest_kernels_with_their_source_capped():
    top = [KernelTime(f"kernel_{i}", "gemm" if i % 2 else "elementwise", 1.0 / (i + 1), i + 1,
                      "aten::addmm" if i % 2 else "") for i in range(TOP_KERNELS + 3)]  # fmt: skip
    lines = top_kernel_lines(SimpleNamespace(top=top), indent="  ")
    assert len(lines) == TOP_KERNELS
    assert lines[0] == "  elementwise 1.0000 x1 kernel_0"
    assert lines[1] == "  gemm 0.5000 x2 kernel_1 (aten::addmm)"
    long = KernelTime("n" * 80, "gemm", 0.25, 3, "s" * 60)
    (line,) = top_kernel_lines(SimpleNamespace(top=[long]))
    assert line == "      gemm 0.2500 x3 " + "n" * 56 + " (" + "s" * 40 + ")"


def test_a_twin_variants_policy_holds_around_its_timed_calls_without_a_context_per_call(monkeypatch):
    import contextlib

    import torch

    from fullgraph import ops
    from fullgraph.bench import suites

    seen, entered = [], []
    real = suites.policy_context

    def counting(spec):
        entered.append(spec)
        return real(spec)

    monkeypatch.setattr(suites, "policy_context", counting)

    def call(fn, pol):
        with suites.policy_context(pol) if pol else contextlib.nullcontext():
            return fn()

    def model(name):
        def fn():
            seen.append((name, ops.policies.snapshot().get("ctx:all")))
            return torch.ones(3)

        return fn

    variants = {"plain, compiled": (model("plain"), None), "ours native, compiled": (model("ours"), "all=native")}
    rows, _, live = suites.time_interleaved("dit", "p", {}, variants, call, torch.ones(3), torch.device("cpu"),
                                            reps=4, rounds=2)  # fmt: skip
    assert live == set(variants) and {r.variant for r in rows} == set(variants)
    timed = seen[2:]  # after the two first calls
    assert {p for n, p in timed if n == "ours"} == {"native"} and {p for n, p in timed if n == "plain"} == {None}
    assert entered.count("all=native") == 1 + 2  # the first call, then once per round: not once per timed call
    # every round's median is a row of its own, and the table's speed column pairs the rounds
    rounds = {r.metric for r in rows if r.variant == "ours native, compiled" and r.metric.startswith("round_ms_")}
    assert rounds == {"round_ms_00", "round_ms_01"}
    by = {(r.variant, r.metric): r.value for r in rows}
    pairs = [by[("plain, compiled", m)] / by[("ours native, compiled", m)] for m in sorted(rounds)]
    assert by[("ours native, compiled", "paired_speed")] == pytest.approx(sum(pairs) / 2)
