"""The doctor's configurations (eager or a compile mode, in one dtype): built, compiled, checked against eager
float32, then timed side by side in interleaved rounds, and one recommended.

Interleaving matters on a machine that is not idle: a burst of other work lands on every configuration of a
round instead of deciding one row. Each row keeps its spread, a row too noisy is measured again and then marked,
and a recommendation never rests on a lead smaller than the measured spread.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fullgraph import env
from fullgraph.compile.choice import DTYPES, REWRITES_OFF
from fullgraph.compile.compiled import CompiledModel
from fullgraph.compile.compiled import compile as fullgraph_compile
from fullgraph.compile.presets import PRESETS
from fullgraph.compile.tuned import ops_text
from fullgraph.diagnose import fixes as our_fixes
from fullgraph.diagnose.detections import IOU_MIN, MATCHED_MIN, matched_fraction
from fullgraph.diagnose.inputs import Example, flat_tensors
from fullgraph.diagnose.report import ConfigResult, Recommendation
from fullgraph.diagnose.rng import describe, maybe_seeded, random_draws
from fullgraph.errors import UsageError
from fullgraph.ops import policy
from fullgraph.timing import first_call, measure, peak_memory

GPU_MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
# CUDA graphs need a GPU, and CPU max-autotune spends minutes benchmarking GEMM templates on two cores.
CPU_MODES = ("eager", "default")
# fullgraph.compile's presets time as rows too ("compile perception bf16"): each is built through its preset.
PRESET_ROWS = tuple(PRESETS)
# Simplest first: a tie goes to the configuration a user has least reason to doubt. A preset ranks just after
# its own mode (it sets more than the mode does).
SIMPLICITY = {mode: i for i, mode in enumerate(GPU_MODES)}
SIMPLICITY.update({name: SIMPLICITY.get(p.mode or "default", 1) + 0.5 for name, p in PRESETS.items()})


def check_modes(modes: Sequence[str], flag: str | None = None) -> None:
    """Every row a mode or a preset, or one error listing them: the CLI's names its `flag` (it checks before
    loading the model), `doctor`'s serves callers from Python."""
    unknown = [m for m in modes if m not in GPU_MODES and m not in PRESET_ROWS]
    if unknown:
        what = (
            f"{flag}: unknown {', '.join(unknown)}"
            if flag
            else f"unknown mode or preset {', '.join(map(repr, unknown))}"
        )
        raise UsageError(f"{what}; choose from {', '.join(GPU_MODES + PRESET_ROWS)} (comma-separated)")


def mode_of(row: str) -> str:
    """The torch.compile mode a row runs in: the row's own, or its preset's ("eager" stays "eager")."""
    return PRESETS[row].mode or "default" if row in PRESETS else row


DTYPE_SIMPLICITY = {"fp32": 0, "bf16": 1, "fp16": 2}
# ||out - ref|| / ||ref|| against eager float32, per dtype the configuration runs in.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2}
TIE = 0.03  # rows within 3% of the fastest are a tie
NOISY_P80_P20 = 1.5  # p80 / p20 over all timed calls of a row (a 2-core VM shows up to 1.22 when idle)
NOISY_SPREAD = 0.4  # (max - min) / median of the per-round medians (up to 0.21 idle, and 0.25 once, on a 2-core VM)
ROUNDS = 5
MIN_PER_ROUND = 3  # calls timed per row per round: a round's median of fewer is one outlier away from noise
TIMING_SHARE = 0.15  # of a --budget, kept for the final interleaved timing of every row (doctor, tune)
MEASURES = 3  # a noisy row is measured again up to twice: a stall on an idle 2-core VM can spoil two in a row
# Compile seconds of each mode relative to the default mode's, to skip the slowest first under --budget (the
# ViT-B/16 anchors in DESIGN.md: default 8 s, reduce-overhead 7-12 s, max-autotune 120-138 s).
COST = {"eager": 0.0, "default": 1.0, "reduce-overhead": 1.3, "max-autotune-no-cudagraphs": 12.0, "max-autotune": 15.0}


def short_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}.get(
        dtype, str(dtype)
    )


def config_name(mode: str, dtype: torch.dtype) -> str:
    return f"{'eager' if mode == 'eager' else 'compile ' + mode} {short_dtype(dtype)}"


