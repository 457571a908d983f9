"""Suite `sweep`: the grid of issue 32, each point in a process of its own, and the decision data it implies.

Each point runs an existing suite in a child process (a fresh Dynamo and CUDA state, as a user's process starts):
DiT points run suite `dit`, compiled only (ours `auto` and all `native` against the plain twin, "plain again" as the
noise floor), plus one variant per op of `DECIDED_OPS` with every op native but that op's kernel, the op between
its real neighbours; ViT points run suite `vit`'s twin comparison (`vit.twins`: timm, or the plain twin without
timm, and its second instance, against ours `auto` and all native, with the same variant names). Both compile
modes, default and reduce-overhead. The rows go to the CSV as their suites write them.

`--write-decisions FILE` turns the DiT points' per-op variants into the decision data format (docs/decisions.md;
`fullgraph.ops.measured` reads it): at each point and mode, op X takes its kernel where "all native but X's kernel"
beats "all native" by more than the point's noise (the plain twin's second instance against the first, at least
1%), else the native form. FILE defaults to nothing; the user's own file is `decisions.json` in fullgraph's cache
folder (`fullgraph._paths.cache_dir`), which replaces the committed tables of the GPU it names.

`--small` is the CPU smoke run: one tiny DiT point and one tiny ViT point, default mode.

`--verify` checks decisions already written: DiT points time plain, plain again, ours auto and all native only (4
compiles a point where the one-kernel variants make 8), so it writes no decisions. `--ops OP,...` times the
one-kernel variants of those ops only (with `--verify` too: a verdict and one op measured again in one run), and
`--write-decisions` then writes those ops' points.

`--prewarm JOBS` first runs every selected point once in JOBS child processes at a time, with one call per timing
round and nothing kept, before any point is timed: a timed child then finds its graphs in Inductor's FX-graph and
AOTAutograd caches (on this machine's disk) instead of compiling them, and the compiles, which use the host's
cores, run side by side where the timings cannot run at all. On the CPU a small DiT point went from 47 s cold to
15 s with a warm cache. Each warming child gets a share of Inductor's compile workers (TORCHINDUCTOR_COMPILE_THREADS).

Parts. The whole grid is longer than one sitting on a lent GPU (docs/decisions.md, "How long"): `--deadline SECONDS`
starts no point that the mean point so far says would end past it, and prints the `--only` that runs the rest; with
`--prewarm JOBS` it works in batches of JOBS points, each compiled together and then timed, and starts a batch only
if the mean point so far, its share of the compiles included, says the batch ends in time;
`--from-csv A.csv,B.csv` measures nothing and prints the summary of parts run apart (and writes their decisions with
`--write-decisions`). `--resume` skips the points whose rows the `--csv` file holds already (this GPU and torch
version, at least this run's one-kernel variants and depth: each row's params carry the point that made it), so the
same command, sent again with the same CSV, carries on where a device call ended.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from fullgraph._files import write_atomic_bytes
from fullgraph.bench.prewarm import no_kept_autotuning, run_children
from fullgraph.bench.results import Result, read_csv
from fullgraph.bench.suites import is_loss, latest_runs, paired_speed, round_series
from fullgraph.bench.table import format_table
from fullgraph.errors import UsageError

# (dim, heads) of the DiT configs: head dims 72, 64, 80, 88, 96, 128
DIT_CONFIGS = ((1152, 16), (1536, 24), (1280, 16), (1408, 16), (1536, 16), (3072, 24))
DIT_SHAPES = ((8, 256), (2, 1024), (1, 4096))  # (batch, tokens)
VIDEO = (3072, 24, 1, 16384)  # the long point: (dim, heads, batch, tokens)
VITS = ("vit_b16", "vit_l16", "vit_h14", "vit_small")
VIT_BATCHES = (4, 64)
MODES = ("default", "reduce-overhead")
DEPTH = 4
# The ops a DiT block can take a kernel for under compiled `auto`, each measured as "all native but its kernel".
# sdpa_flash is the blocks' SDPA pinned to FlashAttention: it lost 10-14% at GPU-bound points and gained 2-10% at
# host-bound ones (H100: benchmarks/results/sweep_sdpa_flash_h100.csv, sweep_guard_filter_h100.csv), so its points
# also record tokens per sequence (`measured.TOKEN_KEYED_OPS`): 8 x 256 and 2 x 1024 tokens are both 2048 rows.
DECIDED_OPS = ("linear_gelu", "qk_norm_rope", "layer_norm_modulate", "skinny_linear", "sdpa_flash")
MEASURED_OPS = DECIDED_OPS  # what --ops may name and the decisions read
NATIVE = "ours native, compiled"
AGAIN = "plain again (second instance), compiled"  # the plain twin's second instance: a point's noise floor
MIN_GAIN = 0.01  # a kernel must beat the native form by this much, or by the point's noise if larger
# and must not move the output's error against fp32 by more than this over all native's: the acceptance allows ours
# 1.1x the plain twin's error, and a point can take several kernels (layer_norm_modulate's kernel alone moved it
# 1.06-1.19x while it normalised the rounded residual sum, H100 2026-12-06)
MAX_ERROR_GROWTH = 1.05
# Of suite dit's own variants, what the sweep reads: auto (the verdict) and all native (the decisions' baseline and
# the native-speed check). Its other policies and its eager rows are left out: each is a compile (~15 s at depth 4 on
# the H200), and a point took 2-2.5 min with them.
SWEEP_BASE = ("auto", "native")


@dataclass(frozen=True)
class Point:
    """One child process: a model, its shape and a compile mode."""

    model: str  # "dit" or "vit"
    name: str  # a DiT's "1152x16", a ViT's config name
    batch: int
    tokens: int | None  # DiT only
    mode: str

    @property
    def label(self) -> str:
        size = f"b{self.batch}" + (f" n{self.tokens}" if self.tokens else "")
        return f"{self.model} {self.name} {size} {self.mode}"

    @property
    def dim_heads(self) -> tuple[int, int]:
        """A DiT point's (dim, heads), from its name ("1152x16")."""
        dim, heads = (int(v) for v in self.name.split("x"))
        return dim, heads


