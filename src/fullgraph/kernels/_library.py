"""How a Triton launcher becomes a torch op, and the helpers every kernel file shares.

On a GPU the launcher is registered with `torch.library.triton_op`: torch.compile traces into it (the
launches go through `wrap_triton`), so the kernel sits inside a `fullgraph=True` graph and CUDA graphs.
Kernels built for Triton's CPU interpreter (TRITON_INTERPRET=1, how CI tests them) cannot be traced, so
there the launcher is an opaque `custom_op` with an explicit fake; the same fake documents the output
shapes in both cases. Without Triton the op still exists (so graphs and exports name it) and raises a clear
error when run.
"""

from __future__ import annotations

import hashlib
import pathlib
import threading
from collections.abc import Callable

import torch

from fullgraph import env
from fullgraph._paths import cache_dir
from fullgraph.errors import FullgraphError

NAMESPACE = "fullgraph"
_TAG = "fullgraph-"


def ops_fingerprint() -> str:
    """A hash of the sources that define our ops, their launchers and fakes (fullgraph/kernels and fullgraph/ops),
    and of the decision data compiled `auto` reads (fullgraph/ops/data, and the user's own decisions.json in
    fullgraph's cache folder, `ops/measured.py`): a changed decision changes the code a graph holds."""
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    sources = [*root.joinpath("kernels").glob("*.py"), *root.joinpath("ops").glob("*.py")]
    for path in [*sorted(sources), *sorted(root.joinpath("ops", "data").glob("*.json")), _user_decisions()]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _user_decisions() -> pathlib.Path:
    # the file `fullgraph.ops.measured.user_file` names (kernels may not import ops: the name is repeated here)
    return pathlib.Path(cache_dir()) / "decisions.json"


def tag_compile_caches() -> None:
    """Add our ops' fingerprint to torch's compile-cache keys (`torch.compiler.config.cache_key_tag`, kept beside any
    tag of the user's). Inductor's FX graph cache and AOTAutograd's cache key on the graph, which names an op but not
    its fake: after a fullgraph change to an op's output strides, a cached graph built against the old fake failed
    at its first call ("expected size 2==2, stride 64==2112"), and one without that check would read the output
    wrongly. A no-op on a torch without the setting."""
    config = torch.compiler.config
    try:
        current = config.cache_key_tag
    except AttributeError:
        return
    kept = [t for t in current.split("|") if t and not t.startswith(_TAG)]
    config.cache_key_tag = "|".join([*kept, _TAG + ops_fingerprint()])


tag_compile_caches()


def require_triton():
    """Import triton for a kernel build, or raise an error that says what to install."""
    if not env.has_triton():
        raise FullgraphError("this kernel needs triton: pip install 'fullgraph[triton]', or use the 'native' policy")
    import triton
    import triton.language as tl

    return triton, tl


_direct = threading.local()  # set while `call_kernel` runs a launcher outside any tracing


def launch(kernel):
    """The kernel as seen by torch: traceable through `wrap_triton` when built for a GPU, the bare kernel
    when nothing traces (wrap_triton's wrapper costs hundreds of µs per eager launch on torch 2.11)."""
    if getattr(_direct, "on", False) or env.triton_interpret():
        return kernel
    return torch.library.wrap_triton(kernel)


def kernel_op(name: str, *, fake: Callable, mutates_args: tuple[str, ...] = ()):
    """Register a launcher as `torch.ops.fullgraph.<name>` (see the module docstring for the mechanism)."""

    def register(fn: Callable):
        qualname = f"{NAMESPACE}::{name}"
        if env.has_triton() and not env.triton_interpret():
            op = torch.library.triton_op(qualname, fn, mutates_args=mutates_args)
        else:
            op = torch.library.custom_op(qualname, fn, mutates_args=mutates_args)
            op.register_fake(fake)
        op.launcher = fn  # the plain launcher, for `call_kernel`'s eager fast path
        return op

    return register


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a module's weights are Parameters: not a subclass that could watch


def call_kernel(op, *args):
    """Run a registered op that carries its plain implementation as `op.launcher` (every kernel op here, and
    the attention backends). In plain eager inference the launcher is called directly: the torch op dispatch
    (custom-op and autograd layers in Python) costs more host time than a short kernel takes on the GPU.
    Whenever anything could be watching (torch.compile, export, a dispatch mode such as FakeTensor or
    make_fx, or autograd), the registered op is called, so the op appears in graphs and gets its backward.
    """
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if (
        torch.compiler.is_compiling()
        or _current_dispatch_mode() is not None
        or any(type(t) not in _PLAIN for t in tensors)
        or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    ):
        return op(*args)
    _direct.on = True
    try:
        return op.launcher(*args)
    finally:
        _direct.on = False


def _current_dispatch_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def row_pieces(n: int, most: int = 3) -> tuple[int, ...]:
    """`n` columns as `most` power-of-two pieces, largest first (0 for a piece not needed): each piece but the last
    is the largest power of two that fits what is left, the last covers the rest rounded up to a power of two.
    72 -> (64, 8, 0), 88 -> (64, 16, 8), 1408 -> (1024, 256, 128), 123 -> (64, 32, 32): a kernel that holds a row
    as these pieces uses every lane where one block of next_power_of_2(n) leaves up to half of them idle
    (72 in 128: 44%)."""
    pieces = []
    left = n
    while left and len(pieces) < most - 1:
        piece = 1 << (left.bit_length() - 1)
        pieces.append(piece)
        left -= piece
    if left:
        pieces.append(1 << (left - 1).bit_length())
    return (*pieces, *([0] * (most - len(pieces))))


def row_launch_config(n_cols: int, n_rows: int) -> tuple[tuple[int, ...], int, int]:
    """(pieces, ROWS per program, num_warps) for a kernel that keeps whole rows in registers as `row_pieces`.

    Long rows get one program each and more warps; short rows (q/k norm, 72 to 128 wide) are packed many to a
    program, about 4096 elements each, so each program still moves enough bytes to hide memory latency.
    """
    pieces = row_pieces(n_cols)
    width = sum(pieces)
    if width > MAX_ROW:
        raise FullgraphError(f"rows of {n_cols} elements exceed this kernel's limit of {MAX_ROW}")
    rows = max(1, min(64, 1 << ((4096 // width).bit_length() - 1) if width <= 4096 else 1, _pow2_at_least(n_rows)))
    elems = width * rows
    num_warps = 4 if elems <= 2048 else 8 if elems <= 8192 else 16
    return pieces, rows, num_warps


def _pow2_at_least(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def alignment(*strides: int, cap: int = 16) -> int:
    """The largest power of two (at most `cap`) dividing every stride, in elements: a kernel states it with
    `tl.multiple_of` on its row offsets, since Triton only knows an integer argument's alignment when it is a
    multiple of 16 (a head dim of 72 is not), and without it loads and stores go one element at a time."""
    align = cap
    for s in strides:
        while align > 1 and s % align:
            align //= 2
    return align


MAX_ROW = 32768


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View `x` as [rows, last dim] with unit stride along the row; copies only if no such view exists."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()
