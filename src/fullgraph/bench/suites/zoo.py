"""Suite `zoo`: models we did not write (timm, transformers, torchvision), plain `torch.compile` against
`fullgraph.compile` with its graph rewrites, per model, batch size and compile mode (issue 33).

A point is a model at one batch size in one mode. At each point, four variants of the same weights, in the compute
dtype: eager; plain `torch.compile(model, mode=...)`, what users run; "plain again", a second instance of the model
under a second plain `torch.compile`, whose ratio to the first is the point's noise floor; and
`fullgraph.compile(model, preset, mode=..., rewrites=...)` (preset dev by default: its only difference from plain
is the rewrites). Latency: the median of ROUNDS interleaved rounds, on a GPU as many more as fit in a few seconds
(`TIMING_BUDGET_S`; `timing.round_medians`, CUDA events or the CPU
clock), the compiled variants in rounds of their own and eager in its own, as suite `dit` does; Dynamo's caches are
reset before each point, so each point compiles its variants afresh. Error: the relative (Frobenius) error of each
variant's output (a ModelOutput's `last_hidden_state`) against the model's eager float32 output, computed once per
model and batch with TF32 off. The rewrites applied: `CompiledModel.stats.rewrite_counts()`.

The verdict (`is_loss`, the issue's noise rule): fullgraph loses a point when its speed-up over plain is below 0.99
and below that point's "plain again" ratio, both paired round by round (`Point.over_plain`; each round's median is
a row, `round_ms_NN`). The summary gives the median speed-up over all points and over the
points where a rewrite applied. A model whose library is missing is skipped with one line naming the package; a
point that fails is reported in its place and the others still run (the command then exits 1).

Defaults: on a GPU every model of `zoo_models.MODELS` at its two batch sizes, bf16, modes default and
reduce-overhead; `--small` runs the stand-ins of `zoo_models.SMALL` (a CPU run in seconds), fp32 on the CPU.
docs/zoo.md explains the columns.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import fullgraph.compile
from fullgraph.bench.prewarm import no_kept_autotuning, run_children
from fullgraph.bench.results import Result, make_rows, read_csv
from fullgraph.bench.suites import (
    DTYPES,
    NOISE,
    ROUND_METRIC,
    is_loss,
    latest_runs,
    paired_speed,
    parse_sizes,
    rel_err,
    round_series,
    timing_budget,
)
from fullgraph.bench.suites.vit import parse_modes
from fullgraph.bench.suites.zoo_models import MODELS, SMALL, Entry, import_library, primary_output, redraw_zero_weights
from fullgraph.bench.table import format_table
from fullgraph.compile.rewrites import check_spec
from fullgraph.env import first_line
from fullgraph.errors import UsageError
from fullgraph.timing import resolve_device, round_medians

ROUNDS = 5
COMPILED = ("plain", "plain again", "fullgraph")
VARIANTS = ("eager", *COMPILED)
SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass
class Point:
    """One measured point: the medians and errors of each variant, and what fullgraph.compile rewrote."""

    model: str
    batch: int
    mode: str
    ms: dict[str, float] = field(default_factory=dict)  # variant -> median of its round medians
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # variant -> (lowest, highest) round
    rounds: dict[str, list[float]] = field(default_factory=dict)  # variant -> its round medians, in round order
    errors: dict[str, float] = field(default_factory=dict)
    rewrites: dict[str, int] = field(default_factory=dict)
    # compiled variant -> (graphs, graph breaks) its first call compiled: a variant split where another is not.
    # "plain again" compiles none: Dynamo runs plain's code for another instance of its class under its backend
    graphs: dict[str, tuple[int, int]] = field(default_factory=dict)
    compiled_while_timed: int = 0  # graphs compiled during the timed rounds (any variant): then the times mislead
    fell_back: str | None = None  # why fullgraph.compile ran the model eagerly, if it did

    @property
    def case(self) -> str:
        return f"{self.model} b{self.batch} {self.mode}"

    def over_plain(self, name: str) -> float:
        """`name`'s speed over plain (above 1 is faster), paired round by round where both kept their rounds
        (`suites.paired_speed`: a slow spell of the host slows both variants of a round alike), else plain's median
        over its median (rows from before rounds were kept)."""
        return paired_speed(self.rounds.get("plain") or [self.ms["plain"]], self.rounds.get(name) or [self.ms[name]])

    @property
    def speedup(self) -> float:
        return self.over_plain("fullgraph")

    @property
    def again(self) -> float:
        return self.over_plain("plain again")

    @property
    def loss(self) -> bool:
        return is_loss(self.speedup, self.again)

    def notes(self) -> list[str]:
        """What makes this point's comparison suspect: fullgraph's model split where plain's is not, compiles during
        the timed rounds, an eager fallback."""
        said = []
        if "fullgraph" in self.graphs and "plain" in self.graphs and self.graphs["fullgraph"] != self.graphs["plain"]:
            (g, b), (pg, pb) = self.graphs["fullgraph"], self.graphs["plain"]
            said.append(f"{self.case}: fullgraph compiled {g} graph(s) with {b} break(s), plain {pg} with {pb}")
        if self.compiled_while_timed:
            said.append(f"{self.case}: {self.compiled_while_timed} graph(s) compiled during the timed rounds")
        if self.fell_back:
            said.append(f"{self.case}: fullgraph.compile ran the model eagerly: {self.fell_back}")
        return said

    def rewrite_text(self) -> str:
        return ",".join(f"{name}={n}" for name, n in self.rewrites.items()) or "none"


def select(spec: str | None, small: bool) -> list[Entry]:
    """--models: model names or library names (timm, transformers, torchvision; small), in the catalog's order."""
    catalog = SMALL if small else MODELS
    if not spec:
        return list(catalog)
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    known = {e.name for e in catalog} | {e.name.split("/")[0] for e in catalog}
    bad = [w for w in wanted if w not in known]
    if bad or not wanted:
        raise UsageError(f"--models: unknown {', '.join(bad) or repr(spec)}; choose from {', '.join(sorted(known))}")
    return [e for e in catalog if e.name in wanted or e.name.split("/")[0] in wanted]


