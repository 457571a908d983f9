"""`fullgraph tune`: search compile presets x modes x dtypes x op policies within a time budget, keep the fastest
configuration within tolerance of eager fp32 (ties to the simplest, by the doctor's rule), as a `TuneResult`.

The search runs in stages, each only while the budget lasts (a row is started only when its estimated compile time
fits what is left, less the share kept for timing):

1. eager, and every preset in every dtype (with each op's default policy): the coverage a default budget promises;
2. op policies (every op native; every op kernel where our kernels run) on the two fastest rows of stage 1, when
   the model calls any of `fullgraph.ops` (found by running it once and reading the ops' counters);
3. the compile modes no preset covers (max-autotune, CUDA graphs and autotuning together, on a GPU).

On a GPU the autotuning rows (edge, max-autotune) are compiled ahead in background processes from the start
(`fullgraph.diagnose.ahead`, two at a time), while this process builds the quick rows; it then builds them from the
warm caches. The search then takes about its slowest row rather than the sum of them (edge took 307 s of 369 on
ViT-B/16 on the H200).

Every row is built like the doctor's (a copy of the model, through `fullgraph.compile`, numerics checked against
eager fp32) and kept; at the end all rows are timed together in interleaved rounds, so the table is one side-by-side
measurement and the pick is made from it (`configs.recommend`). Compile estimates: the same preset or mode's
compile in another dtype when one was seen (x1.25), else the largest compile seen scaled by the mode's relative
cost (`configs.COST`, x1.5).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fullgraph import env
from fullgraph._capture import capture_output
from fullgraph._version import __version__
from fullgraph.compile.presets import PRESETS
from fullgraph.compile.tuned import TuneResult
from fullgraph.diagnose import ahead as ahead_mod
from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose import dynamo
from fullgraph.diagnose.inputs import Example
from fullgraph.diagnose.target import unwrap_compiled
from fullgraph.errors import FullgraphError, UsageError
from fullgraph.ops import counters
from fullgraph.ops.custom_op import kernel_runs_on
from fullgraph.timing import cpu_threads_available, pinned_threads

# Seconds of search by default: on a GPU it must fit one 10-minute job with the model's build and imports around it
# (ViT-B/16 on the H200: presets x {fp32, bf16} estimated at about 360 s, edge's autotuning most of it).
DEFAULT_BUDGET_S = {"cuda": 480.0, "cpu": 240.0}
MARGIN = 1.5  # on compile seconds estimated from another mode's
SEEN_MARGIN = 1.25  # on compile seconds estimated from the same preset or mode in another dtype or policy
FIRST_GUESS_S = 5.0  # a default-mode compile's seconds before any was measured
POLICY_FINALISTS = 2  # stage-1 rows that stage 2 tries op policies on
EXTRA_MODES = ("max-autotune",)  # the modes no preset runs (GPU only)


def default_presets() -> tuple[str, ...]:
    return tuple(PRESETS)


def ops_in(model: nn.Module, example: Example) -> list[str]:
    """The `fullgraph.ops` that one eager call of `model` runs (from the ops' counters), sorted."""
    before = Counter(counters)
    with torch.no_grad():
        example.call(model)
    return sorted({key[0] for key, n in counters.items() if key[1] == "eager" and n > before[key]})


def policy_variants(used: Sequence[str], device: torch.device) -> list[dict[str, str]]:
    """The op policies stage 2 tries when the model calls our ops: all native, and all kernel where kernels run."""
    if not used:
        return []
    variants = [{"all": "native"}]
    if kernel_runs_on(device.type):
        variants.append({"all": "kernel"})
    return variants


class _Budget:
    """Seconds left for compiling, and estimates of what a row will take: the same preset or mode's compile in
    another dtype or op policy when one was seen (with a small margin), else the largest compile seen scaled by the
    mode's relative cost (with a large one)."""

    def __init__(self, budget_s: float, start: float) -> None:
        self.deadline = start + budget_s
        self.reserve = budget_s * cfg.TIMING_SHARE
        self.per_unit: list[float] = []  # observed compile seconds / COST of the row's mode
        self.seen: dict[str, float] = {}  # preset or mode -> the longest compile of it seen

    def estimate(self, c: cfg.Candidate) -> float:
        if c.mode == "eager":
            return 0.0
        if c.mode in self.seen:
            return self.seen[c.mode] * SEEN_MARGIN
        # The largest seen: a row served from Inductor's cache (another row compiled the same graphs) takes a
        # fraction of a second and says nothing about the next one.
        unit = max(self.per_unit) if self.per_unit else FIRST_GUESS_S
        return cfg.COST.get(cfg.mode_of(c.mode), 1.0) * unit * MARGIN

    def fits(self, c: cfg.Candidate) -> bool:
        return c.mode == "eager" or time.monotonic() + self.estimate(c) <= self.deadline - self.reserve

    def observe(self, c: cfg.Candidate) -> None:
        if c.mode != "eager" and c.compile_s and c.error is None:
            self.per_unit.append(c.compile_s / cfg.COST.get(cfg.mode_of(c.mode), 1.0))
            self.seen[c.mode] = max(self.seen.get(c.mode, 0.0), c.compile_s)


# Among rows of equal estimate, the lower precision first: where the budget cannot hold both dtypes of an autotuning
# preset, the one left out is fp32, which ran 5-6x slower than bf16 in every preset on the H200 (ViT-B/16, batch 4,
# benchmarks/results/fullgraph_tune_vit_serial_h200.txt; there edge fp32 ran, 307 s, and left edge bf16 out by list
# order). With the autotuning rows compiled ahead (fullgraph.diagnose.ahead) both ran on the H200.
PRECISION_ORDER = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def stage_order(clock: _Budget, cands: Sequence[cfg.Candidate]) -> list[cfg.Candidate]:
    """The order a stage runs its rows in: cheapest estimate first, ties to the lower precision."""
    rank = {d: i for i, d in enumerate(PRECISION_ORDER)}
    return sorted(cands, key=lambda c: (clock.estimate(c), rank.get(c.dtype, len(rank))))


def tune(
    model: nn.Module,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: str = "",
    budget: float | None = None,
    presets: Sequence[str] | None = None,
    modes: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    ops: Sequence[Mapping[str, str]] | None = None,
    reps: int = 20,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
    ahead: bool | None = None,
) -> TuneResult:
    """Search how to run `model(*args, **kwargs)` fastest within tolerance (see the module's docstring).

    `budget` (seconds, default 480 on a GPU, 240 on the CPU) bounds the search; `presets` (default: all), `modes`
    (extra compile modes; default max-autotune on a GPU), `dtypes` (default fp32 and bf16 on a GPU, the inputs'
    on the CPU) and `ops` (op-policy variants, e.g. [{"all": "native"}]; default: native and kernel when the model
    calls our ops) narrow or widen it. `ahead` (default: on a GPU) compiles the autotuning rows in background
    processes from the start (`fullgraph.diagnose.ahead`), so the search takes about its slowest row, not their sum."""
    start = time.monotonic()
    say = progress or (lambda msg: None)
    example = Example.of(args, kwargs).fresh()  # its own copy, as the doctor's (a forward may write into its inputs)
    device = example.device
    gpu = device.type == "cuda"
    model = unwrap_compiled(model)
    if not isinstance(model, nn.Module):
        raise UsageError("tune compiles modules (fullgraph.compile); wrap the function in an nn.Module")
    presets = tuple(default_presets() if presets is None else presets)
    modes = tuple((EXTRA_MODES if gpu else ()) if modes is None else modes)
    cfg.check_modes(presets + modes)
    dtypes = tuple(dtypes or ((torch.float32, torch.bfloat16) if gpu else (example.floating_dtype() or torch.float32,)))
    budget = DEFAULT_BUDGET_S["cuda" if gpu else "cpu"] if budget is None else budget
    if budget <= 0:
        raise UsageError(f"budget={budget:g}: give a positive number of seconds")
    clock = _Budget(budget, start)
    notes: list[str] = []
    if threads is None and not gpu:
        threads, why = cpu_threads_available()
        notes.append(f"CPU timing with {why}")
    rows: list[cfg.Candidate] = []
    skipped: list[str] = []
    warm: list[str] = []  # rows compiled ahead: this process's build from the warm caches

    with contextlib.ExitStack() as stack:
        if was_training := cfg.in_eval(model, stack):
            notes.append(was_training)
        stack.enter_context(pinned_threads(threads))
        captured = stack.enter_context(capture_output(stdout=True, stderr=False))
        stack.enter_context(dynamo.room_for_recompiles())  # every row compiles the same code objects again
        say("reference: eager fp32, and which of fullgraph's ops the model calls")
        ref_model = cfg.build(model, "eager", torch.float32)
        x32 = example.cast(torch.float32)
        try:
            reference = cfg.reference(ref_model, example, device)
        except Exception as e:  # the user's bug to fix first, in one line
            raise FullgraphError(f"the model fails in eager mode: {env.first_line(e, 300)}") from e
        notes += reference.notes
        used = ops_in(ref_model, x32.fresh())
        variants = [dict(v) for v in ops] if ops is not None else policy_variants(used, device)
        if used:
            notes.append(f"the model calls fullgraph ops: {', '.join(used)}")
        elif ops:
            notes.append("the model calls none of fullgraph's ops: op policies change nothing, not tried")
            variants = []

        stage1 = [cfg.Candidate("eager", d) for d in dtypes] + [cfg.Candidate(p, d) for p in presets for d in dtypes]
        stage3 = [cfg.Candidate(m, d) for m in modes for d in dtypes]
        early = [c for c in stage_order(clock, stage1) + stage_order(clock, stage3) if ahead_mod.slow(c)]
        background = stack.enter_context(
            ahead_mod.Ahead(model, example, early if (gpu if ahead is None else ahead) else [], say=say)
        )
        if background.why_not:
            notes.append(f"compiled in this process one row after another: {background.why_not}")

        def from_background(c: cfg.Candidate) -> None:
            """Build a row compiled ahead, from the warm caches, once its child is done; left out if it is late."""
            report = background.wait(c, clock.deadline - clock.reserve)
            if report.get("late"):
                skipped.append(f"{c.name} (its background compile did not end within the budget)")
                return
            if not report["ok"]:
                c.error = report["error"]
            else:
                cfg.prepare(c, model, example, reference, device)
                if c.error is None:
                    warm.append(f"{c.name} {c.compile_s:.1f} s")
                    c.compile_s = report["compile_s"]  # what compiling it costs, shown as such
            clock.observe(c)
            rows.append(c)

        def run_stage(stage: str, cands: list[cfg.Candidate]) -> None:
            for c in stage_order(clock, cands):
                if c in background:
                    say(f"{stage} [{len(rows) + 1}] {c.name}: waiting for its background compile; "
                        f"{clock.deadline - time.monotonic():.0f} s left")  # fmt: skip
                    from_background(c)
                    continue
                if not clock.fits(c):
                    skipped.append(f"{c.name} (about {clock.estimate(c):.0f} s)")
                    continue
                eta = clock.estimate(c)
                what = "first call" if c.mode == "eager" else f"compiling (about {eta:.0f} s)" if eta else "compiling"
                say(f"{stage} [{len(rows) + 1}] {c.name}: {what}; {clock.deadline - time.monotonic():.0f} s left")
                cfg.prepare(c, model, example, reference, device)
                clock.observe(c)
                rows.append(c)

        run_stage("presets x dtypes", stage1)
        if variants:
            best = _fastest(rows, device, reps, POLICY_FINALISTS)
            run_stage("op policies", [cfg.Candidate(c.mode, c.dtype, tuple(sorted(v.items()))) for c in best
                                      for v in variants])  # fmt: skip
        run_stage("modes", stage3)
        background.close()  # nothing may compile or autotune on the device while the rows are timed
        say(f"timing {len(rows)} configuration(s) side by side in {cfg.ROUNDS} interleaved rounds")
        table = cfg.measure_all(rows, device, reps, clock.deadline)
        notes += cfg.budget_timing_note(rows, reps, budget)
    if warm:
        notes.append(f"compiled ahead in background processes (compile s is theirs), then built here from the warm "
                     f"caches: {', '.join(warm)}")  # fmt: skip
    if skipped:
        notes.append(f"the budget ({budget:g} s) left out {', '.join(skipped)}; raise --budget to try them")
    notes += captured.summary()
    rec = cfg.recommend(table, module=True)
    if rec is None:
        raise UsageError("no configuration ran within tolerance of eager fp32; run `fullgraph doctor` on the model")
    pick = next(t for t in table if t.name == rec.config)
    return TuneResult(
        config=pick.name.split(" ops=")[0], ops=dict(pick.ops), speedup=rec.speedup, baseline=rec.baseline,
        reason=rec.reason, tie=tuple(rec.tie), table=tuple(_row(t) for t in table), skipped=tuple(skipped),
        notes=tuple(notes), target=target or type(model).__qualname__,
        device=torch.cuda.get_device_name(device) if gpu else "cpu", inputs=tuple(example.describe()),
        environment={"torch": torch.__version__, "triton": env.triton_version() or "", "fullgraph": __version__,
                     "python": sys.version.split()[0]},
        budget_s=budget, elapsed_s=time.monotonic() - start,
    )  # fmt: skip


def _fastest(rows: Sequence[cfg.Candidate], device: torch.device, reps: int, n: int) -> list[cfg.Candidate]:
    """The `n` fastest rows that ran within tolerance, from a short interleaved timing (two rounds)."""
    ok = [c for c in rows if c.fn is not None and c.error is None and c.err is not None
          and c.err <= cfg.TOLERANCE.get(c.dtype, 1e-3)]  # fmt: skip
    cfg.time_rounds(ok, device, max(reps // 2, 2), rounds=2)
    ranked = sorted(ok, key=lambda c: statistics.median(c.samples) if c.samples else float("inf"))
    for c in ok:  # the final timing starts afresh
        c.samples, c.round_medians = [], []
    return ranked[:n]


def _row(t) -> dict[str, Any]:
    return {
        "name": t.name, "mode": t.mode, "dtype": t.dtype, "ops": dict(t.ops), "median_ms": t.median_ms,
        "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "compile_s": t.compile_s, "rel_err": t.rel_err,
        "tolerance": t.tolerance, "ok": t.ok, "noisy": t.noisy, "error": t.error, "rng": t.rng,
    }  # fmt: skip