def rel_err(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| over every tensor of the outputs, in float64; inf when they do not line up."""
    outs, refs = flat_tensors(out), flat_tensors(ref)
    if len(outs) != len(refs) or not refs or any(o.shape != r.shape for o, r in zip(outs, refs, strict=True)):
        return float("inf")
    num = sum(((o.double() - r.double()).norm() ** 2).item() for o, r in zip(outs, refs, strict=True))
    den = sum((r.double().norm() ** 2).item() for r in refs if r.is_floating_point() or r.is_complex())
    if den == 0:  # integer outputs only (labels, indices): exact match or nothing
        return 0.0 if num == 0 else float("inf")
    err = (num / den) ** 0.5
    return err if err == err else float("inf")  # NaN never passes


def integer_match(out: Any, ref: Any) -> float | None:
    """Outputs made of integers only (token ids, labels, masks): the fraction of their elements equal to the
    reference's, 0.0 where they do not line up; None for outputs with a floating tensor (judged by `rel_err`),
    where the relative error could only say 0 or inf."""
    outs, refs = flat_tensors(out), flat_tensors(ref)
    if not refs or any(r.is_floating_point() or r.is_complex() for r in refs):
        return None
    total = sum(r.numel() for r in refs)
    if not total:
        return None
    if len(outs) != len(refs) or any(o.shape != r.shape for o, r in zip(outs, refs, strict=True)):
        return 0.0
    return sum(int((o.to(r.device) == r).sum()) for o, r in zip(outs, refs, strict=True)) / total


@dataclass
class Candidate:
    """One configuration being measured: its callable, inputs and what was measured so far."""

    mode: str
    dtype: torch.dtype
    ops: tuple[tuple[str, str], ...] = ()  # op policies this row runs under (fullgraph.ops.policy); () = defaults
    rewrites_off: bool = False  # compiled with rewrites=[] (the twin of a row whose compile applied rewrites)
    rewrites: dict[str, int] = field(default_factory=dict)  # what fullgraph.compile's rewrites applied
    fixes: tuple[str, ...] = ()  # our fixes this row runs with (diagnose.fixes), applied around every call
    fn: Callable[[], Any] | None = None
    compile_s: float | None = None
    call_s: float | None = None  # one warm call's seconds (its second call), device work included
    peak: int | None = None
    err: float | None = None
    matched: float | None = None  # detection outputs: fraction of detections matched (diagnose.detections)
    matched_min: float | None = None  # what `matched` must reach where not the detections' (integer outputs: all)
    rng: str = ""  # how a model drawing random numbers was checked (diagnose.rng): "seeded", "seeded, fallback_random"
    error: str | None = None
    samples: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        ops = f" ops={ops_text(dict(self.ops))}" if self.ops else ""
        off = f" {REWRITES_OFF}" if self.rewrites_off else ""
        return config_name(self.mode, self.dtype) + ops + off + (f" with {'+'.join(self.fixes)}" if self.fixes else "")

    @contextlib.contextmanager
    def policies(self) -> Iterator[None]:
        """The op policies and fixes of this row, entered around every call of it: compiled code guards on them."""
        with policy(**dict(self.ops)) if self.ops else contextlib.nullcontext(), our_fixes.applied(self.fixes):
            yield

    def spread(self) -> float | None:
        if len(self.round_medians) < 2:
            return None
        return (max(self.round_medians) - min(self.round_medians)) / statistics.median(self.round_medians)

    def p(self, q: float) -> float:
        s = sorted(self.samples)
        return statistics.quantiles(s, n=100, method="inclusive")[round(q * 100) - 1] if len(s) > 1 else s[0]

    def noisy(self) -> bool:
        if not self.samples:
            return False
        return self.p(0.8) / self.p(0.2) > NOISY_P80_P20 or (self.spread() or 0.0) > NOISY_SPREAD

    def result(self, noisy: bool) -> ConfigResult:
        tol = TOLERANCE.get(self.dtype, 1e-3)
        if self.error is not None or not self.samples:
            return ConfigResult(self.name, self.mode, short_dtype(self.dtype), tolerance=tol, error=self.error,
                                ops=dict(self.ops), rewrites_off=self.rewrites_off,
                                fixes=list(self.fixes))  # fmt: skip
        return ConfigResult(
            self.name, self.mode, short_dtype(self.dtype), statistics.median(self.samples), self.p(0.2), self.p(0.8),
            compile_s=None if self.mode == "eager" else self.compile_s, peak_memory_bytes=self.peak,
            rel_err=self.err, tolerance=tol, rounds=len(self.round_medians), spread=self.spread(), noisy=noisy,
            round_ms=list(self.round_medians), ops=dict(self.ops), matched=self.matched,
            rewrites=dict(self.rewrites), rewrites_off=self.rewrites_off,
            matched_min=None if self.matched is None else self.matched_min or MATCHED_MIN.get(self.dtype, 0.95),
            fixes=list(self.fixes), rng=self.rng,
        )  # fmt: skip


def build(model: Callable, mode: str, dtype: torch.dtype, rewrites_off: bool = False,
          options: dict[str, Any] | None = None) -> Callable:  # fmt: skip
    """The model in `dtype` (a copy: the user's model is never changed) and compiled with `mode` unless eager,
    through `fullgraph.compile` (validated options, scoped config), as the recommendation's code will be.

    A plain function cannot be cast: it runs on inputs cast to `dtype` with whatever weights it closes over, and
    is compiled with torch.compile (fullgraph.compile takes modules)."""
    if not isinstance(model, nn.Module):
        if mode == "eager":
            return model
        if options:  # torch.compile takes a mode or options, not both: the mode's own options, then these
            from torch._inductor import list_mode_options

            return torch.compile(model, options={**list_mode_options(mode), **options})
        return torch.compile(model, mode=mode)
    m = copy.deepcopy(model).to(dtype).eval()
    if mode == "eager":
        return m
    off: dict[str, Any] = {"rewrites": []} if rewrites_off else {}
    if options:
        off["options"] = options
    return fullgraph_compile(m, mode, **off) if mode in PRESETS else fullgraph_compile(m, mode=mode, **off)


def prepare(c: Candidate, model: Callable, example: Example, reference: Reference, device: torch.device) -> None:
    """Compile (the first call, timed), check numerics against `reference` and peak memory; failures are recorded,
    not raised. A model that draws random numbers in forward (diagnose.rng): the check call is seeded as the
    reference's were, and a compiled row that still differs is checked through a compile that draws as eager does.
    A model that writes into its inputs: the row calls a copy of its own, and the check call a fresh one."""
    ref, random = reference.out, reference.random

    def inputs() -> Example:  # the inputs of one call that must see them as given
        x = example.cast(c.dtype)
        return x.fresh() if reference.written else x

    try:
        fn = build(model, c.mode, c.dtype, c.rewrites_off)
        x = inputs()
        with torch.no_grad(), c.policies():
            c.compile_s, _ = first_call(lambda: x.call(fn), device)
            c.rewrites = fn.stats.rewrite_counts() if isinstance(fn, CompiledModel) else {}
            check = inputs()
            with maybe_seeded(device, random):
                c.call_s, out = first_call(lambda: check.call(fn), device)
            out = reference.result(fn, out)
            c.err = rel_err(out, ref) if reference.compare else None
            if random and reference.compare:
                c.rng = "seeded"
                if c.mode != "eager" and not c.err <= TOLERANCE.get(c.dtype, 1e-3):
                    try:
                        c.err, out = _drawn_as_eager(c, model, inputs(), ref, device), None
                        c.rng = "seeded, fallback_random"
                    except Exception as e:  # the check's own compile failed: the seeded comparison stands
                        c.rng = f"seeded (the fallback_random check failed: {env.first_line(e, 120)})"
            # A list of detections is judged by matched detections: a reorder of near-tied scores is not an error.
            out = out if reference.compare else None
            c.matched = None if out is None else matched_fraction(out, ref, IOU_MIN.get(c.dtype, 0.8),
                                                                    TOLERANCE.get(c.dtype, 1e-3))  # fmt: skip
            if c.matched is None and out is not None and (same := integer_match(out, ref)) is not None:
                c.matched, c.matched_min = same, 1.0  # token ids, labels: equal or not, element by element
            c.peak = peak_memory(lambda: x.call(fn), device)

        def call() -> Any:  # inference, whoever calls it: under grad mode a compiled row would compile again
            with torch.no_grad(), c.policies():
                return x.call(fn)

        c.fn = call
    except Exception as e:  # a mode that fails to compile or run is a result, not a crash of the doctor
        c.error = env.first_line(e, 300)
        if c.mode in PRESETS and PRESETS[c.mode].fullgraph and isinstance(e, torch._dynamo.exc.Unsupported):
            c.error = f"{c.mode} compiles one graph (fullgraph=True), and this model breaks: {c.error}"


def in_eval(model: nn.Module, stack: contextlib.ExitStack) -> str:
    """`model` in eval mode until `stack` closes, each submodule's own mode then put back (the user's model is
    theirs: the doctor and tune measure inference, as fullgraph.compile runs it). Returns a note when it was
    training anywhere, "" otherwise."""
    modes = [(m, m.training) for m in model.modules()]
    stack.callback(lambda: [m.train(t) for m, t in modes])
    model.eval()
    if not any(t for _, t in modes):
        return ""
    return ("the model was in training mode: it was measured in eval mode (inference, as fullgraph.compile runs it: "
            "dropout off, batch norm on its running statistics) and put back in training mode after")  # fmt: skip


@dataclass(frozen=True)
class Reference:
    """Eager float32's output, which every row is checked against, and what the doctor learnt getting it."""

    out: Any
    random: bool = False  # the model draws random numbers in forward: check calls are seeded (diagnose.rng)
    written: tuple[str, ...] = ()  # the inputs its forward writes into in place: each check call gets fresh ones
    notes: tuple[str, ...] = ()  # what a reader must know about the comparison
    compare: str = "output"  # what is compared: "output", "buffers" (a forward returning none), "" (nothing)

    def result(self, fn: Callable, out: Any) -> Any:
        return _judged(self.compare, fn, out)


def _judged(compare: str, fn: Callable, out: Any) -> Any:
    """What a call of `fn` is judged by: its output, or the model's buffers after the call where the forward returns
    no tensor and writes its results into them (`compare` "buffers")."""
    if compare == "buffers" and isinstance(fn, nn.Module):
        return [b.detach().clone() for b in fn.buffers()]
    return out


def reference(ref_model: Callable, example: Example, device: torch.device) -> Reference:
    """Eager float32's output for `example`, called twice on inputs of its own: the random numbers one call draws
    and the inputs it writes into are read first (diagnose.rng, Example.written); a model that draws is called
    seeded, one that writes gets fresh inputs each call; a second call that still differs from the first is said."""
    x = example.cast(torch.float32)
    draws: list = []
    written = tuple(x.written(lambda copy: draws.extend(random_draws(lambda: copy.call(ref_model)))))
    random = bool(draws)
    outs, notes, compare = [], [], "output"
    for i in range(2):
        with torch.no_grad(), maybe_seeded(device, random):
            out = (x.fresh() if written else x).call(ref_model)
        if i == 0 and not flat_tensors(out):  # a forward that returns none: the buffers it writes, if it has any
            buffers = list(ref_model.buffers()) if isinstance(ref_model, nn.Module) else []
            compare = "buffers" if buffers else ""
            notes.append(
                f"forward returns no tensor ({type(out).__name__}): "
                + (f"each row is judged by the model's {len(buffers)} buffer(s) after its check call, where such a "
                   "forward writes its results" if buffers else
                   "nothing to compare, so rows are timed but their numerics are not checked, and none is "
                   "recommended")
            )  # fmt: skip
        outs.append(_judged(compare, ref_model, out))
    drift = rel_err(outs[1], outs[0]) if compare else 0.0
    tol = TOLERANCE[torch.float32]
    if written:
        notes.append(
            f"forward writes into its input{'s' * (len(written) > 1)} {', '.join(written)} in place: the doctor "
            "works on copies (yours are unchanged), every check call gets fresh ones, and each row times its calls "
            "on a copy of its own, which its writes keep changing, as a loop over one tensor would"
        )
    if random:
        note = (
            f"the model draws random numbers in forward ({describe(draws)}): each row's output is checked with "
            "torch's generators seeded as the reference's were (rel err marked seeded); compiled code draws its own "
            "numbers, so a compiled row that differs is checked again through a compile with "
            "torch._inductor.config.fallback_random=True, which draws as eager does (marked fallback_random), its "
            "timing still the row's own code"
        )
        if not drift <= tol:
            note += f"; seeded, eager float32 still gave another output on its second call (rel err {drift:.1e})"
        notes.append(note)
    elif not drift <= tol:
        notes.append(
            f"eager float32 gave another output for the same inputs on its second call (rel err {drift:.1e}) and "
            "draws no random numbers: the model keeps state across calls or runs nondeterministic kernels, so rows "
            "differ from the reference by that much at least"
        )
    return Reference(outs[0], random, written, tuple(notes), compare)


def _drawn_as_eager(c: Candidate, model: Callable, x: Example, ref: Any, device: torch.device) -> float:
    """The relative error of row `c`'s compiled code when it draws random numbers as eager does: compiled again
    with Inductor's `fallback_random` (torch's own random ops, consuming the seeded generator as eager does) and
    called seeded. One more compile, for the check only: the row's timing stays its own code's."""
    check = build(model, c.mode, c.dtype, c.rewrites_off, options={"fallback_random": True})
    with maybe_seeded(device, True):
        return rel_err(x.call(check), ref)  # (a forward drawing numbers returns them: compare == "output")


def plain_twins(cands: Sequence[Candidate]) -> list[Candidate]:
    """For each compiled row whose compile applied graph rewrites, the same row with rewrites=[]: plain
    torch.compile's graph in the same mode, timed beside it, so the report shows what the rewrites bought."""
    return [Candidate(c.mode, c.dtype, c.ops, rewrites_off=True, fixes=c.fixes) for c in cands
            if c.rewrites and c.error is None and not c.rewrites_off]  # fmt: skip


def with_fixes(cands: Sequence[Candidate], names: Sequence[str]) -> list[Candidate]:
    """Each row again with our fixes `names` applied ("compile default bf16 with nms"), timed beside it."""
    return [Candidate(c.mode, c.dtype, c.ops, fixes=tuple(names)) for c in cands] if names else []


def time_rounds(
    cands: Sequence[Candidate], device: torch.device, reps: int, rounds: int = ROUNDS, deadline: float | None = None
) -> int:
    """Time every ready candidate in `rounds` interleaved rounds of about reps/rounds calls each, rotating the
    order so no configuration always runs first after another's burst. With a `deadline` (time.monotonic()), the
    first round always runs, and no later one starts that the last round's length says would end past it; where
    the rows' warm call times (`call_s`) say the rounds cannot all fit, each round times fewer calls (`fit_calls`).
    Returns the rounds run."""
    ready = [c for c in cands if c.fn is not None and c.error is None]
    warmup, per_round = fit_calls(ready, calls_per_round(reps, rounds), rounds, deadline)
    done, last = 0, 0.0
    for r in range(rounds):
        if deadline is not None and done and time.monotonic() + last > deadline:
            break
        began = time.monotonic()
        for c in ready[r % len(ready) :] + ready[: r % len(ready)] if ready else []:
            if c.error is not None:
                continue
            try:
                with torch.no_grad():
                    t = measure(c.fn, device=device, warmup=warmup, reps=per_round)
            except Exception as e:
                c.error = env.first_line(e, 300)
                continue
            c.samples.extend(t.samples_ms)
            c.round_medians.append(t.median_ms)
        done, last = done + 1, time.monotonic() - began
    return done


def calls_per_round(reps: int, rounds: int = ROUNDS) -> int:
    """The calls timed per row and round when nothing cuts them: `reps` spread over the rounds, MIN_PER_ROUND at
    least."""
    return max(MIN_PER_ROUND, -(-reps // rounds))


def fit_calls(ready: Sequence[Candidate], per_round: int, rounds: int, deadline: float | None) -> tuple[int, int]:
    """(warm-up calls, timed calls) per row and round: one and `per_round` where `rounds` rounds of them fit before
    `deadline` by the rows' warm call times, or nothing says otherwise; else fewer timed calls (one at least), and
    no warm-up where not even two calls a row fit (every row was called three times already when it was checked)."""
    call_s = sum(c.call_s or 0.0 for c in ready)
    if deadline is None or call_s <= 0:
        return 1, per_round
    fits = max(deadline - time.monotonic(), 0.0) / call_s  # calls of every row that fit
    if fits >= rounds * (1 + per_round):
        return 1, per_round
    return (1 if fits >= 2 else 0), max(1, int(fits // rounds) - 1)


def measure_all(
    cands: Sequence[Candidate], device: torch.device, reps: int, deadline: float | None = None
) -> list[ConfigResult]:
    """Interleaved rounds; while a row is noisy, every row is measured again (fresh rounds, so rows stay paired
    round by round), MEASURES times at most, and rows still noisy are marked. A transient stall (another process's
    burst, a page-cache flush) rarely spoils three measurements in a row; a busy core spoils them all. With a
    `deadline`, rounds stop there (one at least: each result's `rounds` says how many ran) and a noisy measurement
    is repeated only where the first one's length still fits."""
    began = time.monotonic()
    time_rounds(cands, device, reps, deadline=deadline)
    took = time.monotonic() - began
    for _ in range(MEASURES - 1):
        if not any(c.noisy() for c in cands) or (deadline is not None and time.monotonic() + took > deadline):
            break
        for c in cands:
            c.samples, c.round_medians = [], []
        time_rounds(cands, device, reps)
    return [c.result(noisy=c.noisy()) for c in cands]


def timed_per_round(cands: Sequence[Candidate]) -> int:
    """The timed calls of each row in each round (fewer than asked where a budget made room: `fit_calls`)."""
    return max((len(c.samples) // len(c.round_medians) for c in cands if c.round_medians), default=0)


def budget_timing_note(cands: Sequence[Candidate], reps: int, budget: float | None) -> list[str]:
    """The note that a budget cut the timing short (fewer rounds, or fewer calls in each), or none."""
    rounds = max((len(c.round_medians) for c in cands), default=0)
    per_round = timed_per_round(cands)
    if budget is None or not (0 < rounds < ROUNDS or 0 < per_round < calls_per_round(reps)):
        return []
    return [
        f"--budget {budget:g} s ran out while timing: {rounds} of {ROUNDS} interleaved rounds ran, {per_round} timed"
        " call(s) a row in each, so each row's figures rest on fewer calls; raise --budget for all of them"
    ]


def _lead_within_noise(fast: ConfigResult, slow: ConfigResult) -> bool:
    """True when `fast`'s lead over `slow` is not established: under 3%, inside the overlap of their p20-p80 ranges,
    or `fast` not ahead in every round (rounds are interleaved, so a busy spell slows both rows of a round: a lead
    that holds round by round is the machine's, not the moment's). When either row is noisy, `slow`'s p20 must also
    clear `fast`'s p80 by the noise threshold itself (NOISY_P80_P20): a noisy row is never beaten by its noise, but
    a lead several times larger than any noise measured (BERT on the H200: 1.86 ms against a noisy 6.5) stands."""
    lead = slow.median_ms / fast.median_ms - 1
    paired = len(fast.round_ms) == len(slow.round_ms) > 0
    lost_a_round = paired and any(s <= f for f, s in zip(fast.round_ms, slow.round_ms, strict=True))
    margin = NOISY_P80_P20 if slow.noisy or fast.noisy else 1.0
    return lead <= TIE or slow.p20_ms <= fast.p80_ms * margin or lost_a_round


def simplicity(c: ConfigResult) -> tuple:
    """Sort key, simplest first: the mode (eager < default < reduce-overhead < max-autotune, a preset just after its
    mode), then the dtype (fp32 first), then the op policies (the defaults before any override), then graph rewrites
    (a row without them before its twin with them: rewrites are recommended only where they win beyond noise)."""
    return SIMPLICITY.get(c.mode, 9), DTYPE_SIMPLICITY.get(c.dtype, 9), len(c.ops), bool(c.rewrites)


def recommend(configs: Sequence[ConfigResult], breaks: str = "", module: bool = True) -> Recommendation | None:
    """The fastest row within tolerance, or, when others are within 3% or within noise of it, the simplest of
    them (eager < default < reduce-overhead < max-autotune; fp32 before bf16), named as a tie. `breaks` is the
    report's count of graph breaks in its one wording ("8 graph breaks at 2 places"), "" when there are none.

    Rows run with our fixes ("... with nms") are measured beside the rows as written, never recommended: the
    recommendation is code a user pastes (or preset='auto' reads), and a fix is a context around the call."""
    configs = [c for c in configs if not c.fixes]
    ok = [c for c in configs if c.ok and c.median_ms]
    if not ok:
        return None
    fastest = min(ok, key=lambda c: c.median_ms)
    tied = [c for c in ok if c is not fastest and _lead_within_noise(fastest, c)]
    pick = min([fastest, *tied], key=simplicity)
    tie = [c.name for c in [fastest, *tied] if c is not pick]
    eager = [c for c in configs if c.mode == "eager" and c.median_ms]
    base = next((c for c in eager if c.dtype == "fp32"), eager[0] if eager else None)
    speedup = None
    if base is not None and pick.mode != "eager" and not _lead_within_noise(pick, base):
        speedup = base.median_ms / pick.median_ms
    others = [c.name for c in ok if c is not pick]
    if tie:
        reason = f"tie: {', '.join(tie)} within {TIE:.0%} or within noise of it; the simplest is recommended"
    elif others:
        reason = f"the fastest within tolerance, ahead of {', '.join(others)} by more than their spread"
    else:
        reason = "the only configuration that ran within tolerance"
    code = _code(pick, breaks, module, compiled=[c for c in ok if c.mode != "eager"])
    return Recommendation(pick.name, speedup, code, base.name if base else None, tie, reason)


def _code(pick: ConfigResult, breaks: str, module: bool = True, compiled: Sequence[ConfigResult] = ()) -> str:
    """The code that reproduces `pick`: a `fullgraph.compile(...)` call for a compiled row of a module (it casts
    the inputs, runs under no_grad and keeps the doctor's mode), torch.compile for a function. For an eager pick,
    the comment names the `compiled` rows (those that ran within tolerance) it rests on, and claims nothing about
    compiling when none ran."""
    dtype = str(DTYPES.get(pick.dtype, pick.dtype))  # "torch.bfloat16"
    if pick.mode != "eager" and module:
        cast = "" if pick.dtype == "fp32" else f", dtype={dtype}"
        how = f'"{pick.mode}"' if pick.mode in PRESETS else f'mode="{pick.mode}"'
        off = ", rewrites=[]" if pick.rewrites_off else ""
        return f"model = fullgraph.compile(model, {how}{off}{cast})\ny = model(*args, **kwargs)"
    cast = "" if pick.dtype == "fp32" else f"model = model.to({dtype})  # and cast floating inputs to {dtype}\n"
    if pick.mode != "eager":
        call = f'model = torch.compile(model, mode="{mode_of(pick.mode)}")\n'
    elif not compiled:
        split = f"; its {breaks} would split the compiled graph" if breaks else ""
        call = f"# no compiled configuration ran within tolerance, so nothing here says whether compiling pays{split}\n"
    elif breaks:  # compiling did not pay as written: the breaks are the first thing to fix
        call = f"# compiling ({_names(compiled)}) did not beat {pick.name} as written: remove its {breaks} first\n"
    else:
        call = f"# compiling ({_names(compiled)}) did not beat {pick.name} at these inputs: run it eagerly\n"
    return f"{cast}{call}with torch.no_grad():\n    y = model(*args, **kwargs)"


def _names(rows: Sequence[ConfigResult]) -> str:
    return ", ".join(c.name for c in rows)


def plan(
    modes: Sequence[str], dtypes: Sequence[torch.dtype], budget_s: float | None, base_compile_s: float
) -> tuple[list[Candidate], list[str]]:
    """The candidates in order of expected compile cost, and those skipped under the budget (slowest first),
    from the seconds a plain compile (Dynamo capture) took on this model."""
    cands = sorted(
        (Candidate(m, d) for d in dtypes for m in modes),
        key=lambda c: (COST.get(mode_of(c.mode), 1.0), list(dtypes).index(c.dtype)),
    )
    if budget_s is None:
        return cands, []
    kept, skipped, spent = [], [], 0.0
    for c in cands:
        cost = COST.get(mode_of(c.mode), 1.0) * max(base_compile_s, 1.0) * 1.5 + 1.0  # compile, checks, timing
        if c.mode != "eager" and spent + cost > budget_s:  # eager is the baseline every row is weighed against
            skipped.append(f"{c.name} (about {cost:.0f} s)")
            continue
        kept.append(c)
        spent += cost
    return kept, skipped


def run_budgeted(cands: Sequence[Candidate], deadline: float | None, step: Callable[[Candidate], None]) -> list[str]:
    """Run `step` on each candidate until `deadline` (time.monotonic()); the rest are marked skipped."""
    skipped = []
    for c in cands:
        if deadline is not None and time.monotonic() > deadline and c.mode != "eager":
            c.error = "skipped: the --budget ran out"
            skipped.append(c.name)
            continue
        step(c)
    return skipped