def parse_batches(spec: str | None, entries: list[Entry]) -> dict[str, tuple[int, ...]]:
    """--batches: "4,64" for every model, or per model (or library) "timm/resnet50=1,32;transformers=2,16"; the
    models not named keep their own batch sizes."""
    out = {e.name: e.batches for e in entries}
    if not spec:
        return out
    if "=" not in spec:
        return dict.fromkeys(out, parse_sizes("--batches", spec, "sizes like 4,64"))
    for item in (s.strip() for s in spec.split(";") if s.strip()):
        key, _, sizes = item.partition("=")
        names = [e.name for e in entries if key.strip() in (e.name, e.name.split("/")[0])]
        if not names:
            raise UsageError(f"--batches: {key.strip()!r} is none of the models run ({', '.join(out)})")
        out |= dict.fromkeys(names, parse_sizes("--batches", sizes, "model=4,64;other=1,8"))
    return out


def parse_rewrites(spec: str | None) -> str | tuple[str, ...]:
    """--rewrites as fullgraph.compile's `rewrites=`: auto (default), none (()), or names separated by commas."""
    if spec in (None, "auto"):
        return "auto"
    return check_spec([] if spec == "none" else [s.strip() for s in spec.split(",") if s.strip()])


@contextlib.contextmanager
def full_fp32():
    """Convolutions and matmuls in full float32 (cuDNN runs float32 convolutions in TF32 by default): the reference."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _to(inputs: tuple[tuple, dict], device: torch.device, dtype: torch.dtype) -> tuple[tuple, dict]:
    """(args, kwargs) on `device`, floating tensors in `dtype` (token ids and masks keep theirs)."""

    def move(t):
        return t.to(device, dtype) if t.is_floating_point() else t.to(device)

    args, kwargs = inputs
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _rel_err(out, expected: torch.Tensor) -> float:
    return rel_err(primary_output(out), expected)


@dataclass(frozen=True)
class Settings:
    """How every point is measured, from the command line."""

    device: torch.device
    dtype: torch.dtype
    modes: tuple[str, ...]
    reps: int
    preset: str
    rewrites: str | tuple[str, ...]  # fullgraph.compile's rewrites=: "auto", or names (none: ())
    approximate_gelu: bool

    def params(self) -> dict:
        asked = self.rewrites if isinstance(self.rewrites, str) else ",".join(self.rewrites) or "none"
        return {"dtype": SHORT[self.dtype], "preset": self.preset, "rewrites_asked": asked,
                "approximate_gelu": self.approximate_gelu}  # fmt: skip


class Progress:
    """A line per step to stderr: seconds since the start, the point's number of all, the point, what runs."""

    def __init__(self, total: int) -> None:
        self.start, self.done, self.total = time.monotonic(), 0, total

    def __call__(self, case: str, what: str) -> None:
        elapsed = time.monotonic() - self.start
        print(f"[{elapsed:7.1f}s] zoo {self.done}/{self.total} {case}: {what}", file=sys.stderr, flush=True)


