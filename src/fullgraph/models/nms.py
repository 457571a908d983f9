"""Batched, class-aware non-maximum suppression with fixed output shapes: compiles with `fullgraph=True`, runs
under CUDA graphs and exports, because nothing in it has a data-dependent shape or reads a value on the host.

    out = nms(boxes [B, N, 4] (x1, y1, x2, y2), scores [B, N], labels [B, N], iou_threshold=0.5,
              score_threshold=0.05, pre_top_k=1000, max_kept=100)
    out.boxes [B, K, 4], out.scores [B, K], out.labels [B, K], out.num_kept [B], out.converged [B]

Per image: scores at or below `score_threshold` are dropped, the `pre_top_k` best of the rest are kept in score
order (`topk`, a fixed size), and greedy NMS runs among them: a box is suppressed when a higher-scoring kept box of
the same label overlaps it with IoU > `iou_threshold`; labels never suppress each other (compared exactly, not
through torchvision's trick of shifting each label's boxes apart, which costs precision far from the origin).
The first K survivors, in score
order, fill the outputs; empty slots hold zeros, score 0 and label -1, and `num_kept` says how many are real.

Greedy NMS is sequential; here it is a fixed point computed in parallel (Cluster-NMS, Zheng et al., 2021): start
with every candidate kept, then repeatedly keep exactly those that no kept higher-scoring box suppresses. Each
iteration is one masked max over the [P, P] IoU matrix, and the result equals greedy NMS once it stops changing,
which takes as many iterations as the longest chain of suppressions (a suppresses b, which no longer suppresses
c, ...). `max_iters` bounds the iterations (a fixed graph); `converged` reports, per image, whether the last
iteration changed nothing, i.e. whether the result is exactly greedy NMS's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fullgraph.errors import UsageError


class NMSOutput(NamedTuple):
    boxes: torch.Tensor  # [B, K, 4]
    scores: torch.Tensor  # [B, K]
    labels: torch.Tensor  # [B, K], -1 in empty slots
    num_kept: torch.Tensor  # [B], int64
    converged: torch.Tensor  # [B], bool: the result is exactly greedy NMS's


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box in a [..., P, 4] with every box in b [..., Q, 4] -> [..., P, Q] (xyxy; empty boxes: 0)."""
    area_a = (a[..., 2] - a[..., 0]).clamp(min=0) * (a[..., 3] - a[..., 1]).clamp(min=0)
    area_b = (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[..., :, None] + area_b[..., None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))


def _check(boxes, scores, labels, iou_threshold, pre_top_k, max_kept, max_iters) -> None:
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise UsageError(f"boxes must be [B, N, 4] (x1, y1, x2, y2), got {tuple(boxes.shape)}")
    if scores.shape != boxes.shape[:2]:
        raise UsageError(f"scores must be [B, N] = {list(boxes.shape[:2])}, got {tuple(scores.shape)}")
    if labels is not None and labels.shape != boxes.shape[:2]:
        raise UsageError(f"labels must be [B, N] = {list(boxes.shape[:2])}, got {tuple(labels.shape)}")
    if not boxes.is_floating_point() or not scores.is_floating_point():
        raise UsageError(f"boxes and scores must be floating point, got {boxes.dtype} and {scores.dtype}")
    if not 0.0 <= iou_threshold <= 1.0:
        raise UsageError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    for name, value in (("pre_top_k", pre_top_k), ("max_kept", max_kept), ("max_iters", max_iters)):
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a positive int, got {value!r}")


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.05,
    pre_top_k: int = 1000,
    max_kept: int = 100,
    max_iters: int = 32,
) -> NMSOutput:
    """Batched class-aware NMS with fixed output shapes (see the module docstring). `labels=None`: one class."""
    _check(boxes, scores, labels, iou_threshold, pre_top_k, max_kept, max_iters)
    b, n = scores.shape
    if labels is None:
        labels = torch.zeros_like(scores, dtype=torch.int64)
    p = min(pre_top_k, n)
    masked = torch.where(scores > score_threshold, scores, torch.full_like(scores, -torch.inf))
    top, idx = masked.topk(p, dim=1)  # top: [B, P], best first; -inf marks a dropped candidate
    valid = top > -torch.inf
    cand = boxes.gather(1, idx[..., None].expand(b, p, 4))  # [B, P, 4]
    cand_labels = labels.gather(1, idx)  # [B, P]
    iou = box_iou(cand.float(), cand.float())  # [B, P, P]
    order = torch.arange(p, device=boxes.device)
    same_label = cand_labels[:, :, None] == cand_labels[:, None, :]  # labels never suppress each other
    # suppresses[i, j]: candidate i (earlier, so higher-scoring) would suppress j if i is kept
    suppresses = (iou > iou_threshold) & same_label & (order[:, None] < order[None, :]) & valid[:, :, None]
    keep = valid
    converged = torch.ones(b, dtype=torch.bool, device=boxes.device)
    for _ in range(max_iters):  # a fixed count: the graph stays one size; `converged` says whether it sufficed
        nxt = valid & ~(suppresses & keep[:, :, None]).any(dim=1)
        converged = (nxt == keep).all(dim=1)
        keep = nxt
    rank = keep.long().cumsum(dim=1) - 1  # the slot of each kept candidate, in score order
    slot = torch.where(keep & (rank < max_kept), rank, torch.full_like(rank, max_kept))  # max_kept: discarded
    k = max_kept
    out_boxes = cand.new_zeros(b, k + 1, 4).scatter(1, slot[..., None].expand(b, p, 4), cand)[:, :k]
    out_scores = top.new_zeros(b, k + 1).scatter(1, slot, torch.where(keep, top, torch.zeros_like(top)))[:, :k]
    out_labels = cand_labels.new_full((b, k + 1), -1).scatter(1, slot, cand_labels)[:, :k]
    num_kept = keep.sum(dim=1).clamp(max=k)
    return NMSOutput(out_boxes, out_scores, out_labels, num_kept, converged)


class BatchedNMS(torch.nn.Module):
    """`nms` as a module with its settings, for models and for `torch.export` (forward(boxes, scores, labels))."""

    def __init__(self, iou_threshold=0.5, score_threshold=0.05, pre_top_k=1000, max_kept=100, max_iters=32):
        super().__init__()
        self.settings = dict(iou_threshold=iou_threshold, score_threshold=score_threshold, pre_top_k=pre_top_k,
                             max_kept=max_kept, max_iters=max_iters)  # fmt: skip

    def forward(self, boxes, scores, labels=None) -> NMSOutput:
        return nms(boxes, scores, labels, **self.settings)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings.items())
