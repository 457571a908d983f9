import os
import subprocess
import sys
import time

import pytest
import torch

from fullgraph.bench.breakdown import profile_breakdown
from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose import doctor as doc
from fullgraph.diagnose.configs import NOISY_P80_P20
from fullgraph.diagnose.demo import demo
from fullgraph.diagnose.report import Report
from fullgraph.diagnose.summary import format_summary
from fullgraph.errors import UsageError
from fullgraph.timing import busy_cores
from tests.diagnose import models

STATUS_DYNAMIC = "Dynamic shapes handled (fixed, bucketed or declared dynamic)"


@pytest.fixture(scope="module")
def demo_report():
    model, inputs = demo()
    return doc.doctor(model, inputs, vary=["batch"], reps=5)


def test_demo_report_finds_breaks_recompiles_and_recommends(demo_report):
    r = demo_report
    assert r.graph_break_count == 2 and len(r.graph_breaks) == 2
    assert {b.source.split("#")[0].strip() for b in r.graph_breaks} == {
        "if h.mean() > 0:",
        "scale = h.abs().amax().item()",
    }
    assert r.recompiles and {c.trigger for c in r.recompiles} == {"batch"}
    assert len(r.recompiles) == 1 and r.recompiles[0].count >= 2  # one cause, folded over the graph fragments
    assert r.recompiles[0].function == "forward"
    assert [c.name for c in r.configs] == ["eager fp32", "compile default fp32"]
    assert all(c.ok and c.median_ms > 0 and c.rounds >= 5 for c in r.configs)
    assert r.configs[1].compile_s > 0 and r.configs[0].compile_s is None
    assert r.timing["threads"] >= 1 and "thread" in r.timing["threads_why"]
    status = {c.item: c.status for c in r.checklist}
    assert status["Graph breaks analysed and removed"] == "fail"
    # the first new batch size recompiles (automatic dynamic), the second does not: handled
    assert status[STATUS_DYNAMIC] == "pass"
    assert status["CUDA graphs run without skips"] == "not-measured"


def test_report_json_round_trip(demo_report):
    assert Report.from_json(demo_report.to_json()) == demo_report


def test_clean_model_gets_no_advice_to_remove_breaks():
    r = doc.doctor(models.Clean(), (torch.randn(4, 16),), modes=["eager"], vary=["batch"], reps=3)
    assert r.graph_break_count == 0 and r.graph_breaks == []
    status = {c.item: c.status for c in r.checklist}
    assert status["Graph breaks analysed and removed"] == "pass"
    assert status["Compile mode chosen by measurement"] == "not-measured"  # only eager ran: nothing was chosen
    assert status["Compile time weighed against the speed-up"] == "not-measured"
    assert "graph break" not in r.recommendation.code


def test_keyword_inputs_and_python_values():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, *, scale: float, mask=None):
            y = self.lin(x) * scale
            return y if mask is None else y.masked_fill(~mask, 0.0)

    x, mask = torch.randn(3, 8), torch.rand(3, 8) > 0.5
    r = doc.doctor(Scaled(), (x,), {"scale": 0.5, "mask": mask}, modes=["eager", "default"], reps=3, profile=False)
    assert r.inputs == ["3x8:float32", "scale=0.5", "mask=3x8:bool"]
    assert all(c.ok for c in r.configs) and r.graph_break_count == 0


def test_a_compiled_function_with_a_float_is_examined_as_the_function():
    lin = torch.nn.Linear(6, 6)

    @torch.compile
    def process(x, threshold):
        scores = lin(x)
        if scores.max() > threshold:  # a break: a condition on a value
            x = x * 2
        return x

    # a threshold below every score: the branch is taken, so the code after the break holds a graph of its own (with
    # 0.5, an input whose scores all stayed under it left that part without a tensor op: 1 graph, 0 breaks as
    # explain counts them; FULLGRAPH_TEST_SEED=913076571 failed so in CI)
    x = torch.randn(5, 6)
    r = doc.doctor(process, (x, -100.0), modes=["eager", "default"], reps=3, profile=False)
    expected = torch._dynamo.explain(process._torchdynamo_orig_callable)(x, -100.0).graph_break_count
    assert r.graph_break_count == expected == 1
    assert r.graph_breaks[0].line > 0 and r.graph_breaks[0].fix
    assert any("function" in n for n in r.notes)