def run(args, save: Callable[[list[Result]], None] | None = None) -> tuple[list[Result], str, str | None]:
    """Each selected model's points; `save` (the command line's) takes each point's rows as it finishes."""
    if args.from_csv:
        return from_csv(args.from_csv.split(","))
    no_kept_autotuning()  # a prewarm child's (bench.prewarm)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    settings = Settings(device, DTYPES[args.dtype or ("bf16" if gpu else "fp32")], parse_modes(args.modes, gpu),
                        args.reps, fullgraph.compile.get_preset(args.preset).name, parse_rewrites(args.rewrites),
                        bool(args.approximate_gelu))  # fmt: skip
    entries = select(args.models, args.small)
    batches = parse_batches(args.batches, entries)
    libraries = {lib: import_library(lib) for lib in dict.fromkeys(e.library for e in entries)}
    notes = []
    for lib, (_, why) in libraries.items():
        if why:
            notes.append(f"skipped {', '.join(e.name for e in entries if e.library == lib)}: {why}")
            print(f"zoo: {notes[-1]}", file=sys.stderr, flush=True)
    runnable = [e for e in entries if not libraries[e.library][1]]
    if getattr(args, "prewarm", 0):
        run_children([(e.name, _warm_argv(args, e.name, device)) for e in runnable], args.prewarm)
    progress = Progress(sum(len(batches[e.name]) * len(settings.modes) for e in runnable))
    rows: list[Result] = []
    points: list[Point] = []
    table: list[list] = []
    failed: list[str] = []
    for entry in runnable:
        for batch, mode, outcome in _model_points(entry, libraries[entry.library][0], batches[entry.name], settings,
                                                  progress):  # fmt: skip
            if isinstance(outcome, Point):
                points.append(outcome)
                done = _rows(outcome, {"library": entry.library or "none", **settings.params()})
                rows += done
                if save is not None:
                    save(done)
                table.append(_table_row(outcome))
            else:  # reported in its place; the other points still run
                failed.append(f"{entry.name}" + (f" b{batch} {mode}" if batch else "") + f": {outcome}")
                table.append([entry.name, batch, mode, *[None] * 9, f"failed: {outcome[:100]}", ""])
        _release(gpu)
    text = "\n".join([*notes, format_table(HEADERS, table), *summary_lines(points, failed)])
    rows += _summary_rows(points, failed, settings.params())
    return rows, text, (f"{len(failed)} point(s) failed: {failed[0]}" if failed else None)


def _warm_argv(args, name: str, device: torch.device) -> list[str]:
    """The command that runs model `name`'s points as this run will, once per round, keeping nothing (--prewarm)."""
    argv = [sys.executable, "-m", "fullgraph", "bench", "zoo", "--models", name, "--reps", "1", "--csv", os.devnull,
            "--device", str(device), "--preset", args.preset, "--rewrites", args.rewrites]  # fmt: skip
    for flag, value in (("--batches", args.batches), ("--modes", args.modes), ("--dtype", args.dtype)):
        argv += [flag, value] if value else []
    return argv + ["--approximate-gelu"] * bool(args.approximate_gelu) + ["--small"] * bool(args.small)


def _model_points(entry: Entry, library, batches: tuple[int, ...], settings: Settings, progress: Progress):
    """(batch, mode, Point) for each of the model's points, or (batch, mode, the error's first line) for a point
    that failed; a model that does not build fails once, as (None, "", why)."""
    try:
        models = _build(entry, library, settings.device, settings.dtype)
    except Exception as e:  # another library version, say: reported, the other models run
        progress.done += len(batches) * len(settings.modes)
        progress(entry.name, f"failed to build: {first_line(e, 150)}")
        yield None, "", f"build: {first_line(e, 150)}"
        return
    for batch in batches:
        torch.manual_seed(batch)
        inputs = entry.inputs(batch)
        expected, why = None, None
        try:
            args32, kwargs32 = _to(inputs, settings.device, torch.float32)
            with torch.no_grad(), full_fp32():
                expected = primary_output(models["reference"](*args32, **kwargs32)).float()
        except Exception as e:  # the reference does not run (memory at a large batch, say): each mode fails
            why = f"reference: {first_line(e, 150)}"
        low = _to(inputs, settings.device, settings.dtype)
        for mode in settings.modes:
            progress.done += 1
            p = Point(entry.name, batch, mode)
            if expected is not None:
                try:
                    _measure(p, models, low, expected, settings, lambda what, case=p.case: progress(case, what))
                except Exception as e:
                    why = first_line(e, 150)
                else:
                    yield batch, mode, p
                    continue
            progress(p.case, f"failed: {why}")
            yield batch, mode, why