def table_mode(compile_mode: str) -> str:
    """The decision data's mode for a compile mode (docs/decisions.md): "graphed" under reduce-overhead's CUDA graphs,
    else "default"."""
    return "graphed" if compile_mode == "reduce-overhead" else "default"


def grid(small: bool, modes: tuple[str, ...] = MODES) -> list[Point]:
    """The sweep's points: issue 32's grid, or for --small one tiny DiT and one tiny ViT point."""
    if small:
        return [Point("dit", "64x4", 1, 16, "default"), Point("vit", "vit_tiny", 2, None, "default")]
    dits = [(d, h, b, n) for d, h in DIT_CONFIGS for b, n in DIT_SHAPES] + [VIDEO]
    points = [Point("dit", f"{d}x{h}", b, n, m) for m in modes for d, h, b, n in dits]
    return points + [Point("vit", v, b, None, m) for m in modes for v in VITS for b in VIT_BATCHES]


def run(args, save: Callable[[list[Result]], None] | None = None) -> tuple[list[Result], str]:
    """The grid's selected points; `save` (the command line's) takes each point's rows as it finishes."""
    if args.from_csv:
        return from_csv(args.from_csv.split(","), args.write_decisions)
    modes = tuple(m.strip() for m in (args.modes or ",".join(MODES)).split(",") if m.strip())
    ops = decided_ops(args)
    if not ops and args.write_decisions:
        raise UsageError("--verify times no one-kernel variant, so it has no decisions to write: drop one of the two, "
                         "or name the ops to measure with --ops")  # fmt: skip
    if bad := [m for m in modes if m not in MODES]:
        raise UsageError(f"--modes: unknown {', '.join(bad)}; choose from {', '.join(MODES)}")
    points = [p for p in grid(args.small, modes) if not args.only or any(s in p.label for s in args.only.split(","))]
    if not points:
        raise UsageError(f"--only {args.only!r} matches no point of the grid")
    if getattr(args, "resume", False):
        done_before = timed_before(args.csv, measured_as(args), {p.label: auto_choices(p, args) for p in points})
        points = [p for p in points if p.label not in done_before]
        print(f"sweep: --resume: {len(done_before)} point(s) of this GPU already in {args.csv}, "
              f"{len(points)} to run", file=sys.stderr, flush=True)  # fmt: skip
        if not points:
            return [], "every selected point is in the CSV already: nothing to run"
    rows: list[Result] = []
    deadline, jobs = args.deadline, getattr(args, "prewarm", 0)
    # Batches: with a prewarm and a deadline, `jobs` points are compiled together, then timed, before the next
    # batch starts (a prewarm of the whole grid alone took longer than one device call: 24 of 54 points warmed in
    # 232 s, H100); a batch starts only if the mean point so far, its compile included, says it ends in time.
    # Without a deadline the prewarm compiles every point at once first; without a prewarm a batch is one point.
    # A point inside a batch is checked too: a batch's later points can be larger than the mean (a 3072-wide point
    # ran 50-70 s where the mean was 30 s), and one started past the deadline outlived the device call (H100,
    # 2026-12-06).
    # A batch that does not fit whole shrinks to the points that do (a call of 520 s stopped at 302 s with 11 points
    # left, its next batch of 8 predicted past the deadline: H100, 2026-12-07).
    # The estimate: the mean timed point so far for each point, and the mean prewarm so far for a batch (a prewarm
    # takes about as long for 3 points as for 8: its compiles run side by side).
    size = (jobs if deadline is not None else len(points)) if jobs else 1
    start = time.monotonic()
    warmed = [0.0, 0]  # seconds spent in prewarms, how many

    def fits(done: int, upcoming: int, warm: bool = False) -> bool:
        if not done or deadline is None:
            return True
        elapsed = time.monotonic() - start
        per_point = (elapsed - warmed[0]) / done
        warm_s = warmed[0] / warmed[1] if warm and warmed[1] else 0.0
        return elapsed + per_point * upcoming + warm_s <= deadline

    batch_end = 0
    for i, p in enumerate(points):
        starts = i >= batch_end
        if starts:  # a batch starts here: the most points, up to `size`, that end in time with their prewarm
            ks = range(min(size, len(points) - i), 0, -1)
            batch_end = i + next((k for k in ks if fits(i, k, warm=bool(jobs))), 0)
        if i >= batch_end or not fits(i, 1):
            rest = ",".join(q.label for q in points[i:])
            print(f"sweep: --deadline {args.deadline:.0f} s: {len(points) - i} point(s) not started; run them with "
                  f"--only '{rest}'", file=sys.stderr, flush=True)  # fmt: skip
            break
        if starts and jobs:
            t0 = time.monotonic()
            prewarm(points[i:batch_end], args, jobs)
            warmed[0], warmed[1] = warmed[0] + time.monotonic() - t0, warmed[1] + 1
        print(f"[{time.monotonic() - start:7.1f}s] sweep {i + 1}/{len(points)}: {p.label}", file=sys.stderr, flush=True)
        done = run_point(p, args)
        rows += done
        if save is not None:
            save(done)
    if args.write_decisions:
        write_decisions(args.write_decisions, rows)
    return rows, summary(rows)


