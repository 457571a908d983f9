"""The doctor: lint, graph breaks, recompiles, CUDA-graph skips, and every compile mode measured side by side,
ending with the fastest configuration whose output stays within tolerance of eager float32.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
from collections.abc import Callable, Sequence

import torch
from torch.utils._pytree import tree_leaves

from fullgraph import env
from fullgraph.diagnose import dynamo
from fullgraph.diagnose.checklist import build_checklist
from fullgraph.diagnose.lint import lint_source
from fullgraph.diagnose.report import ConfigResult, Recommendation, Report
from fullgraph.diagnose.target import spec_of
from fullgraph.timing import first_call, measure, peak_memory

GPU_MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
# CUDA graphs need a GPU, and CPU max-autotune spends minutes benchmarking GEMM templates on two cores.
CPU_MODES = ("eager", "default")
# ||out - ref|| / ||ref|| against eager float32, per dtype the configuration runs in.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2}
VARY = ("batch", "seq", "dtype")


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _cast(inputs: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


def _rel_err(out, ref) -> float:
    outs, refs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], tree_leaves(ref)
    refs = [t for t in refs if isinstance(t, torch.Tensor)]
    if len(outs) != len(refs) or not refs:
        return float("inf")
    num = sum(((o.double() - r.double()).norm() ** 2).item() for o, r in zip(outs, refs, strict=True))
    den = sum((r.double().norm() ** 2).item() for r in refs)
    err = (num / max(den, 1e-300)) ** 0.5
    return err if err == err else float("inf")  # NaN never passes


def vary_inputs(inputs: Sequence[torch.Tensor], kind: str) -> tuple[torch.Tensor, ...] | None:
    """Inputs as a user would send next: another batch size, sequence length or dtype. None if not applicable."""
    if kind == "dtype":
        floats = any(t.is_floating_point() for t in inputs)
        return _cast(inputs, torch.float16 if inputs[0].dtype != torch.float16 else torch.float32) if floats else None
    dim = {"batch": 0, "seq": 1}[kind]
    if not all(t.dim() > dim for t in inputs):
        return None
    out = []
    for t in inputs:
        shape = list(t.shape)
        shape[dim] = shape[dim] * 2 + 1  # odd, so it is no multiple the first compile might have assumed
        out.append(torch.randn(shape, dtype=t.dtype, device=t.device) if t.is_floating_point() else t.new_zeros(shape))
    return tuple(out)


def _lint(model: torch.nn.Module):
    try:
        path = inspect.getsourcefile(type(model))
        with open(path, encoding="utf-8") as f:
            return lint_source(f.read(), path), None
    except (OSError, TypeError) as e:
        return [], f"lint: model source not readable ({env.first_line(e)})"


def _run_config(model, inputs, ref, device, dtype, mode, reps, skips_out: list[str]) -> ConfigResult:
    name = f"{'eager' if mode == 'eager' else 'compile ' + mode} {_short(dtype)}"
    tol = TOLERANCE.get(dtype, 1e-3)
    try:
        m = copy.deepcopy(model).to(dtype)
        x = _cast(inputs, dtype)
        fn = m if mode == "eager" else torch.compile(m, mode=mode)
        with torch.no_grad(), dynamo.cudagraph_skips() as skips:
            compile_s, _ = first_call(lambda: fn(*x), device)
            t = measure(lambda: fn(*x), device=device, warmup=3, reps=reps)
            peak = peak_memory(lambda: fn(*x), device)
            err = _rel_err(fn(*x), ref)
        skips_out.extend(f"{name}: {s}" for s in skips)
    except Exception as e:  # a mode that fails to compile or run is a result, not a crash of the doctor
        return ConfigResult(name, mode, _short(dtype), tolerance=tol, error=env.first_line(e, 300))
    return ConfigResult(
        name, mode, _short(dtype), t.median_ms, t.p20_ms, t.p80_ms,
        compile_s=None if mode == "eager" else compile_s,
        peak_memory_bytes=peak, rel_err=err, tolerance=tol,
    )  # fmt: skip


def recommend(configs: Sequence[ConfigResult]) -> Recommendation | None:
    ok = [c for c in configs if c.ok and c.median_ms]
    eager = [c for c in configs if c.mode == "eager" and c.median_ms]
    base = next((c for c in eager if c.dtype == "fp32"), eager[0] if eager else None)
    if not ok:
        return None
    best = min(ok, key=lambda c: c.median_ms)
    dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}[best.dtype]
    cast = "" if best.dtype == "fp32" else f"model = model.to({dtype})  # and cast floating inputs to {dtype}\n"
    if best.mode == "eager":  # compiling did not pay: say so rather than print a no-op
        call = "# compiling did not beat eager mode for this model as written: remove its graph breaks first\n"
    else:
        call = f'model = torch.compile(model, mode="{best.mode}")\n'
    code = f"{cast}{call}with torch.no_grad():\n    y = model(*inputs)"
    if base is None:
        return Recommendation(best.name, None, code)
    return Recommendation(best.name, base.median_ms / best.median_ms, code, base.name)


def doctor(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    target: str = "",
    modes: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    vary: Sequence[str] = (),
    reps: int = 20,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Examine `model` on `example_inputs` (already on their device) and return a `Report`."""
    say = progress or (lambda msg: None)
    inputs = tuple(example_inputs)
    device = inputs[0].device if inputs else torch.device("cpu")
    gpu = device.type == "cuda"
    modes = tuple(modes or (GPU_MODES if gpu else CPU_MODES))
    dtypes = tuple(dtypes or ((torch.float32, torch.bfloat16) if gpu else (torch.float32,)))
    notes: list[str] = []
    model = model.eval()

    say("lint: reading the model's source")
    findings, note = _lint(model)
    notes += [note] if note else []

    say("graph breaks: compiling with a recording backend")
    with dynamo.room_for_recompiles():
        rec, compiled = dynamo.capture_breaks(model, inputs)
        say("recompiles: calling again" + (f", varying {', '.join(vary)}" if vary else ""))
        variants = [("inputs", inputs)]
        for kind in vary:
            changed = vary_inputs(inputs, kind)
            if changed is None:
                notes.append(f"--vary {kind}: not applicable to inputs {', '.join(map(spec_of, inputs))}")
            else:
                variants.append((kind, changed))
        recompiles = dynamo.capture_recompiles(compiled, variants)

        with torch.no_grad():
            ref = model(*_cast(inputs, torch.float32))
        configs, skips = [], []
        for dtype in dtypes:
            for mode in modes:
                say(f"measuring {mode} {_short(dtype)}")
                configs.append(_run_config(model, inputs, ref, device, dtype, mode, reps, skips))
    if not gpu:
        notes.append("CPU run: reduce-overhead and max-autotune need CUDA graphs / GPU autotuning; run on a GPU")
    report = Report(
        target=target or type(model).__name__,
        device=torch.cuda.get_device_name(device) if gpu else "cpu",
        inputs=[spec_of(t) for t in inputs],
        environment={"torch": torch.__version__, "triton": env.triton_version(), "python": sys.version.split()[0]},
        lint=findings,
        graph_count=len(rec.graphs),
        graph_breaks=rec.breaks,
        recompiles=recompiles,
        cudagraph_skips=skips,
        configs=configs,
        recommendation=recommend(configs),
        notes=notes,
    )
    return dataclasses.replace(report, checklist=build_checklist(report, vary, gpu))
