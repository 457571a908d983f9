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

`batched_nms(boxes [N, 4], scores [N], idxs [N], iou_threshold)` is the same core as a drop-in for
`torchvision.ops.batched_nms` (kept indices, best first, iterated until exact, one data-dependent step at the end),
and `replace_torchvision_nms()` makes torchvision's detection models call it within a `with` block.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch._higher_order_ops import while_loop

from fullgraph.errors import UsageError
from fullgraph.models._torchvision import swapped


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


def _suppressions(rows, cols, row_labels, col_labels, first_row: int, iou_threshold: float) -> torch.Tensor:
    """[..., R, C] bool: candidate first_row + r, if kept, suppresses candidate c (both indexed in score order), as
    it comes earlier, has the same label and overlaps c with IoU > iou_threshold. rows [..., R, 4], cols [..., C, 4]."""
    i = torch.arange(rows.shape[-2], device=rows.device) + first_row
    j = torch.arange(cols.shape[-2], device=cols.device)
    same_label = row_labels[..., :, None] == col_labels[..., None, :]  # labels never suppress each other
    return (box_iou(rows, cols) > iou_threshold) & same_label & (i[:, None] < j[None, :])


def _greedy_step(suppresses: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """One Cluster-NMS iteration: keep exactly the candidates that no kept candidate suppresses. [..., P] bool."""
    return ~(suppresses & keep[..., :, None]).any(dim=-2)


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
    flat = cand.float()
    suppresses = _suppressions(flat, flat, cand_labels, cand_labels, 0, iou_threshold) & valid[:, :, None]  # [B,P,P]
    keep = valid
    converged = torch.ones(b, dtype=torch.bool, device=boxes.device)
    for _ in range(max_iters):  # a fixed count: the graph stays one size; `converged` says whether it sufficed
        nxt = valid & _greedy_step(suppresses, keep)
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


# The drop-in for torchvision: the same greedy NMS, exact, with torchvision's variable-length answer.

_DTYPES_KEPT = (torch.float32, torch.float64)  # half precision is upcast for the IoU, as torchvision does
_PAIRS_PER_BLOCK = 1 << 22  # eager builds the suppression matrix in row blocks of about this many pairs


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """`torchvision.ops.batched_nms`, exactly: boxes [N, 4] (x1, y1, x2, y2), scores [N], idxs [N] (the class of each
    box; classes never suppress each other) -> int64 indices of the kept boxes, in decreasing score order.

    Greedy NMS over all N boxes (no score threshold, no cap), by the Cluster-NMS fixed point of `nms`, iterated until
    nothing changes, so the result is greedy NMS's whatever the chains of suppression. Tied scores are taken in index
    order (a stable sort; torchvision leaves their order unspecified). Labels are compared, not separated by
    torchvision's coordinate offsets, so boxes far from the origin keep their precision.

    Memory: the [N, N] suppression matrix, N² bytes (RPN's ~4,700 proposals per image: 22 MB; 12,000 boxes: 144 MB;
    90,000: 8.1 GB). Eager fills it in row blocks of ~4M pairs (~200 MB of float32 temporaries) and each iteration
    writes one more N² bool; compiled, Inductor fuses the IoU, label and order tests into the kernel that writes it.

    Shapes and graph breaks: the answer's length is data-dependent, so it comes from one boolean-mask step at the very
    end (a `nonzero`). Under `torch.compile` that step needs `torch._dynamo.config.capture_dynamic_output_shape_ops =
    True` to stay in the graph (set it in a scoped `torch._dynamo.config.patch`); without it Dynamo breaks the graph
    there, once per call and after all the work, as torchvision's NMS op (its output size is data-dependent too)
    breaks it inside torchvision's code. With the flag the output has an unbacked size that later code must not
    branch on. Either way the call reads the device, as torchvision's CUDA kernel does when it copies its mask to the
    host: once per iteration (eager: one bool; compiled: the predicate of a `while_loop`, which keeps the loop in the
    graph) and once for the count. So this form cannot run under CUDA graphs; `nms`, with its fixed capacity, can.
    """
    _check_dropin(boxes, scores, idxs, iou_threshold)
    order = scores.sort(descending=True, stable=True).indices  # [N], best first, ties by index
    cand = boxes[order]
    cand = cand if cand.dtype in _DTYPES_KEPT else cand.float()  # [N, 4]
    suppresses = _suppression_matrix(cand, idxs[order], iou_threshold)  # [N, N]
    keep = _settle(suppresses)  # [N] bool, in score order
    return order[keep]  # the one data-dependent shape


def _check_dropin(boxes, scores, idxs, iou_threshold) -> None:
    if boxes.ndim != 2 or boxes.shape[-1] != 4:
        raise UsageError(f"boxes must be [N, 4] (x1, y1, x2, y2), got {tuple(boxes.shape)}")
    n = boxes.shape[0]
    if scores.ndim != 1 or scores.shape[0] != n or idxs.ndim != 1 or idxs.shape[0] != n:
        raise UsageError(f"scores and idxs must be [N] = [{n}], got {tuple(scores.shape)} and {tuple(idxs.shape)}")
    if not boxes.is_floating_point() or not scores.is_floating_point():
        raise UsageError(f"boxes and scores must be floating point, got {boxes.dtype} and {scores.dtype}")
    if not 0.0 <= iou_threshold <= 1.0:
        raise UsageError(f"iou_threshold must be in [0, 1], got {iou_threshold}")


def _suppression_matrix(cand: torch.Tensor, labels: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """[N, N] bool over candidates in score order (see `_suppressions`). Compiled: one expression, which Inductor
    fuses. Eager: row blocks, so the float temporaries of the IoU stay ~200 MB however large N is."""
    if torch.compiler.is_compiling():
        return _suppressions(cand, cand, labels, labels, 0, iou_threshold)
    n = cand.shape[0]
    out = torch.empty(n, n, dtype=torch.bool, device=cand.device)
    rows = max(1, _PAIRS_PER_BLOCK // max(n, 1))
    for start in range(0, n, rows):
        end = min(start + rows, n)
        out[start:end] = _suppressions(cand[start:end], cand, labels[start:end], labels, start, iou_threshold)
    return out


def _settle(suppresses: torch.Tensor) -> torch.Tensor:
    """Iterate `_greedy_step` from "all kept" until it changes nothing: exactly greedy NMS's kept mask [N]."""
    keep = torch.ones(suppresses.shape[0], dtype=torch.bool, device=suppresses.device)
    if torch.compiler.is_compiling():  # a loop in the graph; a Python loop would break it at every test

        def changed(keep, moved):
            return moved.any()  # a new tensor: a while_loop predicate may not alias its inputs

        def step(keep, moved):
            nxt = _greedy_step(suppresses, keep)
            return nxt, (nxt != keep).any()

        moved = torch.ones((), dtype=torch.bool, device=keep.device)
        return while_loop(changed, step, (keep, moved))[0]
    while True:  # eager: one host read per iteration, as many iterations as the longest chain of suppressions
        nxt = _greedy_step(suppresses, keep)
        if torch.equal(nxt, keep):
            return nxt
        keep = nxt


def replace_torchvision_nms() -> contextlib.AbstractContextManager[None]:
    """Within the block, torchvision's detection models (Faster/Mask/Keypoint R-CNN's RPN and box heads, RetinaNet,
    FCOS, SSD) and `torchvision.ops.batched_nms` run this module's `batched_nms`; the originals return on exit.

    It replaces the name where torchvision looks it up at call time: `torchvision.ops.boxes.batched_nms` (the
    detection modules call `box_ops.batched_nms`) and every loaded torchvision module that re-exports it. Code that
    bound the name itself (`from torchvision.ops import batched_nms`) keeps the original: pass it ours instead. The
    change is process-wide while the block runs. Under `torch.compile`, Dynamo guards on the name, so a model compiled
    inside the block recompiles outside it. See `batched_nms` for graph breaks and memory.
    """
    return swapped("torchvision.ops.boxes", "batched_nms", lambda _original: batched_nms, "replace_torchvision_nms")