def from_csv(paths: list[str], write_to: str | None) -> tuple[list[Result], str]:
    """--from-csv: no measurement; the summary of the sweep rows in `paths` (parts of the grid run apart), and their
    decision data written to `write_to` when given. The rows are not returned: they are in their files already."""
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise UsageError(f"--from-csv: no file {missing[0]}")
    rows = [r for path in paths for r in read_csv(path)]
    if not any(r.suite in ("dit", "vit") for r in rows):
        raise UsageError(f"--from-csv: no sweep rows (suites dit, vit) in {', '.join(paths)}")
    if write_to:
        write_decisions(write_to, rows)
    return [], summary(rows)


def decided_ops(args) -> tuple[str, ...]:
    """The ops whose one-kernel variant each DiT point times: --ops (of MEASURED_OPS), else all of DECIDED_OPS, none
    with --verify."""
    named = getattr(args, "ops", None)
    if not named:
        return () if getattr(args, "verify", False) else DECIDED_OPS
    ops = tuple(dict.fromkeys(o.strip() for o in named.split(",") if o.strip()))
    if not ops:
        raise UsageError(f"--ops {named!r} names no op; name one or more of {', '.join(MEASURED_OPS)}, or leave it out")
    if bad := [o for o in ops if o not in MEASURED_OPS]:
        raise UsageError(f"--ops: unknown {', '.join(bad)}; choose from {', '.join(MEASURED_OPS)}")
    return ops


