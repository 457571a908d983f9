"""A stand-in for torchvision's NMS, for CPU tests: torchvision's wheels for this torch need CUDA. Written into a
folder that a test puts on `sys.path`, beside a detector target that calls it as torchvision's detection models do.

Like torchvision's: `batched_nms` separates classes by offsetting their boxes and calls `nms`, whose output size
depends on the data (Dynamo breaks the graph there: "Dynamic shape operator"), and whose kernel has no bf16.
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

DETECTOR = '''
import torch
from torch import nn
from torchvision.ops import boxes as box_ops


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
'''


def write(folder: Path) -> Path:
    """The fake torchvision package and `detector.py` (target `detector.py:build`) in `folder`; returns the
    detector's path."""
    ops = folder / "torchvision" / "ops"
    ops.mkdir(parents=True)
    (folder / "torchvision" / "__init__.py").write_text("from torchvision import ops\n")
    (ops / "__init__.py").write_text("from torchvision.ops.boxes import batched_nms, nms\n")
    (ops / "boxes.py").write_text(BOXES)
    (folder / "detector.py").write_text(DETECTOR)
    return folder / "detector.py"


def forget() -> None:
    """Drop the fake modules from `sys.modules`, so no later test imports them."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("torchvision", "detector")]:
        del sys.modules[name]
