"""torchvision's RoI Align in bfloat16: its CUDA and CPU kernels have none (`"roi_align_forward_kernel" not
implemented for 'BFloat16'`), so Faster, Mask and Keypoint R-CNN fail in bf16 as soon as a box head pools.

`upcast_torchvision_roi_align()` runs it in float32 for bf16 inputs within a `with` block: the features and boxes
are cast up, torchvision's own kernel pools, and the result is cast back to bf16. Each output is a weighted mean of
bf16 values computed in float32 and rounded once, so it is at least as accurate as a bf16 kernel would be; the cost
is one float32 copy of each pooled feature level per call. Other dtypes pass through untouched.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

from fullgraph.models._torchvision import swapped

_NO_KERNEL = (torch.bfloat16,)  # the dtypes torchvision's roi_align has no kernel for


def upcasting(roi_align: Callable) -> Callable:
    """`roi_align` (torchvision's signature) computing in float32 where the input's dtype has no kernel."""

    @functools.wraps(roi_align)
    def upcast(input, boxes, *args, **kwargs):
        if input.dtype not in _NO_KERNEL:
            return roi_align(input, boxes, *args, **kwargs)
        boxes = boxes.float() if isinstance(boxes, torch.Tensor) else [b.float() for b in boxes]
        return roi_align(input.float(), boxes, *args, **kwargs).to(input.dtype)

    return upcast


def upcast_torchvision_roi_align() -> contextlib.AbstractContextManager[None]:
    """Within the block, torchvision's `roi_align` (as its poolers, Mask R-CNN's mask targets and
    `torchvision.ops.roi_align` call it) pools bf16 inputs in float32 and returns bf16; the original returns on exit.
    Under `torch.compile`, Dynamo guards on the name, so a model compiled inside the block recompiles outside it."""
    return swapped("torchvision.ops.roi_align", "roi_align", upcasting, "upcast_torchvision_roi_align")


__all__ = ["upcast_torchvision_roi_align", "upcasting"]