def _child(p: Point, args, csv: str, reps: int, warm: bool) -> list[str]:
    spec = {"point": p.__dict__, "device": args.device, "reps": reps, "csv": csv, "small": args.small, "warm": warm,
            **measured_as(args)}  # fmt: skip
    code = "import sys; from fullgraph.bench.suites.sweep import _child_main; _child_main(sys.argv[1])"
    return [sys.executable, "-c", code, json.dumps(spec)]


def prewarm(points: list[Point], args, jobs: int) -> None:
    """Every point once, `jobs` child processes at a time, one call per timing round, nothing written
    (`fullgraph.bench.prewarm`)."""
    run_children([(p.label, _child(p, args, os.devnull, 1, True)) for p in points], jobs)


def run_point(p: Point, args) -> list[Result]:
    """`p` in a child process; its suite's rows (a point that fails is reported, and the sweep goes on)."""
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "point.csv")
        done = subprocess.run(_child(p, args, csv, args.reps, False), check=False)
        if done.returncode != 0:
            print(f"sweep: {p.label} failed (exit {done.returncode})", file=sys.stderr)
            return []
        tag = {"point": p.label, **measured_as(args), "auto": auto_choices(p, args)}
        return [dataclasses.replace(r, params=_tagged(r.params, tag)) for r in read_csv(csv)]


def auto_choices(p: Point, args) -> dict[str, str] | None:
    """What ours `auto` runs at DiT point `p` by the decision data as it is now: each decided op's choice
    (`measured.choice_among` at the point's head dim, width, rows, tokens and mode; this GPU and torch version). A
    row carries it, so a `--verify --resume` counts a point as verified only while its choices stand. None for a ViT
    point (its ops meet the table at their own shapes: verified again every time)."""
    if p.model != "dit":
        return None
    import torch

    from fullgraph.ops import measured

    gpu = torch.cuda.is_available()
    if not gpu:
        return dict.fromkeys(DECIDED_OPS, "native")  # no table speaks for a CPU
    dim, heads = p.dim_heads
    table, gpu_name, torch_mm = measured.points(), measured.gpu_name(None), measured.torch_version()
    return {op: measured.choice_among(table, gpu_name, torch_mm, op, "bf16", dim // heads, dim, p.batch * p.tokens,
                                      table_mode(p.mode), p.tokens)  # bf16: the sweep's GPU dtype (`_child_main`)
            for op in DECIDED_OPS}  # fmt: skip


def measured_as(args) -> dict:
    """What a point's child measures beyond the point itself: the ops whose one-kernel variants it times and the DiT
    depth (the child's spec, and the tag its rows carry for `--resume`)."""
    return {"ops": list(decided_ops(args)), "depth": getattr(args, "depth", None) or DEPTH}


def _tagged(params: str, tag: dict) -> str:
    """A row's params JSON with the sweep's own key added: which point, ops and depth produced it (`--resume`)."""
    return json.dumps({**json.loads(params or "{}"), "sweep": tag}, sort_keys=True, separators=(",", ":"))


