import dataclasses
import itertools
import math

import pytest
import torch

from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose.report import ConfigResult


def row(name, ms, err=0.0, tol=1e-3, mode="default", dtype="fp32", p20=None, p80=None, spread=0.01, noisy=False):
    return ConfigResult(
        name, mode, dtype, median_ms=ms, p20_ms=p20 or ms * 0.99, p80_ms=p80 or ms * 1.01, rel_err=err,
        tolerance=tol, rounds=5, spread=spread, noisy=noisy,
    )  # fmt: skip


def test_recommendation_is_the_fastest_within_tolerance():
    configs = [
        row("eager fp32", 10.0, mode="eager"),
        row("compile default fp32", 6.0, 1e-6),
        row("compile max-autotune bf16", 2.0, 0.5, tol=4e-2, mode="max-autotune", dtype="bf16"),  # over tolerance
        row("compile reduce-overhead bf16", 3.0, 1e-2, tol=4e-2, mode="reduce-overhead", dtype="bf16"),
        ConfigResult("compile max-autotune fp32", "max-autotune", "fp32", error="RuntimeError: boom"),
    ]
    rec = cfg.recommend(configs)
    assert rec.config == "compile reduce-overhead bf16" and rec.tie == []
    assert math.isclose(rec.speedup, 10.0 / 3.0) and rec.versus == "3.33x eager fp32"
    assert 'mode="reduce-overhead"' in rec.code and "torch.bfloat16" in rec.code
    assert cfg.recommend([configs[2]]) is None


def test_a_tie_goes_to_the_simplest_and_claims_no_win():
    configs = [
        row("eager fp32", 10.0, mode="eager"),
        row("compile default fp32", 10.1),  # 1% slower: a tie with eager
        row("compile max-autotune fp32", 9.9, mode="max-autotune"),  # 1% faster: still a tie
    ]
    rec = cfg.recommend(configs)
    assert rec.config == "eager fp32" and set(rec.tie) == {"compile default fp32", "compile max-autotune fp32"}
    assert rec.speedup is None and rec.versus == "" and "tie" in rec.reason
    assert "compiling (compile default fp32, compile max-autotune fp32) did not beat eager fp32" in rec.code
    assert "graph break" not in rec.code
    assert "remove its 3 graph breaks at 1 place first" in cfg.recommend(configs, "3 graph breaks at 1 place").code


def test_the_reason_names_the_rows_it_rests_on_and_only_rows_that_ran():
    """Issue 34, item 2: the reason names the rows the pick beat; failed and over-tolerance rows are not among them."""
    configs = [
        row("eager fp32", 10.0, mode="eager"),
        row("compile default fp32", 6.0, 1e-6),
        row("compile max-autotune bf16", 2.0, 0.5, tol=4e-2, mode="max-autotune", dtype="bf16"),  # over tolerance
        ConfigResult("compile max-autotune fp32", "max-autotune", "fp32", error="RuntimeError: boom"),
    ]
    rec = cfg.recommend(configs)
    assert rec.reason == "the fastest within tolerance, ahead of eager fp32 by more than their spread"
    alone = cfg.recommend([configs[0], configs[3]])
    assert alone.reason == "the only configuration that ran within tolerance"


def test_eager_advice_claims_nothing_about_compiling_when_no_compiled_row_ran():
    """Issue 34, item 2: with the budget spent on eager rows, "compiling did not beat eager" is not printed."""
    skipped = ConfigResult("compile default fp32", "default", "fp32", error="skipped: the --budget ran out")
    rec = cfg.recommend([row("eager fp32", 10.0, mode="eager"), skipped], "8 graph breaks at 2 places")
    assert rec.config == "eager fp32" and "did not beat" not in rec.code
    assert "no compiled configuration ran within tolerance" in rec.code
    assert "its 8 graph breaks at 2 places would split the compiled graph" in rec.code
    slower = [row("eager fp32", 5.0, mode="eager"), row("compile default fp32", 10.0)]
    assert "# compiling (compile default fp32) did not beat eager fp32 at these inputs" in cfg.recommend(slower).code


