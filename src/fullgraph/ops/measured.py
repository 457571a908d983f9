"""What "auto" runs inside a compiled graph, per op: our kernel only where an in-graph measurement at a shape like
the one at hand shows it beating Inductor's code for the native form; the native form everywhere else (the safe
choice: Inductor fuses it into its neighbours, and a GPU, torch version or shape nobody has measured gets what plain
PyTorch gets).

Standalone timings are not the measure. On an H200 our norm and RoPE kernels beat Inductor alone
(docs/ops-benchmark.md: layer_norm up to 17%, rms_norm 8-20%, rope 15-20%), yet inside a compiled DiT stack
(dim 3072, 24 heads, 4 blocks, bf16, torch 2.11; benchmarks/results/dit_inside_a_graph_h200.txt) taking them
made the model slower, and a choice measured at head dim 128 lost at head dim 72 (issue 32: DiT-XL/2, 0.73x). So
the compiled choice is data, not code: `data/decisions.json` (shipped with the package; written by `fullgraph bench
sweep --write-decisions`) holds in-graph measurements keyed by GPU name and torch / Triton versions, each point an
op, dtype, head dim, row width, row count and mode (default or replayed from CUDA graphs) with the choice that won
there. A user's own file, `decisions.json` in fullgraph's cache folder (`fullgraph._paths.cache_dir`), replaces the
committed tables of every GPU it names. `close` (below) says which points speak for a shape; docs/decisions.md
says how to measure a GPU.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import warnings
from typing import NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from fullgraph import replay
from fullgraph._paths import cache_dir

DATA_FILE = pathlib.Path(__file__).with_name("data") / "decisions.json"
USER_FILE = "decisions.json"  # in cache_dir(); kernels/_library.py's ops_fingerprint hashes both files
FORMAT = 1
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
MODES = ("default", "graphed")  # graphed: the code traced now replays from CUDA graphs (`fullgraph.replay`)
ROWS_FACTOR = 2  # a measured point speaks for row counts within this factor of its own
# Ops whose choice depends on the sequence length as well as the rows (tokens over the batch): attention's work grows
# with the square of the tokens, so 8 x 256 and 2 x 1024 tokens (both 2048 rows) are not alike. For these a point
# records its tokens per sequence and speaks only for calls whose tokens, known at trace time, are within ROWS_FACTOR
# of its own too (a dynamic sequence length takes the native form).
TOKEN_KEYED_OPS = frozenset({"sdpa_flash"})


class Shape(NamedTuple):
    """What the compiled choice reads of a model's call: the token tensor's dtype, the attention's head dim, the
    model's width (static: from its weights, never read off a dynamic tensor), the row count (tokens over the
    batch), symbolic under a dynamic dim, and the tokens of one sequence (for TOKEN_KEYED_OPS; None where unknown)."""

    dtype: torch.dtype
    head_dim: int
    width: int
    rows: int | torch.SymInt
    tokens: int | torch.SymInt | None = None


def shape_of(x: torch.Tensor, head_dim: int, width: int) -> Shape:
    """The Shape of a block's call on tokens `x` ([..., tokens, width]) with attention heads of `head_dim`."""
    return Shape(x.dtype, head_dim, width, x.numel() // width, x.shape[-2] if x.dim() >= 3 else None)


class Point(NamedTuple):
    """One in-graph measurement: on `gpu` with torch `torch` (major.minor), `op`'s `choice` won at this shape."""

    gpu: str
    torch: str
    op: str
    dtype: str
    head_dim: int
    width: int
    rows: int
    mode: str
    choice: str
    tokens: int | None = None  # of one sequence: read for TOKEN_KEYED_OPS only


def _within(a: int, b: int) -> bool:
    return a <= b * ROWS_FACTOR and b <= a * ROWS_FACTOR


def close(point: Point, gpu: str, torch_version: str, op: str, dtype: str, head_dim: int, width: int, rows: int,
          mode: str, tokens: int | None = None) -> bool:  # fmt: skip
    """Does `point` speak for this call? Same GPU name, torch major.minor, op, dtype and mode (default, or replayed
    from CUDA graphs), the same head dim and row width, and a row count within a factor of 2 (ROWS_FACTOR) of the
    point's; for TOKEN_KEYED_OPS also tokens per sequence, known on both sides, within that factor. Nothing else is
    close: a call no point speaks for runs the native form."""
    keyed = op not in TOKEN_KEYED_OPS or (point.tokens is not None and tokens is not None
                                          and _within(point.tokens, tokens))  # fmt: skip
    return (
        (point.gpu, point.torch, point.op, point.dtype, point.head_dim, point.width, point.mode)
        == (gpu, torch_version, op, dtype, head_dim, width, mode)
        and _within(point.rows, rows)
        and keyed
    )


def choice_among(points, gpu: str, torch_version: str, op: str, dtype: str, head_dim: int, width: int, rows: int,
                 mode: str, tokens: int | None = None) -> str:  # fmt: skip
    """The choice of the close point nearest in row count (by ratio; a tie goes to "native"), "native" where no
    point is close."""
    near = [p for p in points if close(p, gpu, torch_version, op, dtype, head_dim, width, rows, mode, tokens)]
    if not near:
        return "native"
    best = min(near, key=lambda p: (abs(math.log(p.rows / rows)), p.choice != "native"))
    return best.choice


def compiled_choice(op: str, device: torch.device | None = None, shape: Shape | None = None) -> str:
    """The implementation measured as faster inside a compiled graph on `device`'s GPU at a shape close to `shape`
    (`close`); "native" for devices, ops and shapes without a close measurement, and without a shape. Reads only
    static dims (dtype, head dim, width); the rows are compared without a guard (`pick`), so a dynamic dim adds no
    guard and no recompile."""
    if device is None or device.type != "cuda" or shape is None:
        return "native"
    spans = kernel_rows(op, device.index, shape.dtype, shape.head_dim, shape.width, replay.under_graphs())
    return pick(spans, shape.rows, shape.tokens)


def pick(spans: tuple[tuple[int, ...], ...], rows: int | torch.SymInt, tokens: int | torch.SymInt | None = None) -> str:
    """ "kernel" where `rows` is known to lie in one of `spans` ((lo, hi), from `kernel_rows`; for TOKEN_KEYED_OPS
    (rows lo, rows hi, tokens lo, tokens hi), and then `tokens` in its token range too) for every size the graph
    serves, else "native". A symbolic count is decided without a guard (`statically_known_true`, against the dim's
    range: a guard would specialize it): a range the spans do not wholly hold takes the native form."""

    def holds(n, lo: int, hi: int) -> bool:
        return n is not None and statically_known_true(n >= lo) and statically_known_true(n <= hi)

    for span in spans:
        if holds(rows, *span[:2]) and (len(span) == 2 or holds(tokens, *span[2:])):
            return "kernel"
    return "native"


@torch.compiler.assume_constant_result
def kernel_rows(op: str, index: int | None, dtype: torch.dtype, head_dim: int,
                width: int, graphed: bool) -> tuple[tuple[int, ...], ...]:  # fmt: skip
    """The row counts at which `choice_among` picks `op`'s kernel for this GPU, torch, dtype, head dim, width and
    mode, as inclusive (lo, hi) spans; for TOKEN_KEYED_OPS boxes (rows lo, rows hi, tokens lo, tokens hi). A constant
    to torch.compile (the data is read outside the trace), so the rows and tokens, possibly symbolic, are compared
    in the graph's code (`pick`)."""
    if dtype not in DTYPES:
        return ()
    key = (gpu_name(index), torch_version(), op, DTYPES[dtype], head_dim, width)
    mode = MODES[bool(graphed)]
    near = [p for p in points() if close(p, *key, p.rows, mode, p.tokens)]
    rows = _candidates([p.rows for p in near])

    def spans_at(tokens: int | None) -> list[list[int]]:
        spans: list[list[int]] = []
        for i, n in enumerate(rows):
            if choice_among(near, *key, n, mode, tokens) != "kernel":
                continue
            if spans and spans[-1][1] == rows[i - 1]:
                spans[-1][1] = n
            else:
                spans.append([n, n])
        return spans

    if op not in TOKEN_KEYED_OPS:
        return tuple((lo, hi) for lo, hi in spans_at(None))
    # the row spans at each candidate token count, a box growing while the next count keeps its span
    boxes: list[list[int]] = []
    growing: dict[tuple[int, int], list[int]] = {}
    last = None
    for t in _candidates([p.tokens for p in near]):
        now = {}
        for lo, hi in spans_at(t):
            box = growing.get((lo, hi))
            if box is not None and box[3] == last:
                box[3] = t
            else:
                box = [lo, hi, t, t]
                boxes.append(box)
            now[(lo, hi)] = box
        growing, last = now, t
    return tuple(tuple(b) for b in boxes)


def _candidates(counts: list[int]) -> list[int]:
    """The counts (rows, or tokens) at which a choice among points measured at `counts` can change, with their
    neighbours, sorted: next to a point's reach (n / 2, 2 n) or between two points (their geometric mean)."""
    edges = {e for n in counts for e in (-(-n // ROWS_FACTOR), n * ROWS_FACTOR)}
    edges |= {math.isqrt(n * m) for n in counts for m in counts}
    return sorted({max(1, e + d) for e in edges for d in (-1, 0, 1, 2)})


def torch_version(version: str | None = None) -> str:
    """major.minor of `version` (default: the installed torch): the version a decision table is keyed by."""
    return ".".join((version or torch.__version__).split("+")[0].split(".")[:2])


def user_file() -> pathlib.Path:
    """The user's own decision file: measurements of their GPU that replace the committed ones for it."""
    return pathlib.Path(cache_dir()) / USER_FILE


def points() -> tuple[Point, ...]:
    """Every measured point: the committed file's, with the tables of any GPU the user's file names replaced by the
    user's. Re-read when the user's file changes."""
    path = user_file()
    try:
        st = path.stat()
        stamp = (str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    return _points(stamp)


@functools.lru_cache(maxsize=4)
def _points(user_stamp: tuple | None) -> tuple[Point, ...]:
    ours = read_points(DATA_FILE)
    theirs = read_points(pathlib.Path(user_stamp[0])) if user_stamp else []
    replaced = {p.gpu for p in theirs}
    return tuple([p for p in ours if p.gpu not in replaced] + theirs)


def read_points(path: pathlib.Path) -> list[Point]:
    """The points of a decision file (format: docs/decisions.md); a file that cannot be read is named in a warning
    and ignored (every op then runs native on the GPUs it would have named), never an error in the user's process."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        found = []
        for t in data["tables"]:
            for p in t["points"]:
                point = Point(t["gpu"], torch_version(t["torch"]), *(p[f] for f in Point._fields[2:-1]),
                              p.get("tokens"))  # fmt: skip
                if point.mode not in MODES or point.choice not in ("native", "kernel") or point.rows <= 0:
                    raise ValueError(f"bad point {p}")
                found.append(point)
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"fullgraph: decision file {os.fspath(path)} ignored ({e}); compiled auto runs native there",
                      stacklevel=2)  # fmt: skip
        return []


# GPU name -> {op: the main input's element count up to which the op's kernel beats its native form inside a graph
# that replays from CUDA graphs}; only there (`fullgraph.replay`: the launches' host time is paid once, at capture),
# for ops whose native form is the choice otherwise. attention (input: q, B x H x N x D): timm-weight ViT-B/16 at
# batch 4 (q 4x12x197x64 = 605K elements) under perception ran 0.570 ms with our kernel against 0.615 ms with
# torch's SDPA (cuDNN, plus a memset node per call) in the same call, 90 kernels against 102
# (benchmarks/results/vit_h200.txt, sixth session); at batch 256 (38.7M elements) our kernel lost inside the graph
# (2.77 against 2.13 ms of attention). Unmeasured between: the line sits just above the win, 2**20.
GRAPHED_KERNEL_MAX_NUMEL: dict[str, dict[str, int]] = {"NVIDIA H200": {"attention": 1 << 20}}


# Eager `auto` on a GPU takes the kernel only from this many elements of the main input up: below it a call is
# host-bound and the kernel's launch path (a Python launcher, Triton's argument handling) costs more than the GPU
# time it saves. On the H200 host (torch 2.11, triton 3.6; benchmarks/results/eager_overhead_h200.txt) the native
# form was faster per call at every size measured, 4x128 to 4096x3072 bf16 (kernel / native 2.4-2.8x, calls back to
# back); a kernel call costs ~41 us of host time against ~15 us for the native one, so the kernel can only pay once
# the native form's GPU time passes that: about 50M bf16 elements at 4.8 TB/s, hence 2**26. Under the Triton
# interpreter (CPU tests) the kernel always runs, as speed means nothing there.
EAGER_KERNEL_MIN_NUMEL: dict[str, int] = {"cuda": 1 << 26}

# Device type -> {op: its own floor}, replacing the one above for an op whose native form takes several launches
# where its kernel takes one, so that the kernel's one launch costs less host time than the native form's several
# at every size. The two fused ops of a DiT block: native, qk_norm_rope is two RMSNorms and eight elementwise
# launches and layer_norm_modulate up to five, each kernel one launch. The eager DiT stack (dim 3072, 4 blocks,
# bf16) at 1024 tokens on the H200 (benchmarks/results/dit_host_probe_h200.txt, eighth session): auto with the
# device floor alone 1.034x plain eager (2.720 against 2.812 ms, 135 kernels per call against 171), with both fused
# kernels 1.126x (2.497 ms, 60 kernels), with linear_gelu's epilogue too 1.134x (2.480 ms, 56 kernels): its floor
# as in compiled code.
EAGER_KERNEL_MIN_NUMEL_BY_OP: dict[str, dict[str, int]] = {
    "cuda": {"qk_norm_rope": 0, "layer_norm_modulate": 0, "linear_gelu": 1 << 21}
}


def eager_floor(device_type: str, op: str | None = None) -> int:
    """The main input's element count from which eager `auto` takes `op`'s kernel on `device_type`."""
    own = EAGER_KERNEL_MIN_NUMEL_BY_OP.get(device_type)
    if own and op in own:
        return own[op]
    return EAGER_KERNEL_MIN_NUMEL.get(device_type, 0)


def eager_kernel_pays(device_type: str, numel: int, op: str | None = None) -> bool:
    """Is an eager input of `numel` elements on `device_type` big enough for `auto` to take `op`'s kernel (any op's,
    for None: the device's floor)?"""
    return numel >= eager_floor(device_type, op)


def eager_size_class(device_type: str, numel: int) -> int:
    """How many of `device_type`'s eager floors `numel` reaches: inputs of one class get the same eager choices."""
    floors = {EAGER_KERNEL_MIN_NUMEL.get(device_type, 0), *EAGER_KERNEL_MIN_NUMEL_BY_OP.get(device_type, {}).values()}
    return sum(numel >= f for f in floors)


def graphed_kernel_fits(op: str, device: torch.device, numel: int | torch.SymInt) -> bool:
    """Does GRAPHED_KERNEL_MAX_NUMEL put `op`'s kernel ahead for a main input of `numel` elements in the code traced
    now? Only when that code replays from CUDA graphs, and only when `numel` is known (without a guard:
    `statically_known_true`, decided against a dynamic dim's range) to be within the entry. Attention keeps this
    rule of its own (issue 32 leaves it out of the per-shape data)."""
    if device.type != "cuda" or not replay.under_graphs():
        return False
    cap = GRAPHED_KERNEL_MAX_NUMEL.get(gpu_name(device.index), {}).get(op)
    return cap is not None and bool(statically_known_true(numel <= cap))


_names: dict[int | None, str] = {}


@torch.compiler.assume_constant_result
def gpu_name(index: int | None) -> str:
    """The CUDA device's name (the current device for None), a constant to torch.compile."""
    if index not in _names:
        _names[index] = torch.cuda.get_device_name(index)
    return _names[index]
