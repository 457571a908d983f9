"""fullgraph.models.nms against a plain greedy NMS written here, fixed shapes, fullgraph=True, export, bad input."""

import pytest
import torch

from fullgraph.errors import UsageError
from fullgraph.models.nms import BatchedNMS, box_iou, nms
from tests.skips import requires_cuda


def reference_nms(boxes, scores, labels, iou_threshold, score_threshold, pre_top_k):
    """Greedy NMS, one box at a time in score order, in float64: the kept indices of one image."""
    order = [int(i) for i in torch.argsort(scores, descending=True, stable=True) if scores[i] > score_threshold]
    order = order[:pre_top_k]
    kept = []
    for i in order:
        if all(
            labels[j] != labels[i] or box_iou(boxes[j, None].double(), boxes[i, None].double()).item() <= iou_threshold
            for j in kept
        ):
            kept.append(i)
    return kept


def random_detections(b, n, classes, seed, spread=100.0):
    """Clustered boxes (many overlaps, chains of suppression) with distinct scores."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.rand(b, n // 4 + 1, 2, generator=g) * spread
    pick = torch.randint(0, centers.shape[1], (b, n), generator=g)
    xy = centers.gather(1, pick[..., None].expand(b, n, 2)) + torch.randn(b, n, 2, generator=g) * 4
    wh = torch.rand(b, n, 2, generator=g) * 20 + 4
    boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1)
    scores = torch.rand(b, n, generator=g)
    labels = torch.randint(0, classes, (b, n), generator=g)
    return boxes, scores, labels


@pytest.mark.parametrize(("n", "classes", "seed"), [(37, 1, 0), (200, 3, 1), (311, 5, 2)])
def test_matches_greedy_nms_on_clustered_boxes(n, classes, seed):
    boxes, scores, labels = random_detections(3, n, classes, seed)
    settings = dict(iou_threshold=0.45, score_threshold=0.1, pre_top_k=150)
    out = nms(boxes, scores, labels, **settings, max_kept=40, max_iters=64)
    assert out.boxes.shape == (3, 40, 4) and out.scores.shape == out.labels.shape == (3, 40)
    assert out.converged.all()
    for i in range(3):
        kept = reference_nms(boxes[i], scores[i], labels[i], **settings)[:40]
        k = int(out.num_kept[i])
        assert k == len(kept)
        torch.testing.assert_close(out.boxes[i, :k], boxes[i, kept])
        torch.testing.assert_close(out.scores[i, :k], scores[i, kept])
        assert torch.equal(out.labels[i, :k], labels[i, kept])
        assert (out.labels[i, k:] == -1).all() and (out.scores[i, k:] == 0).all() and (out.boxes[i, k:] == 0).all()


def test_too_few_iterations_is_reported_not_hidden():
    # A chain: each box overlaps the next, so greedy keeps every other box; settling it takes one iteration per link.
    x = torch.arange(12, dtype=torch.float32) * 6
    boxes = torch.stack([x, torch.zeros(12), x + 10, torch.full((12,), 10.0)], -1)[None]
    scores = torch.linspace(1, 0.5, 12)[None]
    short = nms(boxes, scores, iou_threshold=0.2, score_threshold=0, max_iters=2)
    full = nms(boxes, scores, iou_threshold=0.2, score_threshold=0, max_iters=16)
    kept = reference_nms(boxes[0], scores[0], torch.zeros(12), 0.2, 0, 1000)
    assert not short.converged.item() and full.converged.item()
    assert int(full.num_kept) == len(kept) == 6


def test_labels_never_suppress_each_other():
    boxes = torch.tensor([[[0.0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]]])
    scores = torch.tensor([[0.9, 0.8, 0.7]])
    out = nms(boxes, scores, torch.tensor([[0, 1, 0]]), score_threshold=0)
    assert int(out.num_kept) == 2 and out.labels[0, :2].tolist() == [0, 1]


def test_one_graph_with_fullgraph_and_the_same_shapes_for_any_scores():
    module = BatchedNMS(iou_threshold=0.5, score_threshold=0.2, pre_top_k=64, max_kept=16, max_iters=8)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    for seed in range(3):  # different numbers of survivors: no recompile, no data-dependent shape
        boxes, scores, labels = random_detections(2, 90, 3, seed)
        out, expected = compiled(boxes, scores, labels), module(boxes, scores, labels)
        for a, b in zip(out, expected, strict=True):
            assert torch.equal(a, b)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1  # one graph for all three


def test_exports_and_the_exported_program_runs_other_inputs():
    module = BatchedNMS(pre_top_k=32, max_kept=8, max_iters=8)
    boxes, scores, labels = random_detections(2, 50, 2, 0)
    exported = torch.export.export(module, (boxes, scores, labels))
    other = random_detections(2, 50, 2, 7)
    for a, b in zip(exported.module()(*other), module(*other), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"boxes": torch.zeros(2, 5)}, "boxes must be"),
        ({"scores": torch.zeros(2, 4)}, "scores must be"),
        ({"labels": torch.zeros(3, 5, dtype=torch.int64)}, "labels must be"),
        ({"iou_threshold": 1.5}, "iou_threshold"),
        ({"max_kept": 0}, "max_kept"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, message):
    args = {"boxes": torch.zeros(2, 5, 4), "scores": torch.zeros(2, 5), "labels": None, **kwargs}
    with pytest.raises(UsageError, match=message):
        nms(args.pop("boxes"), args.pop("scores"), args.pop("labels"), **args)


@requires_cuda
def test_under_cuda_graphs_matches_eager():
    module = BatchedNMS(pre_top_k=256, max_kept=50).cuda()
    boxes, scores, labels = (t.cuda() for t in random_detections(4, 500, 4, 3))
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        out = [t.clone() for t in compiled(boxes, scores, labels)]
    for a, b in zip(out, module(boxes, scores, labels), strict=True):
        torch.testing.assert_close(a, b)


def is_greedy_for_some_order(boxes, scores, labels, out, i, iou_threshold, candidates):
    """With tied scores greedy NMS depends on the order of the ties: the kept set must overlap nowhere within a
    label, and every candidate left out must be overlapped by a kept box of its label scoring at least as high."""
    k = int(out.num_kept[i])
    kept_boxes, kept_scores, kept_labels = out.boxes[i, :k], out.scores[i, :k], out.labels[i, :k]
    iou = box_iou(kept_boxes.double(), kept_boxes.double())
    same = kept_labels[:, None] == kept_labels[None, :]
    assert not ((iou > iou_threshold) & same & ~torch.eye(k, dtype=torch.bool)).any()
    kept_rows = {tuple(b.tolist()) for b in kept_boxes}
    for c in candidates:
        if tuple(boxes[c].tolist()) in kept_rows:
            continue
        over = box_iou(boxes[c, None].double(), kept_boxes.double())[0] > iou_threshold
        assert (over & (kept_labels == labels[c]) & (kept_scores >= scores[c])).any(), f"candidate {c} left out"


def test_random_cases_with_empty_images_and_ties():
    g = torch.Generator().manual_seed(11)
    for case in range(120):
        n = int(torch.randint(0, 160, (1,), generator=g))
        boxes, scores, labels = random_detections(1, max(n, 1), 3, 1000 + case)
        boxes, scores, labels = boxes[:, :n], scores[:, :n], labels[:, :n]
        ties = case % 2 == 1
        if ties:
            scores = (scores * 5).round() / 5  # five score levels: many ties
        if case % 10 == 0:
            scores = scores * 0.05  # an empty image: nothing above the threshold
        settings = dict(iou_threshold=0.5, score_threshold=0.1, pre_top_k=10_000)
        out = nms(boxes, scores, labels, **settings, max_kept=300, max_iters=64)
        assert out.converged.all()
        if not ties:
            kept = reference_nms(boxes[0], scores[0], labels[0], **settings)
            assert int(out.num_kept[0]) == len(kept)
            assert torch.equal(out.boxes[0, : len(kept)], boxes[0, kept])
        else:
            candidates = [c for c in range(n) if scores[0, c] > settings["score_threshold"]]
            is_greedy_for_some_order(boxes[0], scores[0], labels[0], out, 0, settings["iou_threshold"], candidates)


@requires_cuda
def test_equals_torchvision_batched_nms_on_random_cases():
    tv = pytest.importorskip("torchvision")
    for case in range(1000):
        g = torch.Generator().manual_seed(case)
        n = int(torch.randint(0, 1000, (1,), generator=g))
        boxes, scores, labels = random_detections(1, max(n, 1), 4, case, spread=400.0)
        boxes, scores, labels = (t[:, :n].cuda() for t in (boxes, scores, labels))
        if case % 50 == 0:
            scores = scores * 0.05  # empty images
        out = nms(boxes, scores, labels, iou_threshold=0.5, score_threshold=0.1, pre_top_k=1000, max_kept=1000)
        keep_mask = scores[0] > 0.1
        idx = keep_mask.nonzero()[:, 0]
        ref = idx[tv.ops.batched_nms(boxes[0, idx], scores[0, idx], labels[0, idx], 0.5)]
        assert out.converged.all()
        k = int(out.num_kept[0])
        assert k == len(ref) and torch.equal(out.boxes[0, :k], boxes[0, ref]), case
