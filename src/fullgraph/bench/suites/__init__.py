"""Benchmark suites: each module has `run(args) -> (rows, table)`; `fullgraph bench` declares their arguments."""

from __future__ import annotations

import contextlib
import functools
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fullgraph.env import first_line
from fullgraph.errors import UsageError

# functions, not `fullgraph.ops` itself: the name `ops` here is the ops suite's submodule (fullgraph.bench.suites.ops)
from fullgraph.ops.policies import check_spec, parse_spec, policy, snapshot

if TYPE_CHECKING:
    from fullgraph.bench.results import Result

# --dtype names shared by the suites
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Seconds a group of variants may spend being timed beyond the least rounds (`timing.round_medians`' budget) on a GPU:
# short, host-bound calls get up to 25 rounds for a few seconds, where 5 left their medians a lottery on a noisy host.
# None on the CPU, whose runs are smoke runs (tests), not figures.
TIMING_BUDGET_S = 4.0


def timing_budget(device) -> float | None:
    """TIMING_BUDGET_S on a GPU, None (the least rounds only) elsewhere."""
    from fullgraph.timing import resolve_device

    return TIMING_BUDGET_S if resolve_device(device).type == "cuda" else None


def parse_sizes(flag: str, spec: str, example: str) -> tuple[int, ...]:
    """`--seqs 197,1024`-style lists of positive ints; anything else is one error naming the flag and an example."""
    try:
        sizes = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UsageError(f"{flag}: cannot read {spec!r}; write {example}")
    return sizes


TOP_KERNELS = 8  # kernels listed under each profiled row (--breakdown)


def top_kernel_lines(breakdown, indent: str = "      ") -> list[str]:
    """The kernels behind a profiled breakdown's classes, slowest first (what a change would aim at): one line each,
    "gemm 0.1731 x22 nvjet_... (aten::addmm)"."""
    lines = []
    for k in breakdown.top[:TOP_KERNELS]:
        where = f" ({k.source[:40]})" if k.source else ""
        lines.append(f"{indent}{k.cls} {k.ms:.4f} x{k.calls} {k.name[:56]}{where}")
    return lines


def extra_policies(spec: str | None) -> dict[str, str]:
    """--policies "spec;spec" -> {label: spec}, each spec checked now (FULLGRAPH_OPS syntax, known ops only)."""
    out = {}
    for item in (s.strip() for s in (spec or "").split(";")):
        if item:
            check_spec(item)
            out[item] = item
    return out


def compile_twin(model: torch.nn.Module, mode: str | None = None, **kwargs) -> Callable:
    """`torch.compile(model, mode=mode, **kwargs)` as the twin suites (`dit`, `vit`, the sweep) compile both twins:
    with `fullgraph.trusted_guards` as its guard filter (what `fullgraph.compile` applies, and what docs/ops.md tells
    a user of plain torch.compile on a model built from our ops to pass), so Dynamo does not check the identity of
    fullgraph's own functions on every call. The plain twin gets the same call (it changes nothing there but for
    the plain DiT's own few functions, also ours)."""
    from fullgraph.compile.guards import supported, trusted_code
    from fullgraph.compile.options import mode_options

    if not supported():
        return torch.compile(model, mode=mode, **kwargs)
    return torch.compile(model, options={**mode_options(mode), "guard_filter_fn": trusted_code}, **kwargs)


@functools.cache
def _parsed(spec: str) -> dict:
    return parse_spec(spec)


def policy_context(spec: str | None):
    """The op-policy context a variant's calls run in: none for no spec, and none for "all=auto" while no policy is
    set (what a user who sets none runs; the context's ~10 us of host time per call is the bench's, not the
    model's)."""
    if not spec or (spec == "all=auto" and not snapshot()):
        return contextlib.nullcontext()
    return policy(**_parsed(spec))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error of `out` against a float32 reference (Frobenius norms)."""
    return ((out.float() - ref).norm() / ref.norm()).item()


def time_interleaved(suite: str, point: str, params: dict, variants: dict[str, tuple[Any, str | None]],
                     call: Callable[[Any, str | None], torch.Tensor], expected: torch.Tensor, device: torch.device,
                     reps: int, rounds: int, explain: Callable[[Any, str | None, Exception], str] | None = None,
                     ) -> tuple[list, list[list], set[str]]:  # fmt: skip
    """One point of a twin comparison (suites `dit` and `vit`): each variant's first call (its compile) and error
    against `expected`, then every variant that ran timed in interleaved rounds (`timing.round_medians`, eager
    variants, named "..., eager", in rounds of their own: an eager call loads the GPU another way): at least
    `rounds`, more on a GPU where they fit in TIMING_BUDGET_S. `variants`:
    name -> (callable, op policy), called as `call(fn, policy)` for the first call and as `call(fn, None)` inside
    the policy's context, entered once around each block of timed calls, for the timings; the reference variant is
    "plain, compiled": the "plain compiled / this" column is `paired_speed` against it (row metric "paired_speed";
    `over_plain_compiled` is the ratio of the medians), and each round's median is a row ("round_ms_00", ...) so
    any two variants can be paired later (`sweep.speed_over`). A variant whose first call raises is skipped with the
    reason (`explain(fn, policy, error)`, or the error's first line). Returns the rows, the table lines ([point,
    variant, ms, rounds, plain compiled / this, rel err]) and the names that ran."""
    from fullgraph.bench.results import make_rows
    from fullgraph.timing import round_medians

    rows: list = []
    table: list[list] = []
    errors: dict[str, float] = {}
    live: dict[str, Callable[[], torch.Tensor]] = {}
    for name, (fn, pol) in variants.items():  # first calls compile, one policy at a time
        try:
            out = call(fn, pol)
        except Exception as e:  # e.g. policy "kernel" where no kernel runs (the CPU without TRITON_INTERPRET)
            reason = explain(fn, pol, e) if explain else first_line(e, 120)
            table += [[point, name, None, "", None, None], [point, f"  skipped: {reason}", None, "", None, None]]
            continue
        # timed without a per-call policy context: the variant's policy is set around its block of calls, as a user
        # sets a policy once (`around`), so a variant's calls pay no context the plain twin's do not
        live[name] = lambda fn=fn: call(fn, None)
        errors[name] = rel_err(out, expected)
    medians: dict[str, list[float]] = {}
    for group in (False, True):
        part = {name: fn for name, fn in live.items() if name.endswith(", eager") == group}
        around = {name: functools.partial(policy_context, variants[name][1]) for name in part}
        medians |= round_medians(part, device=device, rounds=rounds, reps=reps, budget_s=timing_budget(device),
                                 around=around)  # fmt: skip
    base = statistics.median(medians["plain, compiled"])
    for name, m in medians.items():
        med = statistics.median(m)
        paired = paired_speed(medians["plain, compiled"], m)
        metrics = {"median_ms": (med, "ms"), "round_min_ms": (min(m), "ms"), "round_max_ms": (max(m), "ms"),
                   "over_plain_compiled": (med / base, "x"), "paired_speed": (paired, "x"),
                   "rel_err": (errors[name], "")}  # fmt: skip
        metrics |= {f"{ROUND_METRIC}{i:02d}": (v, "ms") for i, v in enumerate(m)}
        rows += make_rows(suite, point, name, metrics, params)
        table.append([point, name, med, f"{min(m):.3f}-{max(m):.3f}", paired, errors[name]])
    return rows, table, set(live)


NOISE = 0.99  # issues 32 and 33's noise rule: below this speed over plain a point can be a loss


def is_loss(speed: float | None, again: float | None) -> bool:
    """The noise rule (issues 32 and 33): a speed over plain (above 1 is faster) loses when it is below NOISE and
    below the point's "plain again" speed (a second plain instance against the first: what this point's noise
    alone reads); None (not timed) is no loss, and no "plain again" leaves NOISE alone."""
    return speed is not None and speed < NOISE and (again is None or speed < again)


ROUND_METRIC = "round_ms_"  # + the round's index: a variant's median ms in each interleaved round, in round order


def paired_speed(reference: list[float], this: list[float]) -> float:
    """The speed of `this` over `reference` (above 1 is faster), paired round by round: the median over rounds of
    reference / this within the same round. Both ran in each round one after the other, so a slow spell of the host
    that lasts a round slows both alike and cancels in the pair, where the ratio of the two medians mixes rounds of
    different spells (the H100 hosts' host-bound rounds spread 10-70%, docs/decisions.md, "Paired rounds"). Lists
    of unequal length (rows from before rounds were kept) give the ratio of medians."""
    if len(reference) != len(this) or not this:
        return statistics.median(reference) / statistics.median(this)
    return statistics.median(r / t for r, t in zip(reference, this, strict=True))


def latest_runs(rows: list[Result], wanted: Callable[[list[Result]], bool] = lambda run: True) -> list[Result]:
    """`rows` with each case's last run only (of the runs `wanted` takes): a point measured again (a verify over the
    decision run's file, a part run twice) replaces every row of its earlier run, so no speed pairs one run's variant
    with another's (a verify times 4 variants where the decision run timed 9). A run's rows are one block of the file
    (a point's child writes them together); a block ends where another case starts or a (variant, metric) comes
    again."""
    blocks: list[list[Result]] = []
    seen: set[tuple[str, str]] = set()
    for r in rows:
        if not blocks or blocks[-1][0].case != r.case or (r.variant, r.metric) in seen:
            blocks.append([])
            seen = set()
        blocks[-1].append(r)
        seen.add((r.variant, r.metric))
    last = {block[0].case: i for i, block in enumerate(blocks) if wanted(block)}
    return [r for i, block in enumerate(blocks) if last.get(block[0].case) == i for r in block]


def round_series(rows: list[Result]) -> dict[tuple[str, str], list[float]]:
    """{(case, variant): its round medians in round order} of the rows that carry them (`time_interleaved`); rows
    of one run of each case (`latest_runs`) give one run's rounds."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        if r.metric.startswith(ROUND_METRIC):
            found.setdefault((r.case, r.variant), {})[int(r.metric[len(ROUND_METRIC) :])] = r.value
    return {key: [by_round[i] for i in sorted(by_round)] for key, by_round in found.items()}