def _build(entry: Entry, library, device: torch.device, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    """The float32 reference and three instances in `dtype` with its weights: plain (also eager), plain again,
    and the one fullgraph.compile compiles."""
    torch.manual_seed(0)
    reference = entry.build(library).eval()
    redraw_zero_weights(reference)  # a classifier started at zero (torchvision's ViT) would judge nothing
    reference = reference.to(device)
    plain = copy.deepcopy(reference).to(dtype)
    return {"reference": reference, "plain": plain, "plain again": copy.deepcopy(plain),
            "fullgraph": copy.deepcopy(plain)}  # fmt: skip


def _measure(p: Point, models: dict, low: tuple[tuple, dict], expected: torch.Tensor, settings: Settings,
             progress) -> None:  # fmt: skip
    """Compile the point's variants afresh, check each output against `expected`, time them interleaved."""
    torch._dynamo.reset()  # each point compiles its variants from empty caches: no automatic dynamic batch size
    mode = None if p.mode == "default" else p.mode
    ours = fullgraph.compile(models["fullgraph"], settings.preset, mode=p.mode, rewrites=settings.rewrites,
                             approximate_gelu=settings.approximate_gelu)  # fmt: skip
    calls = {
        "eager": models["plain"],
        "plain": torch.compile(models["plain"], mode=mode),
        "plain again": torch.compile(models["plain again"], mode=mode),
        "fullgraph": ours,
    }
    a, kw = low
    with torch.no_grad():
        for name, fn in calls.items():
            progress("running eager" if name == "eager" else f"compiling {name}")
            before = _dynamo_counts()
            p.errors[name] = _rel_err(fn(*a, **kw), expected)
            if name != "eager":
                after = _dynamo_counts()
                p.graphs[name] = (after[0] - before[0], after[1] - before[1])
        p.rewrites = ours.stats.rewrite_counts()
        p.fell_back = ours.stats.fell_back
        progress(f"timing ({ROUNDS} rounds or more); rewrites: {p.rewrite_text()}")
        before = _dynamo_counts()
        for group in (COMPILED, ("eager",)):  # eager loads the device another way: rounds of its own
            part = {name: (lambda fn=calls[name]: fn(*a, **kw)) for name in group}
            medians = round_medians(
                part, device=settings.device, rounds=ROUNDS, reps=settings.reps, budget_s=timing_budget(settings.device)
            )
            p.ms |= {name: statistics.median(m) for name, m in medians.items()}
            p.ranges |= {name: (min(m), max(m)) for name, m in medians.items()}
            p.rounds |= medians
        p.compiled_while_timed = _dynamo_counts()[0] - before[0]


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process, by Dynamo's counters."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _release(gpu: bool) -> None:
    torch._dynamo.reset()
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()


def _rows(p: Point, config: dict) -> list[Result]:
    params = {"model": p.model, "batch": p.batch, "mode": p.mode, **config, "rewrites": p.rewrite_text()}
    rows = []
    for name in VARIANTS:
        low, high = p.ranges[name]
        metrics = {"median_ms": (p.ms[name], "ms"), "round_min_ms": (low, "ms"), "round_max_ms": (high, "ms"),
                   "over_plain": (p.over_plain(name), "x"), "rel_err": (p.errors[name], "")}  # fmt: skip
        metrics |= {f"{ROUND_METRIC}{i:02d}": (v, "ms") for i, v in enumerate(p.rounds.get(name, ()))}
        if name in p.graphs:
            metrics["graphs"], metrics["graph_breaks"] = (float(p.graphs[name][0]), ""), (float(p.graphs[name][1]), "")
        if name == "fullgraph":
            metrics["compiled_while_timed"] = (float(p.compiled_while_timed), "")
            metrics["fell_back"] = (float(p.fell_back is not None), "")
            metrics["loss"] = (float(p.loss), "")
            metrics["rewrites_applied"] = (float(sum(p.rewrites.values())), "")
            metrics |= {f"rewrite_{r}": (float(n), "") for r, n in p.rewrites.items()}
        rows += make_rows("zoo", p.case, name, metrics, params)
    return rows


HEADERS = ["model", "batch", "mode", "eager ms", "plain ms", "again ms", "fullgraph ms", "fullgraph / plain",
           "again / plain", "err eager", "err plain", "err fullgraph", "rewrites", "verdict"]  # fmt: skip


def _table_row(p: Point) -> list:
    ms = [p.ms[v] for v in VARIANTS]
    errors = [p.errors[v] for v in ("eager", "plain", "fullgraph")]
    return [p.model, p.batch, p.mode, *ms, p.speedup, p.again, *errors, p.rewrite_text(), "LOSS" if p.loss else ""]


def summary_lines(points: list[Point], failed: list[str]) -> list[str]:
    """The verdict over the run: points, losses by the noise rule, median speed-ups (all points; rewritten ones)."""
    rewritten = [p for p in points if p.rewrites]
    losses = [p.case for p in points if p.loss]
    lines = [f"points: {len(points)} measured" + (f", {len(failed)} failed" if failed else "")]
    lines.append(f"losses (fullgraph / plain < {NOISE} and below the point's plain-again ratio): {len(losses)}"
                 + (f": {', '.join(losses)}" if losses else ""))  # fmt: skip
    if points:
        line = f"median fullgraph / plain: {statistics.median(p.speedup for p in points):.3f}x over all points"
        if rewritten:
            line += f"; {statistics.median(p.speedup for p in rewritten):.3f}x over the {len(rewritten)} points "
            line += "where a rewrite applied"
        else:
            line += "; no rewrite applied at any point"
        lines.append(line)
    lines += [f"  failed: {f}" for f in failed]
    lines += [f"  note: {note}" for p in points for note in p.notes()]
    return lines


def points_from_rows(rows: list[Result]) -> list[Point]:
    """The points of suite zoo's rows (one run's, or its parts'), in their order; a case measured twice keeps its
    last values."""
    points: dict[str, Point] = {}
    for r in rows:
        if r.suite != "zoo" or r.case == "summary":
            continue
        params = json.loads(r.params)
        p = points.setdefault(r.case, Point(params["model"], int(params["batch"]), params["mode"]))
        if r.metric == "median_ms":
            p.ms[r.variant] = r.value
        elif r.metric == "rel_err":
            p.errors[r.variant] = r.value
        elif r.metric in ("round_min_ms", "round_max_ms"):
            low, high = p.ranges.get(r.variant, (r.value, r.value))
            p.ranges[r.variant] = (r.value, high) if r.metric == "round_min_ms" else (low, r.value)
        elif r.metric.startswith("rewrite_"):
            p.rewrites[r.metric.removeprefix("rewrite_")] = int(r.value)
        elif r.metric in ("graphs", "graph_breaks"):
            graphs, breaks = p.graphs.get(r.variant, (0, 0))
            p.graphs[r.variant] = (int(r.value), breaks) if r.metric == "graphs" else (graphs, int(r.value))
        elif r.metric == "compiled_while_timed":
            p.compiled_while_timed = int(r.value)
        elif r.metric == "fell_back" and r.value:
            p.fell_back = "yes (the run's log says why)"
    for (case, variant), rounds in round_series(latest_runs([r for r in rows if r.case in points])).items():
        points[case].rounds[variant] = rounds  # a case measured twice: its last run's rounds
    return [p for p in points.values() if set(p.ms) >= set(VARIANTS) and set(p.errors) >= set(VARIANTS)]


def from_csv(paths: list[str]) -> tuple[list[Result], str, None]:
    """--from-csv: no measurement; the table and summary of the zoo rows in `paths` (the parts of one run, each
    from its own device call), and the summary's rows."""
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise UsageError(f"--from-csv: no file {missing[0]}")
    points = points_from_rows([r for path in paths for r in read_csv(path)])
    text = "\n".join([format_table(HEADERS, [_table_row(p) for p in points]), *summary_lines(points, [])])
    return _summary_rows(points, [], {"from_csv": ",".join(paths)}), text, None


def _summary_rows(points: list[Point], failed: list[str], config: dict) -> list[Result]:
    if not points:
        return []
    rewritten = [p.speedup for p in points if p.rewrites]
    metrics = {"points": (float(len(points)), ""), "failed_points": (float(len(failed)), ""),
               "losses": (float(sum(p.loss for p in points)), ""),
               "median_speedup_all": (statistics.median(p.speedup for p in points), "x")}  # fmt: skip
    if rewritten:
        metrics["median_speedup_rewritten"] = (statistics.median(rewritten), "x")
        metrics["rewritten_points"] = (float(len(rewritten)), "")
    return make_rows("zoo", "summary", "fullgraph", metrics, config)
