"""Our own fixes: graph breaks and failures that one of fullgraph's ops or models removes, recognised in a doctor
run, offered with the code that applies them, and applied to rows on request (`fullgraph doctor --with nms`,
`fullgraph.doctor(..., with_=("nms",))`) so that the effect is measured, not promised.

- `nms`: `fullgraph.models.replace_torchvision_nms()` runs fullgraph's exact `batched_nms` where torchvision's
  detection code calls its own. Offered for a break inside torchvision's NMS (its output size depends on the data)
  and for a row that fails in torchvision's kernel (`"nms_kernel" not implemented for 'BFloat16'`: ours runs in
  bf16). Ours keeps the work in the graph, but its last step (`order[keep]`) still has a data-dependent size.
- `roi_align`: `fullgraph.models.upcast_torchvision_roi_align()` pools bf16 inputs of torchvision's RoI Align in
  float32 and casts the result back. Offered for a row that fails in torchvision's kernel
  (`"roi_align_forward_kernel" not implemented for 'BFloat16'`: Faster/Mask/Keypoint R-CNN's box and mask heads).
- `dynamic_output_shapes`: `torch._dynamo.config.capture_dynamic_output_shape_ops=True` (scoped), which keeps that
  last step (and torchvision's own NMS op) in the graph as an output of unbacked size. It is torch's switch, not
  ours, and it changes how every data-dependent shape of the model is compiled (and disables CUDA graphs for
  such graphs), so it is never turned on unless named: offered beside `nms` for NMS breaks only.

Checked on torch 2.13 and not offered, because nothing breaks there: RoPE written with complex numbers
(`torch.polar`, `view_as_complex`) compiles with `fullgraph=True` in fp32 and bf16.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from fullgraph._paths import display_path
from fullgraph.diagnose.schema import ConfigResult, FixOffer, GraphBreak
from fullgraph.errors import UsageError
from fullgraph.models.nms import replace_torchvision_nms
from fullgraph.models.roi_align import upcast_torchvision_roi_align

# A frame of torchvision's NMS (the Python wrappers around its `torchvision::nms` op) or of ours.
_TORCHVISION_NMS = r"torchvision[\\/]ops[\\/]boxes\.py:(nms|batched_nms|_batched_nms_\w+)$"
_OURS_NMS = r"fullgraph[\\/]models[\\/]nms\.py:\w+$"
_CALL = "y = model(*args, **kwargs)"


@dataclass(frozen=True)
class Fix:
    """One named fix: what it does, the context it is applied in, and what it is offered for."""

    name: str  # the --with / with_= name
    what: str  # what applying it does, one line
    enter: str  # the context manager a user writes around the call (the code offered)
    context: Callable[[], contextlib.AbstractContextManager]  # the same, as the doctor enters it around a row
    frames: str  # a break is offered this fix when a frame of its stack ("file:function") matches ("" never)
    reasons: str = ""  # ... and its reason matches this ("" any)
    failures: str = ""  # a row's error offered this fix ("" none)
    needs: str = ""  # a module that must import for the fix to apply


FIXES = {
    f.name: f
    for f in (
        Fix(
            "nms",
            "torchvision's batched_nms replaced by fullgraph's (exact, traceable, runs in bf16)",
            "fullgraph.models.replace_torchvision_nms()",
            replace_torchvision_nms,
            frames=_TORCHVISION_NMS,
            failures=r'"nms_kernel" not implemented for',
            needs="torchvision.ops.boxes",
        ),
        Fix(
            "roi_align",
            "torchvision's roi_align run in float32 for bf16 inputs (its kernels have no bf16), the result cast back",
            "fullgraph.models.upcast_torchvision_roi_align()",
            upcast_torchvision_roi_align,
            frames="",
            failures=r'"roi_align_forward_kernel" not implemented for',
            needs="torchvision.ops.roi_align",
        ),
        Fix(
            "dynamic_output_shapes",
            "NMS's data-dependent output size kept in the graph (capture_dynamic_output_shape_ops=True, scoped)",
            "torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)",
            functools.partial(torch._dynamo.config.patch, capture_dynamic_output_shape_ops=True),
            frames=f"{_TORCHVISION_NMS}|{_OURS_NMS}",
            reasons="Dynamic shape operator|data.dependent",
        ),
    )
}


def check_with(names: Sequence[str], flag: str | None = None) -> tuple[str, ...]:
    """`names` as a tuple, each a known fix whose library imports, or one error naming the known ones."""
    names = tuple(names)
    where = flag or "with_"
    unknown = [n for n in names if n not in FIXES]
    if unknown:
        raise UsageError(f"{where}: unknown fix {', '.join(map(repr, unknown))}; choose from {', '.join(FIXES)}")
    for n in names:
        if FIXES[n].needs and not _imports(FIXES[n].needs):
            top = FIXES[n].needs.split(".")[0]
            raise UsageError(f"{where} {n}: {top} does not import here; install it (pip install {top}) or drop {n}")
    return names


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def applied(names: Sequence[str]) -> Iterator[None]:
    """Every fix of `names` applied for the block; each undone on exit."""
    with contextlib.ExitStack() as stack:
        for n in names:
            stack.enter_context(FIXES[n].context())
        yield


def code(names: Sequence[str], call: str = _CALL) -> str:
    """The code that applies `names` around a call: one `with` line, then the call."""
    return f"with {', '.join(FIXES[n].enter for n in names)}:\n    {call}"


def for_break(frames: Sequence[str], reason: str) -> list[str]:
    """The fixes that remove a break whose stack holds `frames` ("file:function") for `reason`."""
    return [
        n
        for n, f in FIXES.items()
        if f.frames
        and any(re.search(f.frames, fr) for fr in frames)
        and (not f.reasons or re.search(f.reasons, reason))
    ]


def break_fix(names: Sequence[str]) -> str:
    """The fix a break in NMS gets: ours, then what measuring it takes."""
    if "nms" in names:
        says = (
            "torchvision's NMS returns a data-dependent number of boxes, and its kernel has no bf16: run fullgraph's"
            " (exact, traceable, runs in bf16; its last step still has a data-dependent size, kept in the graph by"
            " dynamic_output_shapes), or the fixed-capacity fullgraph.models.nms where the caller is yours"
        )
    else:
        says = (
            "fullgraph's batched_nms returns a data-dependent number of boxes at its last step: keep it in the graph"
            " with dynamic_output_shapes (no CUDA graphs then), or use the fixed-capacity fullgraph.models.nms"
        )
    api = f"fullgraph.doctor(..., with_={tuple(names)!r})"
    return f"{says}; measure it: fullgraph doctor TARGET --with {','.join(names)} ({api})"


def for_failure(error: str) -> list[str]:
    """The fixes that remove a failure whose message is `error`."""
    return [n for n, f in FIXES.items() if f.failures and re.search(f.failures, error)]


def offers(breaks: Sequence[GraphBreak], configs: Sequence[ConfigResult], failures: Sequence[str]) -> list[FixOffer]:
    """Our fixes for this report: each with what it was offered for (break places, rows that failed, and `failures`,
    such as a Dynamo run that failed), in the order of FIXES. A row run with fixes offers only the others: with `nms`,
    Faster R-CNN's bf16 row gets past NMS and fails in roi_align."""
    why: dict[str, list[str]] = {n: [] for n in FIXES}
    for g in breaks:
        for n in g.fixes:
            why[n].append(f"graph break at {display_path(g.file)}:{g.line} in {g.function}")
    failed = [(f"{c.name} failed: {c.error}", c.fixes) for c in configs if c.error]  # a row with fixes can fail
    for text, tried in [*failed, *((f, []) for f in failures)]:  # further on, where another fix is needed
        for n in for_failure(text):
            if n not in tried:
                why[n].append(text)
    return [FixOffer(n, FIXES[n].what, code([n]), list(dict.fromkeys(why[n]))) for n in FIXES if why[n]]


__all__ = ["FIXES", "Fix", "applied", "break_fix", "check_with", "code", "for_break", "for_failure", "offers"]
