"""Detection outputs compared by meaning (issue 34, item 6): a list of detections whose near-tied scores swap order
is not wrong, and a flat error over concatenated boxes cannot tell a reorder from a moved box.

An output is a detection list when it is a list or tuple of dicts, each holding `boxes` [N, 4] (x1, y1, x2, y2),
`scores` [N] and `labels` [N] (torchvision's detectors; masks, where present, follow their boxes). Two lists are
compared image by image: a reference detection is matched by an unmatched detection of the same label whose box
overlaps it by IoU >= `iou_min` and whose score is within `score_tol`, highest IoU first; the matched fraction is
matched pairs over the larger of the two counts, so a missing or an extra detection counts against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

KEYS = ("boxes", "scores", "labels")
# Per the dtype a row runs in: the IoU a matched box must reach, and the fraction of detections that must match.
# float32 covers TF32 too (its convolutions run in TF32 by default on the GPU).
IOU_MIN = {torch.float32: 0.9, torch.bfloat16: 0.8, torch.float16: 0.8}
MATCHED_MIN = {torch.float32: 0.98, torch.bfloat16: 0.95, torch.float16: 0.95}


def detection_lists(value: Any) -> list[Mapping[str, torch.Tensor]] | None:
    """`value` as a list of per-image detection dicts, or None when it is not one."""
    if not isinstance(value, Sequence) or isinstance(value, (str, torch.Tensor)) or not value:
        return None
    ok = all(isinstance(d, Mapping) and all(isinstance(d.get(k), torch.Tensor) for k in KEYS) for d in value)
    return list(value) if ok else None


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box of `a` [R, 4] with every box of `b` [O, 4] (x1, y1, x2, y2), in float64: [R, O]."""
    a, b = a.double(), b.double()
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)  # [R]
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # [O]
    lo = torch.maximum(a[:, None, :2], b[None, :, :2])  # [R, O, 2]
    hi = torch.minimum(a[:, None, 2:], b[None, :, 2:])  # [R, O, 2]
    inter = (hi - lo).clamp(min=0).prod(-1)  # [R, O]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def _matched(out: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], iou_min: float, score_tol: float) -> int:
    """Pairs matched in one image, greedily: reference detections by descending score, each taking the unmatched
    candidate of its label with the highest IoU, among those within `iou_min` and `score_tol`."""
    if not len(ref["boxes"]) or not len(out["boxes"]):
        return 0
    iou = box_iou(ref["boxes"], out["boxes"])  # [R, O]
    same = ref["labels"].cpu()[:, None] == out["labels"].cpu()[None, :]
    close = (ref["scores"].cpu().double()[:, None] - out["scores"].cpu().double()[None, :]).abs() <= score_tol
    cand = torch.where(same & close & (iou.cpu() >= iou_min), iou.cpu(), torch.full_like(iou.cpu(), -1.0))
    taken = torch.zeros(cand.shape[1], dtype=torch.bool)
    n = 0
    for r in torch.argsort(ref["scores"].cpu().double(), descending=True).tolist():
        row = cand[r].masked_fill(taken, -1.0)
        best = int(row.argmax())
        if row[best] >= 0:
            taken[best] = True
            n += 1
    return n


def matched_fraction(out: Any, ref: Any, iou_min: float, score_tol: float) -> float | None:
    """The fraction of detections matched between `out` and the reference `ref` (see the module docstring); None
    when `ref` is not a detection list, 0.0 when `out` is not one of the same number of images."""
    refs = detection_lists(ref)
    if refs is None:
        return None
    outs = detection_lists(out)
    if outs is None or len(outs) != len(refs):
        return 0.0
    total = sum(max(len(r["boxes"]), len(o["boxes"])) for o, r in zip(outs, refs, strict=True))
    if total == 0:
        return 1.0
    return sum(_matched(o, r, iou_min, score_tol) for o, r in zip(outs, refs, strict=True)) / total
