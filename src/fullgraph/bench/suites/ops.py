"""Suite `ops`: each op's implementations side by side, as bandwidth against the measured copy ceiling.

For every op and shape: eager native (pure PyTorch), the torch built-in where one exists, torch.compile of
the native form, and our Triton kernel. On a GPU each variant is captured with `inner` calls in a CUDA
graph, over input sets rotated so the bytes touched exceed the L2 cache several times: the figures are
GPU time from DRAM, not Python dispatch or cache hits. Each variant's output is checked against a float64
reference first; a variant that drifts past tolerance is reported as an error, not timed.

On a CPU the variants that can run there are timed and the others are rows marked skipped with the reason (our
kernel needs TRITON_INTERPRET=1 on CPU tensors). Under the interpreter the kernel rows are flagged (a note in
the table, `interpreter: true` in the rows' params, one warning line): they time Triton's interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fullgraph import env, ops
from fullgraph.bench.ceilings import time_copy
from fullgraph.bench.results import Result, make_rows, timing_metrics
from fullgraph.bench.roofline import pct_of, tbps, tensor_bytes
from fullgraph.bench.suites import DTYPES
from fullgraph.bench.table import format_table
from fullgraph.errors import FullgraphError, UsageError
from fullgraph.timing import measure, resolve_device

GPU_SHAPES = ((16384, 4096), (4096, 3072), (65536, 128))
CPU_SHAPES = ((64, 256),)
L2_BYTES = 60 << 20  # H200; larger than most GPUs' L2, so enough rotation for them too
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class OpCase:
    """One op: how to make inputs for a rows x cols case, its float64 reference, and its built-in."""

    name: str
    make: Callable[[int, int, torch.dtype, torch.device], tuple]  # -> args; outputs are allocated per call
    call: Callable[..., object]  # the fullgraph functional form (policy picks native or kernel)
    ref: Callable[..., torch.Tensor]  # float64 reference of the (first) output
    builtin: Callable[..., object] | None = None
    out_factor: int = 1  # outputs written, in units of x's bytes


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _rms_ref(x, w, r=None):
    s = x.double() if r is None else (x + r).double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()


def _rope_ref(x, cos, sin, interleaved=False):  # [B, N, H, D], every channel rotated
    x = x.double()
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)
    a, b = x.chunk(2, -1)
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def _rope_inputs(rows, cols, dtype, device):
    d = min(cols, 128)
    x = torch.randn(1, rows, cols // d, d, device=device, dtype=dtype)  # [B, N, H, D]
    return (x, *(t.clone() for t in ops.rope_tables(rows, d, device=device)))  # own copies: rotated past L2


def _rows(rows, cols, dtype, device, n):
    return tuple(torch.randn(rows, cols, device=device, dtype=dtype) for _ in range(n))


def _params(rows, cols, dtype, device, n):
    return tuple(torch.randn(1, cols, device=device, dtype=dtype) * 0.5 for _ in range(n))


CASES = {
    "rms_norm": OpCase(
        "rms_norm",
        lambda r, c, dt, dev: (*_rows(r, c, dt, dev, 1), torch.randn(c, device=dev, dtype=dt)),
        lambda x, w: ops.rms_norm(x, w),
        _rms_ref,
        builtin=lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
    ),
    "rms_norm_residual": OpCase(
        "rms_norm_residual",
        lambda r, c, dt, dev: (*_rows(r, c, dt, dev, 2), torch.randn(c, device=dev, dtype=dt)),
        lambda x, res, w: ops.rms_norm(x, w, residual=res),
        lambda x, res, w: _rms_ref(x, w, res),
        out_factor=2,
    ),
    "layer_norm": OpCase(
        "layer_norm",
        lambda r, c, dt, dev: (*_rows(r, c, dt, dev, 1), *(torch.randn(c, device=dev, dtype=dt) for _ in range(2))),
        lambda x, w, b: ops.layer_norm(x, w, b),
        lambda x, w, b: F.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double()),
        builtin=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    ),
    "modulate": OpCase(
        "modulate",
        lambda r, c, dt, dev: (_rows(r, c, dt, dev, 1)[0][None], *_params(r, c, dt, dev, 2)),
        lambda x, shift, scale: ops.modulate(x, shift, scale),
        lambda x, shift, scale: x.double() * (1 + scale.double()) + shift.double(),
    ),
    "gated_residual": OpCase(
        "gated_residual",
        lambda r, c, dt, dev: (*(t[None] for t in _rows(r, c, dt, dev, 2)), *_params(r, c, dt, dev, 1)),
        lambda x, h, gate: ops.gated_residual(x, h, gate),
        lambda x, h, gate: x.double() + gate.double() * h.double(),
    ),
    "rope": OpCase(
        "rope",
        _rope_inputs,
        lambda x, cos, sin: ops.apply_rope(x, cos, sin, layout="bsnd"),
        _rope_ref,
    ),
    "rope_interleaved": OpCase(
        "rope_interleaved",
        _rope_inputs,
        lambda x, cos, sin: ops.apply_rope(x, cos, sin, interleaved=True, layout="bsnd"),
        lambda x, cos, sin: _rope_ref(x, cos, sin, interleaved=True),
    ),
}


def _policy_of(case: str) -> str:
    return {"rms_norm_residual": "rms_norm", "rope_interleaved": "rope"}.get(case, case)


def _under(op: str, impl: str, fn: Callable) -> Callable:
    def call(*args):
        with ops.policy(**{op: impl}):
            return fn(*args)

    return call


def variants(case: OpCase) -> dict[str, Callable]:
    op = _policy_of(case.name)
    out = {"eager native": _under(op, "native", case.call)}
    if case.builtin is not None:
        out["torch built-in"] = case.builtin
    out["compiled native"] = _under(op, "native", torch.compile(case.call, fullgraph=True, dynamic=False))
    out["kernel"] = _under(op, "kernel", case.call)
    return out


def parse_shapes(spec: str) -> tuple[tuple[int, int], ...]:
    try:
        shapes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in spec.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--shapes: cannot read {spec!r}; write ROWSxCOLS[,ROWSxCOLS...]") from None
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise UsageError(f"--shapes: cannot read {spec!r}; write ROWSxCOLS[,ROWSxCOLS...]")
    return shapes


HEADERS = ["op", "shape", "variant", "µs", "TB/s", "% copy", "rel err", "note"]
INTERPRETER_NOTE = "Triton interpreter"
INTERPRETER_WARNING = (
    "warning: the kernel rows ran in Triton's CPU interpreter (TRITON_INTERPRET=1): they time the interpreter, "
    "not a kernel (rows flagged interpreter=true in the CSV); compare kernels on a GPU"
)


def unavailable(variant: str, device: torch.device) -> str:
    """Why `variant` cannot run on `device`, or "" when it can (only our Triton kernel depends on the machine)."""
    if variant != "kernel":
        return ""
    ok, why = env.triton_runs_on(device)
    return "" if ok else why


def run(args) -> tuple[list[Result], str]:
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    names = [n.strip() for n in (args.ops or ",".join(CASES)).split(",") if n.strip()]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise UsageError(f"--ops: unknown op(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    shapes = parse_shapes(args.shapes) if args.shapes else (GPU_SHAPES if gpu else CPU_SHAPES)
    dtype = DTYPES[args.dtype]
    copy_bytes = (1 << 30) if gpu else (64 << 20)  # the ceiling, measured in this run: ratios, not absolutes
    copy_tbps = tbps(2 * copy_bytes, time_copy(copy_bytes // 4, device, args.reps).median_ms)
    rows: list[Result] = []
    table = []
    for name in names:
        case = CASES[name]
        for r, c in shapes:
            rows_, table_ = _run_case(case, r, c, dtype, device, gpu, copy_tbps, args.reps)
            rows += rows_
            table += table_
    if not any(row[3] is not None for row in table):
        notes = sorted({row[7] for row in table})
        raise FullgraphError(f"no variant of the ops suite could run on {device.type}: {'; '.join(notes)}")
    text = format_table(HEADERS, table)
    text += f"\n\nmeasured copy bandwidth: {copy_tbps:.3f} TB/s ({device.type})"
    if any(row[7] == INTERPRETER_NOTE for row in table):
        text += "\n" + INTERPRETER_WARNING
    if getattr(args, "markdown", None):
        _write_markdown(args.markdown, table, copy_tbps, device)
    return rows, text


def _run_case(case, r, c, dtype, device, gpu, copy_tbps, reps):
    first = case.make(r, c, dtype, device)
    call_bytes = tensor_bytes(*first) + case.out_factor * tensor_bytes(first[0])
    n_sets = max(2, math.ceil(4 * L2_BYTES / call_bytes)) if gpu else 1
    sets = [first] + [case.make(r, c, dtype, device) for _ in range(n_sets - 1)]
    ref = case.ref(*first)
    shape, label = f"{r}x{c}", f"{case.name} {r}x{c}"
    params = {"rows": r, "cols": c, "dtype": str(dtype).removeprefix("torch."), "bytes": call_bytes}
    rows, table = [], []
    for variant, fn in variants(case).items():
        skipped = unavailable(variant, device)
        if skipped:  # a row that says so: a CPU run still fills the other columns
            table.append([case.name, shape, variant, None, None, None, None, f"skipped: {skipped}"])
            rows += make_rows("ops", label, variant, {"skipped": (1.0, "")}, {**params, "skip_reason": skipped})
            continue
        interpreted = variant == "kernel" and device.type == "cpu"  # Triton on CPU tensors is its interpreter
        note = INTERPRETER_NOTE if interpreted else ""
        p = {**params, "interpreter": True} if interpreted else params
        try:
            err = ((_first(fn(*first)).double() - ref).norm() / ref.norm()).item()
        except Exception as e:  # a compiler or kernel that fails here is a finding of the run, not its end
            table.append([case.name, shape, variant, None, None, None, None, f"error: {env.first_line(e, 120)}"])
            rows += make_rows("ops", label, variant, {"error": (1.0, "")}, {**p, "error": env.first_line(e)})
            continue
        if not err < TOLERANCE[dtype]:  # NaN fails too
            table.append([case.name, shape, variant, None, None, None, f"{err:.1e} FAIL", note])
            rows += make_rows("ops", label, variant, {"rel_err": (err, "")}, p)
            continue
        t = measure(fn, device=device, warmup=3, reps=reps, rotate=sets, inner=n_sets, graph=gpu)
        rate = tbps(call_bytes, t.median_ms)
        metrics = {**timing_metrics(t), "tbps": (rate, "TB/s"), "pct_copy": (pct_of(rate, copy_tbps), "%")}
        rows += make_rows("ops", label, variant, {**metrics, "rel_err": (err, "")}, p)
        table.append([case.name, shape, variant, t.median_ms * 1e3, rate, pct_of(rate, copy_tbps), f"{err:.1e}", note])
    return rows, table


def _write_markdown(path, table, copy_tbps, device) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [
        f"Measured on {name}, torch {torch.__version__}; copy ceiling {copy_tbps:.2f} TB/s (read + write).",
        "",
        "| op | shape | variant | µs | TB/s | % of copy | rel err | note |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for op, shape, variant, us, rate, pct, err, note in table:
        cells = [f"{us:.1f}", f"{rate:.2f}", f"{pct:.0f}"] if us is not None else ["-", "-", "-"]
        lines.append(f"| {op} | {shape} | {variant} | {' | '.join(cells)} | {err or '-'} | {note} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