def timed_before(csv: str | None, wanted: dict, choices: dict[str, dict | None] | None = None) -> set[str]:
    """The labels of the points that `csv` holds rows of, measured on this machine's GPU and torch version with at
    least the one-kernel variants and at the depth of `wanted` (`measured_as`): what `--resume` skips. A `--verify`
    (no one-kernel variant) counts a point only where its rows' ours `auto` ran the choices it would run now
    (`choices`: label -> `auto_choices`; a ViT point or a row from before rows carried them is verified again): a
    verification stands while the decisions it verified stand."""
    from fullgraph.bench.results import tags

    if not csv or not os.path.exists(csv):
        return set()
    here = tags()
    done = set()
    for r in read_csv(csv):
        tag = json.loads(r.params or "{}").get("sweep")
        if not (tag and (r.gpu, r.torch) == (here["gpu"], here["torch"]) and set(wanted["ops"]) <= set(tag["ops"])
                and (tag["depth"] == wanted["depth"] or r.suite != "dit")):  # fmt: skip
            continue
        if not wanted["ops"] and (tag.get("auto") is None or tag.get("auto") != (choices or {}).get(tag["point"])):
            continue
        done.add(tag["point"])
    return done


def _child_main(spec_json: str) -> None:
    """One point, in the child: the suite's run with the point's arguments, its rows written to spec["csv"]."""
    from fullgraph.bench.results import append_csv

    no_kept_autotuning()  # a prewarm child's (bench.prewarm)
    spec = json.loads(spec_json)
    p = Point(**spec["point"])
    common = {"device": spec["device"], "reps": spec["reps"], "breakdown": False}
    dtype = None if spec["small"] else "bf16"  # the suites' CPU default is fp32
    if p.model == "dit":
        from fullgraph.bench.suites import dit
        from fullgraph.models.dit import CONFIGS, DiTConfig

        dim, heads = p.dim_heads
        depth = spec.get("depth", DEPTH)
        CONFIGS["sweep"] = DiTConfig(dim=dim, heads=heads, depth=depth)  # this process's: the suite takes a name
        policies = ";".join(f"none,+{op}" for op in spec["ops"])
        rope = "video" if (dim, heads, p.batch, p.tokens) == VIDEO else "1d"
        ns = argparse.Namespace(**common, config="sweep", depth=depth, batch=p.batch, tokens=str(p.tokens),
                                mode=p.mode, dtype=dtype, policies=policies, base=SWEEP_BASE, eager=False,
                                rope=rope)  # fmt: skip
        rows, text = dit.run(ns)
    else:
        from fullgraph.bench.suites import vit
        from fullgraph.models.vit import CONFIGS, ViTConfig

        CONFIGS.setdefault("vit_h14", ViTConfig(dim=1280, depth=32, heads=16, patch=14))  # timm's vit_huge_patch14
        ns = argparse.Namespace(**common, config=p.name, batches=str(p.batch), modes=p.mode, dtype=dtype)
        rows, text = vit.twins(ns)
    if spec.get("warm"):  # --prewarm: the compiles were the point
        return
    print(text, flush=True)
    append_csv(spec["csv"], rows)


def ratios(rows: list[Result], metric: str = "median_ms") -> dict[tuple[str, str], float]:
    """{(case, variant): metric} of a suite's rows."""
    return {(r.case, r.variant): r.value for r in rows if r.metric == metric}


def timed_kernels(run: list[Result]) -> bool:
    """Did this run of a point time one-kernel variants (a decision run, not a `--verify`)?"""
    return any(r.variant.startswith("ours none,+") for r in run)


def speed_over(ms: dict, rounds: dict, case: str, reference: str, variant: str) -> float | None:
    """The speed of `variant` over `reference` at `case` (above 1 is faster): `suites.paired_speed` of their rounds,
    a row's median standing for rounds it did not keep; None where either was not timed."""
    ref_ms, this_ms = ms.get((case, reference)), ms.get((case, variant))
    if ref_ms is None or this_ms is None:
        return None
    return paired_speed(rounds.get((case, reference)) or [ref_ms], rounds.get((case, variant)) or [this_ms])


