"""Suite `coldstart`: time to a model's first output in fresh processes, four ways (issue 15).

Routes: `cold` (an empty TORCHINDUCTOR_CACHE_DIR), `warm` (the folder cold filled), `artifacts` (cache artifacts
saved by a setup process, loaded into an empty folder), `package` (an AOTInductor package exported and probed by a
setup process, then loaded). Each is a fresh process running `fullgraph.deploy.coldstart` (this module spawns it as
a program and does not import the deploy layer: DESIGN.md, Layers) with a clean environment: KEPT_ENV, PYTHONPATH
and its own cache folders. It reports its phases as one JSON line; a process that fails (a package that crashes its
probe, as on the H200 image; a child killed by a signal) is a row marked failed with its error, and the suite goes
on. Outputs are compared with eager fp32 computed here on the same weights and inputs. docs/deploy.md says how to
read the table. Defaults: on a GPU ViT-B/16 (the plain twin, timm's layout) at batch 4 in bf16 with `perception`
(reduce-overhead); on the CPU `vit_mini` (dim 192, 2 blocks, 64x64 images) at batch 2 in fp32 with `dev`.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fullgraph.bench.results import Result, make_rows
from fullgraph.bench.suites import DTYPES
from fullgraph.bench.table import format_table
from fullgraph.compile.presets import get_preset
from fullgraph.errors import UsageError
from fullgraph.models.dit import PlainDiT
from fullgraph.models.dit import config as dit_config
from fullgraph.models.vit import PlainViT
from fullgraph.models.vit import config as vit_config
from fullgraph.timing import resolve_device

ROUTES = ("cold", "warm", "artifacts", "package", "precompiled")
CHILD_TIMEOUT_S = 900.0
DIT_TOKENS = 256
# What a child keeps of this process's environment: where programs and libraries are (the C++ compiler Inductor
# runs on the CPU, CUDA's), the user, locale and temp folder, which GPUs, and the thread counts that set CPU speed.
KEPT_ENV = (
    *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "LD_LIBRARY_PATH", "CC", "CXX"),
    *("CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS"),
)
# Starts the child with its imports timed (under `python -m`, fullgraph.deploy would import torch before the clock):
# torch, then what the action imports (`prepare`: the package route only what `fullgraph.deploy.load` needs).
BOOT = (
    "import sys, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
    "import fullgraph.deploy.coldstart as c; c.prepare(sys.argv[1]); t2 = time.perf_counter(); "
    "sys.exit(c.main(sys.argv[1:], clock=(t0, t1, t2)))"
)


# ---- models: built the same way here (the reference) and in each child (by name) -------------------------------


def vit(config: str, **overrides: Any) -> nn.Module:
    """The plain ViT twin (timm's layout) of a named config, with seeded weights: the same in every process."""
    torch.manual_seed(0)
    return PlainViT(vit_config(config, **overrides))


def dit(config: str, **overrides: Any) -> nn.Module:
    """The plain DiT twin of a named config with seeded random weights (adaLN-Zero's zeros would hide errors)."""
    torch.manual_seed(0)
    model = PlainDiT(dit_config(config, max_tokens=DIT_TOKENS, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model


def _vit_inputs(model: nn.Module, batch: int) -> list[torch.Tensor]:
    return [torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size)]


def _dit_inputs(model: nn.Module, batch: int) -> list[torch.Tensor]:
    return [torch.randn(batch, DIT_TOKENS, model.cfg.dim), torch.randn(batch, model.cfg.dim)]


@dataclass(frozen=True)
class ModelSpec:
    build: str  # "module:function" a fresh process imports; returns the fp32 model on the CPU
    kwargs: dict[str, Any]
    inputs: Callable[[nn.Module, int], list[torch.Tensor]]  # (model, batch) -> fp32 CPU inputs
    about: str


MODELS = {
    "vit_mini": ModelSpec(f"{__name__}:vit", {"config": "vit_tiny", "depth": 2, "img_size": 64, "num_classes": 10},
                          _vit_inputs, "dim 192, 2 blocks, 64x64 images (the CPU default)"),
    "vit_tiny": ModelSpec(f"{__name__}:vit", {"config": "vit_tiny"}, _vit_inputs, "ViT-Ti/16, 224x224"),
    "vit_small": ModelSpec(f"{__name__}:vit", {"config": "vit_small"}, _vit_inputs, "ViT-S/16, 224x224"),
    "vit_b16": ModelSpec(f"{__name__}:vit", {"config": "vit_b16"}, _vit_inputs, "ViT-B/16, 224x224 (GPU default)"),
    "dit_s": ModelSpec(f"{__name__}:dit", {"config": "dit_s"}, _dit_inputs, f"DiT-S stack, {DIT_TOKENS} tokens"),
}  # fmt: skip


# ---- the plan: what the command line asked for --------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to run: a model of MODELS, how, on which device, which routes; checked when made."""

    model: str
    batch: int
    dtype: str  # "bf16", "fp16", "fp32"
    preset: str
    device: str
    reps: int = 10
    depth: int | None = None
    routes: tuple[str, ...] = ROUTES
    timeout: float = CHILD_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise UsageError(f"--model {self.model!r}: choose one of {', '.join(MODELS)}")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        numbers = {"--batch": self.batch, "--reps": self.reps, "--depth": 1 if self.depth is None else self.depth}
        for flag, value in numbers.items():
            if value < 1:
                raise UsageError(f"{flag} {value}: give a positive number")
        if self.timeout <= 0:
            raise UsageError(f"--timeout {self.timeout:g}: give the seconds one process may take, e.g. 900")
        get_preset(self.preset)  # an unknown name is a UsageError listing the presets
        if "warm" in self.routes and "cold" not in self.routes:
            raise UsageError("--routes: warm reuses the cache folder that cold fills; add cold")

    @property
    def spec(self) -> ModelSpec:
        return MODELS[self.model]

    @property
    def build_kwargs(self) -> dict[str, Any]:
        return {**self.spec.kwargs, **({} if self.depth is None else {"depth": self.depth})}

    @property
    def point(self) -> str:
        blocks = "" if self.depth is None else f" x{self.depth}"
        return f"{self.model}{blocks} b{self.batch} {self.dtype} {self.preset} {self.device}"


def parse_routes(spec: str | None) -> tuple[str, ...]:
    if not spec:
        return ROUTES
    routes = tuple(r.strip() for r in spec.split(",") if r.strip())
    bad = [r for r in routes if r not in ROUTES]
    if bad or not routes:
        raise UsageError(f"--routes: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(ROUTES)}")
    return tuple(r for r in ROUTES if r in routes)


def plan_from(args) -> Plan:
    """The plan of a `fullgraph bench coldstart` command line: what it gives, else this device's defaults."""
    device = resolve_device(args.device)
    gpu = device.type == "cuda"

    def given(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        return default if value is None else value

    return Plan(
        model=given("model", "vit_b16" if gpu else "vit_mini"),
        batch=given("batch", 4 if gpu else 2),
        dtype=given("dtype", "bf16" if gpu else "fp32"),
        preset=given("preset", "perception" if gpu else "dev"),
        device=str(device),
        reps=args.reps,
        depth=given("depth", None),
        routes=parse_routes(given("routes", None)),
        timeout=given("timeout", CHILD_TIMEOUT_S),
    )


# ---- one child process ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Child:
    """What one process reported (its JSON line), or why it reported nothing; `process_s` is measured here."""

    name: str
    ok: bool
    error: str | None
    process_s: float | None
    report: dict[str, Any] = field(default_factory=dict)
    output: list[torch.Tensor] | None = None


def child_env(work: str, inductor: str) -> dict[str, str]:
    here = [os.getcwd() if p == "" else p for p in sys.path]  # the child imports what this process can
    kept = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    return {
        **kept,
        "PYTHONPATH": os.pathsep.join(here),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, inductor),  # Triton's cache lives under it too
        "FULLGRAPH_CACHE_DIR": os.path.join(work, "fullgraph-cache"),  # the package probe's verdicts
    }


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"exit {rc}, {signal.Signals(-rc).name}"
        except ValueError:
            pass
    return f"exit {rc}"


def _why(stderr: str) -> str:
    """The line of a dead child's stderr that says most: faulthandler's fatal error, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    return (fatal[0] if fatal else lines[-1] if lines else "no output")[:400]


def _json_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and "action" in found:
                return found
    return None


def run_child(name: str, action: str, plan: Plan, work: str, inductor: str, **files: str) -> Child:
    """Start `python -c BOOT ACTION ...` in `work` with a clean environment and `work/inductor` as its cache folder;
    `files`: cache=, package= paths. Its stdout and stderr are kept in `work/NAME.log`."""
    out = os.path.join(work, f"{name}.out.pt")
    argv = [sys.executable, "-X", "faulthandler", "-c", BOOT, action, "--build", plan.spec.build,
            "--build-kwargs", json.dumps(plan.build_kwargs), "--inputs", os.path.join(work, "inputs.pt"),
            "--device", plan.device, "--dtype", plan.dtype, "--preset", plan.preset, "--reps", str(plan.reps),
            "--out", out]  # fmt: skip
    for flag, path in files.items():
        argv += [f"--{flag}", path]
    start = time.perf_counter()
    # Its own process group, so that a timeout or Ctrl-C here also ends the compile workers it started.
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, cwd=work, env=child_env(work, inductor), stdin=subprocess.DEVNULL, stdout=pipe,
                            stderr=pipe, text=True, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=plan.timeout)
    except BaseException as e:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            return Child(name, False, f"took over {plan.timeout:g} s and was stopped (--timeout)", plan.timeout)
        raise
    process_s, rc = time.perf_counter() - start, proc.returncode
    with open(os.path.join(work, f"{name}.log"), "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(argv)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    report = _json_line(stdout)
    if report is None:  # killed, or died before it could report
        return Child(name, False, f"{_exit_text(rc)}: {_why(stderr)}", process_s)
    if not report.get("ok") or rc != 0:
        return Child(name, False, f"{_exit_text(rc)}: {report.get('error') or _why(stderr)}", process_s, report)
    output = torch.load(out, weights_only=True) if os.path.exists(out) else None
    return Child(name, True, None, process_s, report, output)


# ---- the routes -------------------------------------------------------------------------------------------------


def write_inputs(plan: Plan, work: str) -> list[torch.Tensor]:
    """The inputs every process runs on (saved in `work`) and eager fp32's output on them here: the reference."""
    device = torch.device(plan.device)
    model = _build(plan).eval().to(device)
    torch.manual_seed(1)
    inputs = plan.spec.inputs(model, plan.batch)
    torch.save(inputs, os.path.join(work, "inputs.pt"))
    with torch.no_grad():
        out = model(*(t.to(device) for t in inputs))
    expected = [t.float().cpu() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    del model, out
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return expected


def _build(plan: Plan) -> nn.Module:
    module, _, name = plan.spec.build.partition(":")
    return getattr(importlib.import_module(module), name)(**plan.build_kwargs)


@dataclass(frozen=True)
class FileRoute:
    """A route that loads a file a setup process made: the file (name in the work folder, the children's flag for
    it), the setup (its child's name and action, its Inductor folder, its row, what it does, what fails), and the
    timed process (its action, what it does); the timed process gets an empty folder `inductor-<route>`."""

    file: str
    flag: str
    setup_child: str
    setup_action: str
    setup_inductor: str
    setup_row: str
    setup_says: str
    setup_failed: str
    action: str
    says: str


FILE_ROUTES = {  # in ROUTES order
    "artifacts": FileRoute(
        "model.fgcache", "cache", "save", "save-cache", "inductor-cold", "setup: save artifacts",
        "compile and save the cache artifacts (not timed as a cold start)", "saving the artifacts",
        "load-cache", "a fresh process loads them into an empty cache folder, then compiles",
    ),
    "package": FileRoute(
        "model.pt2", "package", "export", "export", "inductor-export", "setup: export package",
        "export an AOTInductor package and probe it once (build time reported apart)", "the export",
        "load-package", "a fresh process loads the package and calls it",
    ),
    "precompiled": FileRoute(
        "model.fgpre", "precompiled", "precompile", "save-precompiled", "inductor-precompile", "setup: precompile",
        "Dynamo's ahead-of-time compile saved to a file (not timed as a cold start)", "precompiling",
        "load-precompiled", "a fresh process loads it into an empty cache folder and calls the model through it",
    ),
}  # fmt: skip


def run_routes(plan: Plan, work: str, say: Callable[[str], None]) -> dict[str, Child]:
    """Every requested route in order, with its setup steps (named "setup: ..."); a failed setup fails its route."""
    done: dict[str, Child] = {}
    if "cold" in plan.routes:
        say("cold: a fresh process compiles into an empty cache folder")
        done["cold"] = run_child("cold", "compile", plan, work, "inductor-cold")
    if "warm" in plan.routes:
        say("warm: a fresh process compiles on the cache folder cold filled")
        done["warm"] = run_child("warm", "compile", plan, work, "inductor-cold")
    for route, r in FILE_ROUTES.items():
        if route not in plan.routes:
            continue
        files = {r.flag: os.path.join(work, r.file)}
        say(f"{route}, setup: {r.setup_says}")
        setup = done[r.setup_row] = run_child(r.setup_child, r.setup_action, plan, work, r.setup_inductor, **files)
        say(f"{route}: {r.says}")
        done[route] = (
            run_child(route, r.action, plan, work, f"inductor-{route}", **files)
            if setup.ok
            else Child(route, False, f"not run: {r.setup_failed} failed ({setup.error})", None)
        )
    return done


# ---- rows and table ------------------------------------------------------------------------------------------------


def rel_err(output: list[torch.Tensor] | None, expected: list[torch.Tensor]) -> float | None:
    """Relative (Frobenius) error of all output tensors together against eager fp32's; None without an output."""
    if not output or [o.shape for o in output] != [e.shape for e in expected]:
        return None
    out, ref = torch.cat([o.flatten() for o in output]), torch.cat([e.flatten() for e in expected])
    return ((out - ref).norm() / ref.norm()).item()


PHASES = (  # (the child's key, also the metric's name; table header)
    ("import_torch_s", "import torch s"),
    ("import_fullgraph_s", "import fullgraph s"),
    ("device_s", "inputs on device s"),
    ("build_s", "build s"),
    ("load_s", "load s"),
    ("first_call_s", "compile + 1st call s"),
    ("first_output_s", "1st output from load s"),
    ("median_ms", "steady ms"),
)
TIMES = (*(k for k, _ in PHASES), "p20_ms", "p80_ms", "export_s", "probe_s", "save_s")


def report(plan: Plan, done: dict[str, Child], expected: list[torch.Tensor]) -> tuple[list[Result], str]:
    params = {"model": plan.model, "depth": plan.depth, "batch": plan.batch, "dtype": plan.dtype,
              "preset": plan.preset}  # fmt: skip
    rows: list[Result] = []
    table, notes = [], []
    for name, child in done.items():
        r = child.report
        metrics: dict[str, tuple[float, str]] = {"ok": (float(child.ok), "")}
        if child.process_s is not None:
            metrics["process_s"] = (child.process_s, "s")
        metrics.update({k: (r[k], "ms" if k.endswith("_ms") else "s") for k in TIMES if r.get(k) is not None})
        metrics.update({k: (float(v), "") for k, v in (r.get("counters") or {}).items()})
        if "file_bytes" in r:
            metrics["file_bytes"] = (float(r["file_bytes"]), "B")
        if "probe_ok" in r:
            metrics["probe_ok"] = (float(r["probe_ok"]), "")
        err = None if name.startswith("setup") else rel_err(child.output, expected)
        if err is not None:
            metrics["rel_err"] = (err, "")
        if name.startswith("setup"):
            notes += [_setup_note(name, child)] if child.ok else []
        else:
            counters = r.get("counters")
            hits = f"{counters['fxgraph_cache_hit']}/{counters['fxgraph_cache_miss']}" if counters else None
            status = "ok" if child.ok else "failed"
            table.append([name, *(r.get(k) for k, _ in PHASES), child.process_s, hits, err, status])
        if child.error:
            notes.append(f"{name}: failed: {child.error}")
        error = {"error": child.error} if child.error else {}
        rows += make_rows("coldstart", plan.point, name, metrics, {**params, **error})
    notes += _bytecode_note(done)
    headers = ["route", *(h for _, h in PHASES), "process s", "FX cache hit/miss", "rel err vs fp32", "status"]
    about = f"{plan.point}: {plan.spec.about}; each route a fresh process"
    return rows, "\n".join([about, format_table(headers, table), *notes])


def _bytecode_note(done: dict[str, Child]) -> list[str]:
    """A note when the processes found no bytecode cache for torch: their import and load times then include
    compiling every module they import from source, which an installation with .pyc files does not pay."""
    seen = [c.report.get("bytecode") for c in done.values() if c.report.get("bytecode")]
    if not seen or all(b["torch_pyc"] for b in seen):
        return []
    why = " and writes none (PYTHONDONTWRITEBYTECODE)" if any(b["dont_write"] for b in seen) else ""
    return [f"note: this Python found no .pyc for torch{why}: each process compiled the modules it imported from "
            "source, inside its import and load times"]  # fmt: skip


def _setup_note(name: str, child: Child) -> str:
    r = child.report
    size = f", {r['file_bytes'] / 1e6:.1f} MB" if r.get("file_bytes") else ""
    if "export_s" in r:
        probe = "passed" if r.get("probe_ok") else f"failed ({r.get('probe_detail') or 'no detail'})"
        return f"{name}: built in {r['export_s']:.1f} s{size}; probe {probe} in {r.get('probe_s', 0):.1f} s"
    if "first_call_s" not in r:  # precompiled: compiled and saved in one call
        return f"{name}: compiled and saved in {r.get('save_s', 0):.1f} s{size}"
    return f"{name}: compiled in {r.get('first_call_s', 0):.1f} s, saved in {r.get('save_s', 0):.2f} s{size}"


@contextmanager
def _work_folder(keep: str | None) -> Iterator[str]:
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="fullgraph-coldstart-") as work:
            yield work
        return
    if os.path.exists(keep) and (not os.path.isdir(keep) or os.listdir(keep)):
        raise UsageError(f"--workdir {keep}: give an empty or new folder (the routes need empty cache folders)")
    os.makedirs(keep, exist_ok=True)
    yield os.path.abspath(keep)


def run(args) -> tuple[list[Result], str]:
    plan = plan_from(args)
    start = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] coldstart {msg}", file=sys.stderr, flush=True)

    with _work_folder(getattr(args, "workdir", None)) as work:
        say(f"{plan.point}: eager fp32 reference in this process, in {work}")
        expected = write_inputs(plan, work)
        done = run_routes(plan, work, say)
        if getattr(args, "workdir", None) is None and any(not c.ok for c in done.values()):
            kept = tempfile.mkdtemp(prefix="fullgraph-coldstart-logs-")
            for name in os.listdir(work):
                if name.endswith(".log"):
                    shutil.copy(os.path.join(work, name), kept)
            say(f"the children's output is kept in {kept}")
    return report(plan, done, expected)