def test_a_lead_inside_the_spread_is_a_tie_and_outside_it_a_win():
    wide = [
        row("compile default fp32", 5.0, p20=4.0, p80=7.0, spread=0.3),
        row("compile reduce-overhead fp32", 4.5, mode="reduce-overhead", p20=4.4, p80=4.6),  # 10% lead, inside p20-p80
    ]
    assert cfg.recommend(wide).config == "compile default fp32"
    tight = [row("compile default fp32", 5.0), row("compile reduce-overhead fp32", 4.5, mode="reduce-overhead")]
    assert cfg.recommend(tight).config == "compile reduce-overhead fp32"
    noisy = [
        row("compile default fp32", 5.0, noisy=True),
        row("compile reduce-overhead fp32", 4.0, mode="reduce-overhead"),
    ]
    assert cfg.recommend(noisy).config == "compile default fp32"  # a noisy row is never beaten by its noise
    far = [  # BERT-base on the H200: a noisy eager row 3.5x slower is not a tie with the fastest
        row("eager bf16", 6.5, mode="eager", dtype="bf16", tol=4e-2, p20=5.0, p80=8.2, spread=0.5, noisy=True),
        row("compile reduce-overhead bf16", 1.86, mode="reduce-overhead", dtype="bf16", tol=4e-2, p20=1.85, p80=1.9),
    ]
    rec = cfg.recommend(far)
    assert rec.config == "compile reduce-overhead bf16" and rec.tie == [], rec


def test_a_lead_must_hold_in_every_round():
    steady = row("compile reduce-overhead fp32", 4.5, mode="reduce-overhead")
    ahead = dataclasses.replace(steady, round_ms=[4.5, 4.4, 4.6, 4.5, 4.5])
    base = dataclasses.replace(row("compile default fp32", 5.0), round_ms=[5.0, 5.1, 4.9, 5.0, 5.2])
    assert cfg.recommend([base, ahead]).config == "compile reduce-overhead fp32"
    lost = dataclasses.replace(ahead, round_ms=[4.5, 4.4, 5.3, 4.5, 4.5])  # slower than default in round 3
    rec = cfg.recommend([base, lost])
    assert rec.config == "compile default fp32" and rec.tie == ["compile reduce-overhead fp32"]


def test_noise_is_detected_from_samples_and_rounds():
    steady = cfg.Candidate("eager", torch.float32, samples=[1.0, 1.01, 0.99, 1.0] * 5, round_medians=[1.0] * 5)
    assert not steady.noisy() and steady.spread() == 0
    tail = cfg.Candidate("eager", torch.float32, samples=[1.0] * 10 + [30.0] * 10, round_medians=[1.0] * 5)
    assert tail.noisy()
    drift = cfg.Candidate("eager", torch.float32, samples=[1.0] * 20, round_medians=[1.0, 1.0, 1.5, 1.0, 1.0])
    assert drift.noisy() and math.isclose(drift.spread(), 0.5)


def test_measure_all_interleaves_and_remeasures_noisy_rows():
    calls = []
    good = cfg.Candidate("eager", torch.float32, fn=lambda: calls.append("a"))
    other = cfg.Candidate("default", torch.float32, fn=lambda: calls.append("b"))
    results = cfg.measure_all([good, other], torch.device("cpu"), reps=10)
    assert [r.rounds for r in results] == [cfg.ROUNDS, cfg.ROUNDS]
    # interleaved: the two rows alternate in blocks rather than one finishing before the other starts
    switches = sum(1 for x, y in itertools.pairwise(calls) if x != y)
    assert switches >= cfg.ROUNDS


@pytest.fixture
def clock(monkeypatch):
    """A fake time.monotonic for the timing loop, [now]; `tick` (every row's call) costs 1 s of it."""
    now = [0.0]
    monkeypatch.setattr(cfg.time, "monotonic", lambda: now[0])
    return now


def ticking_rows(clock: list[float], call_s: float | None = None) -> list[cfg.Candidate]:
    def tick() -> None:
        clock[0] += 1.0

    return [cfg.Candidate(m, torch.float32, fn=tick, call_s=call_s) for m in ("eager", "default")]