class Quantize(torch.nn.Module):
    """Integer outputs (codes, as token ids or labels are): bf16's coarser inputs change some of them."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        return (self.lin(x) * 100).round().long()


def test_integer_outputs_are_judged_by_the_share_that_match_not_an_infinite_error():
    r = doc.doctor(Quantize(), (torch.randn(8, 64),), modes=["eager"], dtypes=[torch.float32, torch.bfloat16],
                   reps=3, profile=False)  # fmt: skip
    by = {c.name: c for c in r.configs}
    fp32, bf16 = by["eager fp32"], by["eager bf16"]
    assert fp32.matched == 1.0 and fp32.ok and fp32.check == "100.0% matched"
    assert 0.0 < bf16.matched < 1.0 and not bf16.ok and bf16.matched_min == 1.0  # some codes moved, most did not
    assert bf16.check == f"{bf16.matched:.1%} matched" and bf16.outcome.endswith("matched, over tolerance")
    text = format_summary(r)
    assert f"{bf16.matched:.1%} matched" in text and " inf" not in text
    assert Report.from_json(r.to_json()).configs[1].matched == bf16.matched  # the JSON keeps it


def test_budget_skips_the_slowest_and_says_so():
    r = doc.doctor(models.Clean(), (torch.randn(4, 16),), modes=["eager", "default"], budget=1.0, reps=3)
    assert any("--budget" in n for n in r.notes)
    assert [c.name for c in r.configs if c.median_ms] == ["eager fp32"]  # the baseline always runs
    assert "compile default fp32" in next(n for n in r.notes if "--budget" in n)
    assert r.breakdowns or any("where the time goes" in n for n in r.notes)  # profiled, or said why not
    spent = doc.doctor(models.Clean(), (torch.randn(4, 16),), modes=["eager"], budget=1e-3, reps=3)
    assert spent.breakdowns == [] and any("ran out before where the time goes" in n for n in spent.notes)
    # the timing stopped at the budget too: the one round every row gets, and a note that says so
    assert [c.rounds for c in spent.configs] == [1] and spent.timing["rounds"] == 1
    assert any(f"ran out while timing: 1 of {cfg.ROUNDS} interleaved rounds" in n for n in spent.notes)


class Slow(torch.nn.Module):
    """`seconds` a call."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin, self.seconds = torch.nn.Linear(8, 8), seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.lin(x)


def test_profiling_that_would_outlast_the_budget_is_not_started():
    # 0.5 s a call: under a budget the profile is one warm-up and one profiled call at twice its time (1.5 s), more
    # than the timing leaves of a 4 s budget.
    r = doc.doctor(Slow(0.5), (torch.randn(2, 8),), modes=["eager"], budget=4.0, reps=15)
    assert r.breakdowns == []
    assert any("ran out before where the time goes (profiling, about 2 s)" in n for n in r.notes), r.notes
    assert [c.name for c in r.configs if c.median_ms] == ["eager fp32"]


def test_under_a_budget_one_call_is_profiled_and_said():
    r = doc.doctor(Slow(0.05), (torch.randn(2, 8),), modes=["eager"], budget=8.0, reps=5)
    (bd,) = r.breakdowns
    assert bd.calls == doc.PROFILE_BUDGETED[1] == 1
    assert any("the breakdown profiled 1 call (a run without --budget profiles 5)" in n for n in r.notes), r.notes
    unbudgeted = doc.doctor(Slow(0.0), (torch.randn(2, 8),), modes=["eager"], reps=5)
    assert [b.calls for b in unbudgeted.breakdowns] == [doc.PROFILE_FULL[1]]


def test_profile_cost_counts_the_calls_profile_breakdown_makes():
    made = []
    counts = (2, 3, 7)
    profile_breakdown(lambda: made.append(1), device="cpu", label="x", ceilings={}, calls=3, warmup=2, timing_reps=7)
    assert len(made) == counts[0] + counts[1]  # on the CPU: the warm-up and the profiled calls, no CUDA timing
    assert doc.profile_cost(0.5, counts, gpu=False) == 0.5 * (2 + 2 * 3)
    assert doc.profile_cost(0.5, counts, gpu=True) == 0.5 * (2 + 2 * 3 + 7 + 1)  # measure's warm-up and reps


def test_a_breakdown_not_started_when_the_one_before_outlasts_the_time_left():
    rows = [cfg.Candidate("eager", torch.float32), cfg.Candidate("default", torch.float32)]
    for c in rows:
        c.fn = lambda: time.sleep(0.2)
    notes: list[str] = []
    out = doc._profile(rows, None, torch.device("cpu"), notes, (1, 1, 1), time.monotonic() + 0.5)
    assert [b.label for b in out] == ["eager fp32"]  # ~0.4 s, and 0.1 s left: the next would run past
    assert notes and notes[0].startswith("the budget ran out before the breakdown of compile default fp32")


BUSY = "import time\nt = time.time() + {s}\nwhile time.time() < t:\n    pass\n"


def unloaded_doctor(model, inputs, attempts: int = 3):
    """The doctor's report from a run during which no other process held a core (sampled before and after it)
    and no row came out noisy. A quiet run can still meet a stall between the samples (the CI VM's neighbours:
    one such run marked eager noisy on all three of its measures), so a noisy quiet run is tried again; the test
    fails when every quiet run is noisy (the threshold is then too tight for an idle machine), and is skipped, not
    passed, when a shared machine never gets quiet enough to run its unloaded half."""
    noisy_runs = []
    for _ in range(attempts):
        if busy_cores() == 0:
            report = doc.doctor(model, inputs, reps=20, profile=False)
            if busy_cores() == 0:
                noisy = [c.name for c in report.configs if c.noisy]
                if not noisy:
                    return report
                noisy_runs.append(noisy)
        time.sleep(5)
    assert not noisy_runs or len(noisy_runs) < attempts, f"unloaded, every run marked rows noisy: {noisy_runs}"
    pytest.skip(
        f"another process kept a core busy: the unloaded half cannot run on this machine now ({len(noisy_runs)}"
        " quiet runs were noisy)"
    )


