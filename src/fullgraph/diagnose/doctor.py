"""The doctor: lint, graph breaks, recompiles, CUDA-graph skips, every compile mode measured side by side, and
where the time goes, ending with the simplest configuration that is fastest beyond the measured noise and whose
output stays within tolerance of eager float32.

The model is an nn.Module or any callable (a `torch.compile`d function is examined as the function it wraps);
example inputs are positional and keyword arguments of any structure (lists of images, floats, dicts).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fullgraph import env
from fullgraph._capture import capture_output
from fullgraph.bench.breakdown import Breakdown, ceilings_for, profile_breakdown
from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose import dynamo, fixes
from fullgraph.diagnose.checklist import build_checklist
from fullgraph.diagnose.inputs import VARY_DIM, Example
from fullgraph.diagnose.lint_scope import lint_target
from fullgraph.diagnose.report import FixCapture, Report, break_count, break_summary
from fullgraph.diagnose.target import unwrap_compiled
from fullgraph.errors import UsageError
from fullgraph.timing import cpu_threads_available, pinned_threads

GPU_MODES, CPU_MODES, recommend = cfg.GPU_MODES, cfg.CPU_MODES, cfg.recommend
VARY = tuple(VARY_DIM)
# A second new size per --vary kind: the first may recompile once (automatic dynamic), the second must not.
VARY_STEPS = 2


def _variants(example: Example, vary: Sequence[str], notes: list[str]) -> list[tuple[str, Example]]:
    out = [("inputs", example)]
    for kind in vary:
        steps = [example.vary(kind, step) for step in range(1, VARY_STEPS + 1)]
        if steps[0] is None:
            notes.append(f"--vary {kind}: no input carries that dim ({', '.join(example.describe())})")
            continue
        out += [(kind, steps[0]), (f"{kind} (another size)", steps[1])]
    return out


# How a row is profiled: (warm-up calls, profiled calls, CUDA-event timing calls). Under --budget one call is
# profiled: reading the trace costs more than the calls (torchvision's SSDlite, whose eager postprocess loops over
# 91 classes per image: ~56 s for five profiled calls on an H100 where a call takes a fraction of a second).
PROFILE_FULL = (3, 5, 20)
PROFILE_BUDGETED = (1, 1, 5)


def profile_cost(call_s: float, counts: tuple[int, int, int], gpu: bool) -> float:
    """Seconds a row's profile is expected to take, from one call's seconds: the warm-up, the profiled calls at
    about twice their time, and the timed calls on a GPU; reading the trace is not in it (it is measured as the
    rows are profiled, `_profile`)."""
    warmup, calls, reps = counts
    return call_s * (warmup + 2 * calls + ((reps + 1) if gpu else 0))


def _profile(
    rows: Sequence[cfg.Candidate],
    model: Any,
    device: torch.device,
    notes: list[str],
    counts: tuple[int, int, int],
    deadline: float | None,
) -> list[Breakdown]:
    """The breakdown of each of `rows`, in order; a row is not started when the one before it took longer than
    the time left (the trace's reading is most of a profile's cost and only measured by doing it)."""
    out, last_s = [], 0.0
    warmup, calls, reps = counts
    module = model if isinstance(model, nn.Module) else None
    for i, c in enumerate(rows):
        if deadline is not None and i and time.monotonic() + last_s > deadline:
            notes.append(f"the budget ran out before the breakdown of {', '.join(r.name for r in rows[i:])} (the "
                         f"one before it took {last_s:.0f} s)")  # fmt: skip
            break
        start = time.monotonic()
        try:
            ceilings = ceilings_for(device, c.dtype)
            graphs = cfg.mode_of(c.mode) in ("reduce-overhead", "max-autotune")  # the modes that replay CUDA graphs
            bd = profile_breakdown(c.fn, device=device, label=c.name, ceilings=ceilings, dtype=c.dtype, model=module,
                                   cuda_graphs=graphs, calls=calls, warmup=warmup, timing_reps=reps)  # fmt: skip
            out.append(bd)
        except Exception as e:  # the breakdown is advice; its failure must not cost the report
            notes.append(f"breakdown of {c.name}: {env.first_line(e, 200)}")
        last_s = time.monotonic() - start
    return out


def _in_dtype(model: Any, dtype: torch.dtype | None) -> Any:
    """`model` cast (a copy) to `dtype` when its floating parameters are in another one; else `model` itself."""
    params = [p for p in model.parameters() if p.is_floating_point()] if isinstance(model, nn.Module) else []
    if dtype is None or not params or params[0].dtype == dtype:
        return model
    return cfg.build(model, "eager", dtype)


def _capture_with(model: Any, example: Example, dtypes: Sequence[torch.dtype], names: Sequence[str]) -> list:
    """Graph breaks read again with our fixes `names` applied, once per dtype the rows run in (a fix may be what
    lets a dtype run at all: torchvision's NMS kernel has no bf16). Each dtype is read as explain reads it in a fresh
    process: after a reset of Dynamo's caches (a frame that reached torch's recompile limit in an earlier capture
    runs eagerly from then on) and on its own copy of `model` as given (torchvision's poolers set state through a
    break on their first call): the bf16 capture after the fp32 one read 15 breaks on Faster R-CNN, explain 21."""
    out = []
    for i, dtype in enumerate(dtypes):
        torch._dynamo.reset()
        last = i == len(dtypes) - 1
        m = copy.deepcopy(model) if isinstance(model, nn.Module) and not last else model
        try:
            with fixes.applied(names):
                rec, _ = dynamo.capture_breaks(_in_dtype(m, dtype), example.cast(dtype).fresh())
            out.append(FixCapture(cfg.short_dtype(dtype), len(rec.graphs), dynamo.group_breaks(rec.breaks)))
        except Exception as e:  # as without the fixes: a model Dynamo cannot run is a finding
            out.append(FixCapture(cfg.short_dtype(dtype), error=env.first_line(e, 300)))
    return out


def doctor(
    model: Callable,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: str = "",
    modes: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    vary: Sequence[str] = (),
    reps: int = 20,
    budget: float | None = None,
    threads: int | None = None,
    profile: bool = True,
    progress: Callable[[str], None] | None = None,
    with_: Sequence[str] = (),
) -> Report:
    """Examine `model` called as `model(*args, **kwargs)` (inputs already on their device) and return a `Report`.

    `budget` bounds the whole run in seconds, skipping the slowest compile modes first; `threads` pins CPU threads
    (default: the cores no other work is using); `profile` adds where the time goes for eager and the pick.
    `with_` names our fixes (`fullgraph.diagnose.fixes.FIXES`: "nms", "roi_align", "dynamic_output_shapes") to
    measure: every row runs again with them applied ("eager bf16 with nms"), timed beside it, and the graph breaks
    are read again with them, per dtype, after a reset of Dynamo's caches (other compiled functions in the process
    compile again on their next call; a note says so)."""
    with_ = fixes.check_with(with_)
    start = time.monotonic()
    deadline = start + budget if budget else None
    say = progress or (lambda msg: None)
    example = Example.of(args, kwargs).fresh()  # the doctor's own copy: a forward writing into its inputs (see
    # configs.reference) never writes into the user's, and every call that may write gets a fresh copy of this one
    device = example.device
    gpu = device.type == "cuda"
    model = unwrap_compiled(model)
    is_module = isinstance(model, nn.Module)
    modes = tuple(modes or (GPU_MODES if gpu else CPU_MODES))
    cfg.check_modes(modes)
    if not is_module and any(m in cfg.PRESET_ROWS for m in modes):
        raise UsageError("presets compile modules (fullgraph.compile); this model is a function: time modes instead")
    default_dtypes = (
        (torch.float32, torch.bfloat16) if gpu and is_module else (example.floating_dtype() or torch.float32,)
    )
    dtypes = tuple(dtypes or default_dtypes)
    notes: list[str] = []
    if not is_module:
        notes.append("the model is a function: its weights cannot be cast, so a dtype applies to its inputs only")
    if threads is None and not gpu:
        threads, why = cpu_threads_available()
    else:
        why = "pinned by the caller" if threads else "GPU run: torch's default"
    timing = {"threads": threads or torch.get_num_threads(), "threads_why": why, "rounds": cfg.ROUNDS}
    timing["method"] = "cuda-events" if gpu else "cpu-clock"

    # The model's prints are counted, not shown; stderr stays free for a progress callback.
    with contextlib.ExitStack() as stack:
        if is_module and (was_training := cfg.in_eval(model, stack)):
            notes.append(was_training)
        stack.enter_context(pinned_threads(threads))
        captured = stack.enter_context(capture_output(stdout=True, stderr=False))
        say("lint: reading the model's own code")
        findings, lint_notes = lint_target(model)
        notes += lint_notes

        # --with reads the breaks again with our fixes on a copy taken now, before any call: a model that sets state
        # on its first call (torchvision's poolers set their scales, through a break) counts as explain counts it
        fresh = copy.deepcopy(model) if with_ and is_module else model
        say("graph breaks: compiling with a recording backend")
        failed: list[str] = []
        capture_s = time.monotonic()
        # Breaks and recompiles are read in the inputs' dtype: a float32 model given bf16 inputs runs as bf16.
        traced = _in_dtype(model, example.floating_dtype())
        try:
            rec, compiled = dynamo.capture_breaks(traced, example.fresh())
            recompiles = dynamo.first_call_recompiles(rec)
            say("recompiles: calling again" + (f", varying {', '.join(vary)}" if vary else ""))
            recompiles += dynamo.capture_recompiles(compiled, _variants(example.fresh(), vary, notes), rec.own)
        except Exception as e:  # Dynamo cannot trace it at all: that is the finding; eager is still measured
            failed.append(f"Dynamo failed on this model: {env.first_line(e, 300)}")
            rec, recompiles = dynamo.Recorder(), []
        notes += failed
        capture_s = time.monotonic() - capture_s

        reference = cfg.reference(cfg.build(model, "eager", torch.float32), example, device)
        notes += reference.notes
        applied_breaks = []
        if with_:
            # The capture above left its frames in Dynamo's caches: a frame that reached torch's recompile limit there
            # runs eagerly from then on, and its graphs never reach a second recorder (torchvision's detectors: 18
            # graphs with our NMS where explain, after its reset, sees 22; tests/diagnose/test_surfaces.py). Read the
            # breaks with the fixes as explain does: after a reset (one per dtype, _capture_with), under the same
            # limit.
            say(f"graph breaks with {'+'.join(with_)}: resetting Dynamo, compiling again")
            notes.append(f"--with {','.join(with_)}: Dynamo's caches were reset to read the breaks with the fixes as "
                         "a fresh process would; other compiled functions in this process compile again")  # fmt: skip
            applied_breaks = _capture_with(fresh, example, dtypes, with_)
        # Breaks and recompiles above ran under torch's own recompile limit, as explain and a user's torch.compile
        # do (past it a function runs eagerly and its callees compile on their own, which changes the count). Every
        # configuration below compiles the same code objects again: raise the limit for those, so none silently
        # falls back to eager.
        stack.enter_context(dynamo.room_for_recompiles())
        # Rows start while the budget's last TIMING_SHARE is still ahead: that share times them side by side.
        rows_until = None if deadline is None else deadline - budget * cfg.TIMING_SHARE
        remaining = None if rows_until is None else max(rows_until - time.monotonic(), 0.0)
        cands, skipped = cfg.plan(modes, dtypes, remaining, capture_s)
        if skipped:
            notes.append(f"--budget {budget:g} s: skipped {', '.join(skipped)} (slowest first)")
        cands = [row for c in cands for row in (c, *cfg.with_fixes([c], with_))]  # each row beside its twin

        def prepare(c: cfg.Candidate) -> None:
            say(f"{c.name}: {'first call' if c.mode == 'eager' else 'compiling'}")
            with dynamo.cudagraph_skips() as skips:
                cfg.prepare(c, model, example, reference, device)
            cudagraph_skips.extend(f"{c.name}: {s}" for s in skips)

        cudagraph_skips: list[str] = []
        late = cfg.run_budgeted(cands, rows_until, prepare)
        twins = cfg.plain_twins(cands)  # rows whose compile applied rewrites, again without them
        late += cfg.run_budgeted(twins, rows_until, prepare)
        cands = [*cands, *twins]
        if late:
            notes.append(f"--budget {budget:g} s ran out before {', '.join(late)}")
        say(f"timing {len(cands)} configuration(s) in {cfg.ROUNDS} interleaved rounds")
        configs = cfg.measure_all(cands, device, reps, deadline)
        notes += cfg.budget_timing_note(cands, reps, budget)
        timing["rounds"] = max((c.rounds for c in configs), default=0) or cfg.ROUNDS  # fewer where the budget cut
        notes += [f"{c.name}: checked {c.rng}" for c in configs if c.rng.startswith("seeded (")]  # its check failed
        noisy = [c.name for c in configs if c.noisy]
        if noisy:
            notes.append(
                f"noisy timings (p80/p20 > {cfg.NOISY_P80_P20} or rounds spread > {cfg.NOISY_SPREAD:.0%}, measured"
                f" {cfg.MEASURES} times): {', '.join(noisy)}; is the machine busy?"
                " No recommendation rests on their lead"
            )
        breaks = dynamo.group_breaks(rec.breaks)
        count = break_summary(len(rec.graphs), breaks) if break_count(len(rec.graphs), breaks) else ""
        rec_ = cfg.recommend(configs, count, module=is_module)
        breakdowns: list[Breakdown] = []
        names = [c.name for c in configs if c.mode == "eager" and c.median_ms][:1]
        names += [rec_.config] if rec_ and rec_.config not in names else []
        rows = [c for n in names for c in cands if c.name == n and c.fn is not None and c.error is None]
        counts = PROFILE_FULL if deadline is None else PROFILE_BUDGETED
        first = profile_cost(rows[0].call_s or 0.0, counts, gpu) if rows else 0.0
        cost = first + sum(profile_cost(c.call_s or 0.0, counts, gpu) for c in rows[1:])
        if profile and deadline is not None and time.monotonic() + first >= deadline:
            notes.append(
                f"--budget {budget:g} s ran out before where the time goes (profiling"
                + (f", about {cost:.0f} s" if cost >= 1 else "")
                + "); raise --budget to see it"
            )
        elif profile:
            say(f"where the time goes: profiling {', '.join(names)}")
            breakdowns = _profile(rows, model, device, notes, counts, deadline)
            if deadline is not None and breakdowns:
                notes.append(f"--budget: the breakdown profiled {counts[1]} call (a run without --budget profiles "
                             f"{PROFILE_FULL[1]})")  # fmt: skip
    if not gpu:
        notes.append("CPU run: reduce-overhead and max-autotune need CUDA graphs / GPU autotuning; run on a GPU")
    report = Report(
        target=target or getattr(model, "__qualname__", type(model).__name__),
        device=torch.cuda.get_device_name(device) if gpu else "cpu",
        inputs=example.describe(),
        environment={"torch": torch.__version__, "triton": env.triton_version(), "python": sys.version.split()[0]},
        lint=findings,
        graph_count=len(rec.graphs),
        graph_breaks=breaks,
        recompiles=recompiles,
        cudagraph_skips=cudagraph_skips,
        configs=configs,
        recommendation=rec_,
        notes=notes,
        breakdowns=breakdowns,
        output=captured.summary(),
        timing=timing,
        fixes=fixes.offers([*breaks, *(b for c in applied_breaks for b in c.graph_breaks)], configs, failed),
        applied=list(with_),
        applied_breaks=applied_breaks,
    )
    return dataclasses.replace(report, checklist=build_checklist(report, vary, gpu))


__all__ = ["CPU_MODES", "GPU_MODES", "VARY", "doctor", "recommend"]