def test_timing_stops_at_the_deadline_after_the_round_that_would_end_past_it(clock):
    """Every call of a row costs 1 s. A round of two rows is 2 x (warm-up + 3 timed calls) = 8 s."""
    now = clock

    def rows() -> list[cfg.Candidate]:
        return ticking_rows(clock)

    per_round = 2 * (cfg.MIN_PER_ROUND + 1)
    assert cfg.time_rounds(rows(), torch.device("cpu"), reps=3) == cfg.ROUNDS  # no deadline: every round
    now[0] = 0.0
    # round 1 ends at 8 s, round 2 (8 + 8 <= 20) at 16 s; a third would end at 24 s, past the deadline: not started
    assert cfg.time_rounds(rows(), torch.device("cpu"), reps=3, deadline=20.0) == 2 and now[0] == 2 * per_round
    now[0] = 100.0
    cands = rows()
    results = cfg.measure_all(cands, torch.device("cpu"), reps=3, deadline=50.0)  # already past: one round
    assert [r.rounds for r in results] == [1, 1] and cfg.timed_per_round(cands) == cfg.MIN_PER_ROUND
    [note] = cfg.budget_timing_note(cands, 3, budget=50.0)
    assert f"1 of {cfg.ROUNDS} interleaved rounds ran, {cfg.MIN_PER_ROUND} timed call(s) a row" in note
    assert cfg.budget_timing_note(cands, 3, budget=None) == []
    assert now[0] == 100.0 + per_round  # and no second measurement, noisy or not


def test_rows_too_slow_for_every_round_time_fewer_calls_in_each(clock):
    """BERT-base at batch 32 on the 2-core CPU: seconds a call, 10 rows; the rounds must still end by the budget."""
    now = clock

    def rows() -> list[cfg.Candidate]:
        return ticking_rows(clock, call_s=1.0)

    assert cfg.fit_calls(rows(), 3, cfg.ROUNDS, None) == (1, 3)
    assert cfg.fit_calls(rows(), 3, cfg.ROUNDS, 40.0) == (1, 3)  # 20 calls a row fit: 5 rounds x (1 + 3)
    assert cfg.fit_calls(rows(), 3, cfg.ROUNDS, 20.0) == (1, 1)  # 10 fit: 5 rounds x (1 + 1)
    assert cfg.fit_calls(rows(), 3, cfg.ROUNDS, 3.0) == (0, 1)  # not even two: the rows are warm already
    assert cfg.fit_calls(ticking_rows(clock), 3, cfg.ROUNDS, 3.0) == (1, 3)  # call times unknown
    cands = rows()
    assert cfg.time_rounds(cands, torch.device("cpu"), reps=10, deadline=20.0) == cfg.ROUNDS
    assert now[0] == 20.0 and cfg.timed_per_round(cands) == 1
    now[0] = 0.0
    cands = rows()
    assert cfg.time_rounds(cands, torch.device("cpu"), reps=10, deadline=3.0) == 1
    assert now[0] == 2.0 and cfg.timed_per_round(cands) == 1  # one call a row, no warm-up