@pytest.mark.slow
@pytest.mark.exclusive
def test_a_busy_core_never_yields_a_lead_inside_the_noise():
    """With a busy-loop on one core, the doctor recommends what it recommends unloaded or marks rows noisy; and a
    recommendation that is not a tie leads every other row by more than both rows' spread."""
    model, inputs = demo()
    quiet = unloaded_doctor(model, inputs)  # fails when every quiet run marks a row noisy
    busy = subprocess.Popen([sys.executable, "-c", BUSY.format(s=120)])
    try:
        loaded = doc.doctor(model, inputs, reps=20, profile=False)
    finally:
        busy.kill()
    noisy = [c.name for c in loaded.configs if c.noisy]
    # the same pick, or one run calls a tie that holds the other's pick (the demo's eager and compiled rows are
    # within ~10% on the 2-core VM: a tie goes to the simpler row), or the loaded run says its rows are noisy
    picks = [{r.recommendation.config, *r.recommendation.tie} for r in (quiet, loaded)]
    same = quiet.recommendation.config in picks[1] or loaded.recommendation.config in picks[0]
    assert same or noisy, f"quiet: {picks[0]}, loaded: {picks[1]}"
    for r in (quiet, loaded):
        pick = next(c for c in r.configs if c.name == r.recommendation.config)
        for c in r.configs:
            if c is pick or not c.ok or c.name in r.recommendation.tie:
                continue
            assert c.median_ms > pick.median_ms, f"{pick.name} recommended over faster {c.name}, not as a tie"
            # a lead the recommendation rests on is outside both rows' measured spread; over a noisy row, outside
            # it by the noise threshold itself
            margin = NOISY_P80_P20 if c.noisy or pick.noisy else 1.0
            assert c.p20_ms > pick.p80_ms * margin and c.median_ms > pick.median_ms * 1.03
    if os.cpu_count() and os.cpu_count() > 1:
        assert loaded.timing["threads"] < os.cpu_count()  # the busy core was left alone


def test_presets_time_as_rows_and_perception_refuses_a_model_with_breaks():
    clean = doc.doctor(models.Clean(), (torch.randn(4, 16),), modes=["eager", "dev", "fusion"], reps=3,
                       profile=False)  # fmt: skip
    rows = {c.name: c for c in clean.configs}
    assert {"compile dev fp32", "compile fusion fp32"} <= set(rows)
    assert all(rows[n].error is None and rows[n].rel_err < 1e-5 for n in ("compile dev fp32", "compile fusion fp32"))
    broken = doc.doctor(models.ValueBranch(), (torch.randn(4, 16),), modes=["eager", "dev", "perception"], reps=3,
                        profile=False)  # fmt: skip
    rows = {c.name: c for c in broken.configs}
    assert rows["compile dev fp32"].error is None  # graph breaks allowed
    assert "compiles one graph (fullgraph=True)" in rows["compile perception fp32"].error  # the break, in its row
    with pytest.raises(UsageError, match="unknown mode or preset 'percepton'"):
        doc.doctor(models.Clean(), (torch.randn(4, 16),), modes=["eager", "percepton"])


def test_no_fix_cites_a_document_users_lack_nor_a_cuda_epilogue_on_the_cpu(demo_report):
    """Issue 34, item 7: users have no DESIGN.md; a CPU has no cuBLASLt, and its tanh GELU is not the demo's."""
    r = demo_report
    flags = [f for b in r.breakdowns for f in b.flags]
    fixes = [f.fix for f in flags] + [g.fix for g in r.graph_breaks] + [c.fix for c in r.recompiles]
    assert fixes and not any("DESIGN.md" in f for f in fixes + [f.fix for f in r.lint])
    assert "DESIGN.md" not in format_summary(r, width=200)
    epilogue = [f for f in flags if f.kind == "epilogue-candidate"]
    assert epilogue, [f.kind for f in flags]  # the demo's GELUs between its Linears, seen on the CPU too
    assert all("tanh" not in f.fix and "_addmm_activation" not in f.fix for f in epilogue)


def test_a_model_in_training_mode_is_measured_in_eval_and_given_back_as_it_was():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(8)).train()
    model[2].eval()  # a mix, as a fine-tuning script leaves it: each module's own mode comes back
    state = {k: v.clone() for k, v in model.state_dict().items()}
    r = doc.doctor(model, (torch.randn(4, 8),), modes=["eager"], reps=3, profile=False)
    assert [m.training for m in model.modules()] == [True, True, True, False]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # no batch-norm statistics moved
    assert r.configs[0].ok  # measured in eval: dropout off, so the calls agree
    assert any(n.startswith("the model was in training mode: it was measured in eval mode") for n in r.notes)
    quiet = doc.doctor(model.eval(), (torch.randn(4, 8),), modes=["eager"], reps=3, profile=False)
    assert not [n for n in quiet.notes if "training mode" in n] and not model.training
