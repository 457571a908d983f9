"""A stand-in for torchvision's NMS and RoI Align, for CPU tests: torchvision's wheels for this torch need CUDA.
Written into a folder that a test puts on `sys.path`, beside a detector target that calls it as torchvision's
detection models do.

Like torchvision's: `batched_nms` separates classes by offsetting their boxes and calls `nms`, whose output size
depends on the data (Dynamo breaks the graph there: "Dynamic shape operator"), and whose kernel has no bf16.
`roi_align` (one bilinear sample per bin) has no bf16 kernel either, and `poolers` binds it at import, as
torchvision's do. `detector.py:build_rcnn` pools the kept boxes with it, as R-CNN's box heads do.
Not collected by pytest (no `test_` prefix).
"""

from __future__ import annotations

import sys
from pathlib import Path

BOXES = """
import torch


def nms(boxes, scores, iou_threshold):
    if boxes.dtype == torch.bfloat16:  # torchvision's kernel is dispatched for float, double and half only
        raise RuntimeError("\\"nms_kernel\\" not implemented for 'BFloat16'")
    order = scores.argsort(descending=True)
    b = boxes[order]
    lt = torch.maximum(b[:, None, :2], b[None, :, :2])
    rb = torch.minimum(b[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (b[:, 2:] - b[:, :2]).prod(-1)
    over = (inter / (area[:, None] + area[None, :] - inter) > iou_threshold).triu(1)
    keep = torch.ones(b.shape[0], dtype=torch.bool, device=b.device)
    for i in range(b.shape[0]):  # greedy, in score order: a kept box suppresses the later ones it overlaps
        keep = keep & ~(over[i] & keep[i])
    return order[keep.nonzero().squeeze(1)]


def batched_nms(boxes, scores, idxs, iou_threshold):
    offsets = idxs.to(boxes) * (boxes.max() + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)
"""

ROI_ALIGN = """
import torch
import torch.nn.functional as F


def roi_align(input, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
    if input.dtype == torch.bfloat16:  # torchvision's kernels are dispatched for float, double and half only
        raise NotImplementedError("\\"roi_align_forward_kernel\\" not implemented for 'BFloat16'")
    if not isinstance(boxes, torch.Tensor):  # a list per image: (image, x1, y1, x2, y2) rows
        boxes = torch.cat([torch.cat([torch.full_like(b[:, :1], i), b], 1) for i, b in enumerate(boxes)])
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    h, w = input.shape[-2:]
    ty = (torch.arange(oh, device=input.device, dtype=input.dtype) + 0.5) / oh
    tx = (torch.arange(ow, device=input.device, dtype=input.dtype) + 0.5) / ow
    b = boxes[:, 1:] * spatial_scale
    y = b[:, 1, None] + (b[:, 3, None] - b[:, 1, None]) * ty  # one sample per bin, at its centre
    x = b[:, 0, None] + (b[:, 2, None] - b[:, 0, None]) * tx
    grid = torch.stack(torch.broadcast_tensors(x[:, None, :] / w * 2 - 1, y[:, :, None] / h * 2 - 1), -1)
    return F.grid_sample(input[boxes[:, 0].long()], grid, align_corners=False)
"""

POOLERS = """
from torchvision.ops.roi_align import roi_align


def pool(features, boxes, output_size, spatial_scale):
    return roi_align(features, boxes, output_size, spatial_scale)
"""

DETECTOR = '''
import torch
from torch import nn
from torchvision.ops import boxes as box_ops, poolers


class Detector(nn.Module):
    """A one-level detector: a strided conv predicts a box, a score and a class per cell, then NMS."""

    def __init__(self):
        super().__init__()
        self.head = nn.Conv2d(3, 6, 4, stride=4)

    def forward(self, x):
        out = self.head(x)[0].flatten(1).T  # [cells, 6]
        xy, wh = out[:, :2].sigmoid() * 32, out[:, 2:4].exp() * 4
        boxes = torch.cat([xy - wh, xy + wh], 1)
        scores = out[:, 4].sigmoid()
        labels = (out[:, 5] > 0).long()
        keep = box_ops.batched_nms(boxes, scores, labels, 0.5)
        return [{"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}]


def build():
    torch.manual_seed(0)
    return Detector().eval(), (torch.randn(1, 3, 24, 24),)


class RCNN(Detector):
    """Two stages, as R-CNN's: the kept boxes' features pooled with roi_align (through the poolers, as torchvision's
    box heads are) and rescored."""

    def __init__(self):
        super().__init__()
        self.box_head = nn.Linear(6 * 2 * 2, 1)

    def forward(self, x):
        features = self.head(x)
        (found,) = super().forward(x)
        pooled = poolers.pool(features, [found["boxes"]], (2, 2), 0.25)
        scores = found["scores"] * self.box_head(pooled.flatten(1))[:, 0].sigmoid()
        return [{"boxes": found["boxes"], "scores": scores, "labels": found["labels"]}]


def build_rcnn():
    torch.manual_seed(0)
    return RCNN().eval(), (torch.randn(1, 3, 24, 24),)
'''


def write(folder: Path) -> Path:
    """The fake torchvision package and `detector.py` (target `detector.py:build`) in `folder`; returns the
    detector's path."""
    ops = folder / "torchvision" / "ops"
    ops.mkdir(parents=True)
    (folder / "torchvision" / "__init__.py").write_text("from torchvision import ops\n")
    (ops / "__init__.py").write_text(
        "from torchvision.ops.boxes import batched_nms, nms\nfrom torchvision.ops.roi_align import roi_align\n"
    )
    (ops / "boxes.py").write_text(BOXES)
    (ops / "roi_align.py").write_text(ROI_ALIGN)
    (ops / "poolers.py").write_text(POOLERS)
    (folder / "detector.py").write_text(DETECTOR)
    return folder / "detector.py"


def forget() -> None:
    """Drop the fake modules from `sys.modules`, so no later test imports them."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("torchvision", "detector")]:
        del sys.modules[name]