def test_a_noisy_row_is_measured_again_up_to_measures_times_then_marked():
    """A stall that spoils the first two measurements is forgiven by the third; noise that lasts is marked."""
    import time

    def row(stalls: int) -> tuple[cfg.Candidate, list[int]]:
        calls = [0]

        def fn() -> None:
            calls[0] += 1
            # the first `stalls` measurements: every other call is 20x slower (p80/p20 far above the threshold); a
            # 1 ms base call, as a 0.2 ms sleep jitters past the 1.5x threshold on a loaded VM (one CI run)
            if calls[0] <= stalls * per_measure and calls[0] % 2:
                time.sleep(0.02)
            time.sleep(0.001)

        return cfg.Candidate("eager", torch.float32, fn=fn), calls

    reps = 10
    per_measure = cfg.ROUNDS * (max(cfg.MIN_PER_ROUND, -(-reps // cfg.ROUNDS)) + 1)  # timed calls + one warm-up
    passing, n1 = row(stalls=cfg.MEASURES - 1)
    [r] = cfg.measure_all([passing], torch.device("cpu"), reps=reps)
    assert not r.noisy and n1[0] == cfg.MEASURES * per_measure
    lasting, n2 = row(stalls=cfg.MEASURES + 5)
    [r] = cfg.measure_all([lasting], torch.device("cpu"), reps=reps)
    assert r.noisy and n2[0] == cfg.MEASURES * per_measure
    quiet, n3 = row(stalls=0)
    [r] = cfg.measure_all([quiet], torch.device("cpu"), reps=reps)
    assert not r.noisy and n3[0] == per_measure  # measured once when nothing was noisy


def test_rel_err_never_passes_nan_or_a_mismatch():
    ref = torch.randn(5)
    assert cfg.rel_err(ref.clone(), ref) == 0
    assert cfg.rel_err(torch.full((5,), float("nan")), ref) == float("inf")
    assert cfg.rel_err((ref, ref), ref) == float("inf")
    assert cfg.rel_err(torch.randn(4), ref) == float("inf")
    labels = torch.tensor([1, 2, 3])
    assert cfg.rel_err(labels.clone(), labels) == 0 and cfg.rel_err(labels + 1, labels) == float("inf")


def test_budget_plan_skips_the_slowest_first():
    modes = cfg.GPU_MODES
    kept, skipped = cfg.plan(modes, (torch.float32,), budget_s=20.0, base_compile_s=2.0)
    assert [c.mode for c in kept][:2] == ["eager", "default"]
    assert skipped and all("max-autotune" in s for s in skipped)
    kept, skipped = cfg.plan(modes, (torch.float32,), budget_s=None, base_compile_s=2.0)
    assert len(kept) == len(modes) and skipped == []


def test_a_prepared_row_runs_as_inference_whoever_calls_it():
    # The profile of the recommended row once called it with grad enabled: the compiled row compiled again (and on
    # the H200 a reduce-overhead row timed 36 ms instead of 1.8). The row's callable carries no_grad itself.
    from torch._dynamo.utils import counters

    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    c = cfg.Candidate("default", torch.float32)
    cfg.prepare(c, model, cfg.Example.of(x), cfg.Reference(model(x).detach()), torch.device("cpu"))
    assert c.error is None and c.err < 1e-5
    frames = counters["frames"]["ok"]
    assert torch.is_grad_enabled()
    out = c.fn()
    assert counters["frames"]["ok"] == frames and not out.requires_grad


def test_the_recommended_call_pasted_reproduces_its_row():
    import fullgraph
    from fullgraph.compile import CompiledModel

    configs = [
        row("eager fp32", 10.0, mode="eager"),
        row("compile reduce-overhead bf16", 2.0, 1e-2, 4e-2, "reduce-overhead", "bf16"),
    ]
    rec = cfg.recommend(configs)
    assert rec.code.startswith('model = fullgraph.compile(model, mode="reduce-overhead", dtype=torch.bfloat16)')
    namespace = {"model": torch.nn.Linear(4, 4), "torch": torch, "fullgraph": fullgraph}
    exec(rec.code.splitlines()[0], namespace)  # the line a user pastes; the call itself needs a GPU for this mode
    cm = namespace["model"]
    assert isinstance(cm, CompiledModel) and cm.resolved.mode == "reduce-overhead"
    assert cm.resolved.options == fullgraph.compile.resolve("dev", mode="reduce-overhead").options
    assert cm.weight.dtype == torch.bfloat16  # cast, as the row was

    eager = cfg.recommend([row("eager fp32", 1.0, mode="eager")])
    namespace = {"model": torch.nn.Linear(4, 4), "torch": torch, "fullgraph": fullgraph, "args": (torch.randn(2, 4),),
                 "kwargs": {}}  # fmt: skip
    exec(eager.code, namespace)
    assert namespace["y"].shape == (2, 4) and isinstance(namespace["model"], torch.nn.Linear)
    fn = cfg.recommend(configs, module=False)  # a function: torch.compile, fullgraph.compile takes modules
    assert 'torch.compile(model, mode="reduce-overhead")' in fn.code


def test_compiled_rows_are_built_through_fullgraph_compile():
    from fullgraph.compile import CompiledModel

    built = cfg.build(torch.nn.Linear(4, 4), "default", torch.float32)
    assert isinstance(built, CompiledModel) and built.resolved.mode == "default"
    assert isinstance(cfg.build(torch.nn.Linear(4, 4), "eager", torch.float32), torch.nn.Linear)


def test_a_preset_row_is_built_through_its_preset_and_its_call_pasted_reproduces_it():
    import fullgraph
    from fullgraph.compile import CompiledModel
    from fullgraph.compile.choice import read_choice

    configs = [
        row("eager fp32", 10.0, mode="eager"),
        row("compile default bf16", 3.0, 1e-2, 4e-2, "default", "bf16"),
        row("compile perception bf16", 2.0, 1e-2, 4e-2, "perception", "bf16"),
    ]
    rec = cfg.recommend(configs)
    assert rec.config == "compile perception bf16"
    assert rec.code.startswith('model = fullgraph.compile(model, "perception", dtype=torch.bfloat16)')
    namespace = {"model": torch.nn.Linear(4, 4), "torch": torch, "fullgraph": fullgraph}
    exec(rec.code.splitlines()[0], namespace)
    cm = namespace["model"]
    assert isinstance(cm, CompiledModel) and cm.resolved == fullgraph.compile.resolve("perception")
    assert read_choice(rec).preset == "perception"  # preset="auto" reads the same row
    # within 3% of the fastest, a plain mode is simpler than a preset that sets more than the mode
    tie = [row("compile reduce-overhead bf16", 2.02, 1e-2, 4e-2, "reduce-overhead", "bf16"), configs[2]]
    assert cfg.recommend(tie).config == "compile reduce-overhead bf16"
    built = cfg.build(torch.nn.Linear(4, 4), "fusion", torch.float32)
    assert isinstance(built, CompiledModel) and built.resolved == fullgraph.compile.resolve("fusion")


# ---- graph rewrites (issue 33): a row whose compile applied rewrites, and its twin without them ---------------------


def rewrite_pair(with_ms, without_ms):
    applied = row("compile default bf16", with_ms, 1e-2, 4e-2, "default", "bf16")
    applied = dataclasses.replace(applied, rewrites={"patch_gemm": 1}, round_ms=[with_ms] * 5)
    plain = row("compile default bf16 rewrites=off", without_ms, 1e-2, 4e-2, "default", "bf16")
    plain = dataclasses.replace(plain, rewrites_off=True, round_ms=[without_ms] * 5)
    return [row("eager fp32", 10.0, mode="eager"), applied, plain]


def test_rewrites_are_recommended_only_where_they_win_beyond_noise():
    import fullgraph
    from fullgraph.compile.choice import read_choice

    rec = cfg.recommend(rewrite_pair(with_ms=1.5, without_ms=2.0))
    assert rec.config == "compile default bf16"
    assert rec.code.startswith('model = fullgraph.compile(model, mode="default", dtype=torch.bfloat16)')
    tie = cfg.recommend(rewrite_pair(with_ms=1.99, without_ms=2.0))  # within 3%: the graph plain compile builds
    assert tie.config == "compile default bf16 rewrites=off" and tie.tie == ["compile default bf16"]
    assert tie.code.startswith('model = fullgraph.compile(model, mode="default", rewrites=[], dtype=torch.bfloat16)')
    picked = read_choice(tie)
    assert picked.mode == "default" and picked.rewrites_off and picked.dtype == torch.bfloat16
    cm = fullgraph.compile(torch.nn.Linear(4, 4), "auto", choice=tie)
    assert cm.resolved.rewrites is None  # preset="auto" reproduces the row: no rewrite pass
    cm = fullgraph.compile(torch.nn.Linear(4, 4), "auto", choice=rec)
    assert cm.resolved.rewrites is not None


def test_a_twin_without_rewrites_is_made_only_for_rows_that_applied_some():
    applied = cfg.Candidate("default", torch.bfloat16, rewrites={"gelu_epilogue": 12})
    none = cfg.Candidate("reduce-overhead", torch.bfloat16)
    failed = cfg.Candidate("max-autotune", torch.bfloat16, rewrites={"patch_gemm": 1}, error="boom")
    (twin,) = cfg.plain_twins([applied, none, failed])
    assert twin.rewrites_off and twin.mode == "default" and twin.name == "compile default bf16 rewrites=off"
    assert cfg.plain_twins([twin]) == []