def decisions(rows: list[Result]) -> list[dict]:
    """The decision points of the DiT rows (each point's last run that timed one-kernel variants: `latest_runs`,
    `timed_kernels`): per point, mode and op measured (MEASURED_OPS), "kernel" where all native but that op's kernel
    beat all native (`speed_over`: paired round by round) by more than the point's noise (at least MIN_GAIN) with an
    error against fp32 at most MAX_ERROR_GROWTH times all native's, else "native"."""
    dit_rows = latest_runs([r for r in rows if r.suite == "dit"], timed_kernels)
    ms, errors, rounds = ratios(dit_rows), ratios(dit_rows, "rel_err"), round_series(dit_rows)
    params = {r.case: json.loads(r.params) for r in dit_rows}
    points = []
    for case, p in params.items():
        if (case, NATIVE) not in ms:
            continue
        again = speed_over(ms, rounds, case, "plain, compiled", AGAIN)
        noise = abs(1 - again) if again else 0.0
        for op in MEASURED_OPS:
            variant = f"ours none,+{op}, compiled"
            speed = speed_over(ms, rounds, case, NATIVE, variant)
            if speed is None:
                continue
            gain = speed - 1
            native_err, kernel_err = errors.get((case, NATIVE)), errors.get((case, variant))
            growth = kernel_err / native_err if native_err and kernel_err is not None else 1.0
            fast = gain > max(MIN_GAIN, noise)
            points.append({
                "op": op, "dtype": {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[p["dtype"]],
                "head_dim": p["dim"] // p["heads"], "width": p["dim"], "rows": p["batch"] * p["tokens"],
                "mode": table_mode(p["mode"]),
                "choice": "kernel" if fast and growth <= MAX_ERROR_GROWTH else "native", "tokens": p["tokens"],
                "source": f"bench sweep: {case}, all native but {op}'s kernel {gain:+.1%} over all native "
                          f"(noise {noise:.1%})" + (f", its error {growth:.2f}x all native's" if growth > 1.01 else ""),
            })  # fmt: skip
    return points


def write_decisions(path: str, rows: list[Result]) -> None:
    """The decision points of `rows` written to `path` (format: docs/decisions.md), merged into what the file holds
    already (`merge_points`), so the grid can be measured in parts (`--only`) into one file."""
    from fullgraph.ops.measured import torch_version

    measured_now: dict[tuple[str, str], tuple[str, list[Result]]] = {}
    for r in rows:
        if r.suite == "dit":
            key = (r.gpu, torch_version(r.torch))
            measured_now.setdefault(key, (r.triton, []))[1].append(r)
    tables = {key: (triton, decisions(found)) for key, (triton, found) in measured_now.items()}
    merge_points(path, tables)
    for (gpu, torch_mm), (_, points) in tables.items():
        kernels = sum(p["choice"] == "kernel" for p in points)
        print(f"decisions: {len(points)} point(s) of {gpu}, torch {torch_mm} ({kernels} take a kernel) merged into "
              f"{path}", file=sys.stderr)  # fmt: skip


def merge_points(path: str, tables: dict[tuple[str, str], tuple[str, list[dict]]]) -> None:
    """Decision points merged into the file at `path` (made if missing): per (GPU, torch major.minor) a table with its
    Triton version; a point measured again (same op, dtype, head dim, width, rows and mode) replaces the old one, every
    other point is kept. Also `benchmarks/tune_gemm_gelu.py --write-decisions`'s writer."""
    data = {"format": 1, "about": "written by `fullgraph bench sweep --write-decisions`", "tables": []}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    for (gpu, torch_mm), (triton, new) in tables.items():
        old = next((o for o in data["tables"] if (o["gpu"], o["torch"]) == (gpu, torch_mm)), None)
        if old is None:
            data["tables"].append({"gpu": gpu, "torch": torch_mm, "triton": triton, "points": new})
            continue
        again = {_point_key(p) for p in new}
        old["points"] = [p for p in old["points"] if _point_key(p) not in again] + new
        old["triton"] = triton
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic_bytes(path, [(json.dumps(data, indent=1) + "\n").encode()])


def _point_key(p: dict) -> tuple:
    """What makes a decision point the same point measured again: its tokens too for `measured.TOKEN_KEYED_OPS`."""
    from fullgraph.ops.measured import TOKEN_KEYED_OPS

    tokens = p.get("tokens") if p["op"] in TOKEN_KEYED_OPS else None
    return (*(p[f] for f in ("op", "dtype", "head_dim", "width", "rows", "mode")), tokens)


def speeds(rows: list[Result]) -> dict[str, dict[str, float | None]]:
    """Per point (case, first seen first): "plain ms", and the speed over plain (`speed_over`: paired round by round,
    else plain ms / its ms; above 1 is faster) of "auto", "native" and "again" (plain's second instance: the noise
    floor), None where not timed; a point whose suite measured no twin (a CSV of the ViT suite before it did) has
    "plain ms" None. Each point's last run (`latest_runs`)."""
    rows = latest_runs(rows)
    ms, rounds = ratios(rows), round_series(rows)
    out: dict[str, dict[str, float | None]] = {}
    for case in dict.fromkeys(r.case for r in rows if r.metric == "median_ms"):
        plain = ms.get((case, "plain, compiled"))
        timed = {
            k: speed_over(ms, rounds, case, "plain, compiled", v)
            for k, v in (("auto", "ours auto, compiled"), ("native", NATIVE), ("again", AGAIN))
        }
        if plain is None or timed["auto"] is None:
            out[case] = {"plain ms": None, "auto": None, "native": None, "again": None}
        else:
            out[case] = {"plain ms": plain, **timed}
    return out


def summary(rows: list[Result]) -> str:
    """Per point: plain ms, ours auto, all native and plain again over plain (speed, above 1 is faster) and ours
    auto's error over the plain twin's; then the verdict by the noise rule (`verdict_lines`)."""
    all_speeds, errors = speeds(rows), ratios(latest_runs(rows), "rel_err")
    table = []
    for case, s in all_speeds.items():
        lost = [k for k in ("auto", "native") if is_loss(s[k], s["again"])]
        verdict = f"{' and '.join(lost)} lose{'s' if len(lost) == 1 else ''}" if lost else ""
        table.append([case, s["plain ms"], s["auto"], s["native"], s["again"], error_growth(errors, case), verdict])
    headers = ["point", "plain ms", "ours auto / plain", "all native / plain", "plain again / plain",
               "error auto / plain", "verdict"]  # fmt: skip
    return "\n".join([format_table(headers, table), *verdict_lines(rows, all_speeds, errors)])


def error_growth(errors: dict, case: str) -> float | None:
    """Ours `auto`'s error against fp32 over the plain twin's at `case` (`errors`: `ratios(rows, "rel_err")`)."""
    ours, plain = errors.get((case, "ours auto, compiled")), errors.get((case, "plain, compiled"))
    return ours / plain if ours is not None and plain else None


def verdict_lines(rows: list[Result], all_speeds: dict, errors: dict) -> list[str]:
    """Issue 32's checks over the points of `rows`, per compile mode: ours `auto`'s losses by the noise rule and its
    median speed over plain, all native's losses, and the largest error growth of `auto` over the plain twin
    (`all_speeds`: `speeds(rows)`; `errors`: the rel_err ratios of their runs)."""
    by_mode: dict[str, list[str]] = {}
    for r in rows:
        if r.metric == "median_ms" and r.suite in ("dit", "vit"):
            mode = json.loads(r.params or "{}").get("mode", "default")
            cases = by_mode.setdefault(mode, [])
            if r.case not in cases:
                cases.append(r.case)
    lines = []
    for mode, cases in by_mode.items():
        timed = {c: all_speeds[c] for c in cases if all_speeds[c]["auto"] is not None}
        if not timed:
            continue
        lost = [f"{c} {s['auto']:.3f}" + (f" (again {s['again']:.3f})" if s["again"] is not None else "")
                for c, s in timed.items() if is_loss(s["auto"], s["again"])]  # fmt: skip
        native = sum(is_loss(s["native"], s["again"]) for s in timed.values())
        growth = [g for g in (error_growth(errors, c) for c in timed) if g is not None]
        line = f"{mode}: {len(timed)} points; ours auto loses at {len(lost)} by the noise rule"
        line += f" ({'; '.join(lost)})" if lost else ""
        line += f"; median ours auto / plain {statistics.median(s['auto'] for s in timed.values()):.3f}"
        line += f"; all native loses at {native}"
        line += f"; error of auto at most {max(growth):.3f}x the plain twin's" if growth else ""
        lines.append(line)
    return lines
