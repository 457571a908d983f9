"""fullgraph.models.nms.batched_nms against a float64 plain-Python greedy NMS, compiled, and torchvision's own
batched_nms where torchvision is installed (replace_torchvision_nms and a detector under it; on CUDA, random cases)."""

import sys

import pytest
import torch

from fullgraph.errors import UsageError
from fullgraph.models.nms import batched_nms, replace_torchvision_nms
from tests.skips import requires_cuda


def _iou(a, b):
    """IoU of two (x1, y1, x2, y2) lists of Python floats (float64); empty boxes: 0."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def reference_batched_nms(boxes, scores, idxs, iou_threshold):
    """Greedy NMS one box at a time, best score first (ties: lower index first), in float64 Python: kept indices."""
    b, s, c = boxes.double().tolist(), scores.double().tolist(), idxs.tolist()
    kept = []
    for i in sorted(range(len(s)), key=lambda i: (-s[i], i)):
        if all(c[j] != c[i] or _iou(b[i], b[j]) <= iou_threshold for j in kept):
            kept.append(i)
    return kept


def random_case(n, classes, g, *, spread=300.0, origin=0.0, integer=True, tie_levels=0, dtype=torch.float32):
    """Clustered boxes (overlaps, chains of suppression). Integer coordinates make float32 IoU tests exact at the
    dyadic thresholds used below (areas below 2^24, and a quotient never within rounding of k/8 unless equal)."""
    centers = torch.rand(n // 4 + 1, 2, generator=g, dtype=torch.float64) * spread
    pick = torch.randint(0, centers.shape[0], (n,), generator=g)
    xy = centers[pick] + torch.randn(n, 2, generator=g, dtype=torch.float64) * 6
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 30 + 1
    boxes = torch.cat([xy, xy + wh], 1)
    if integer:
        boxes = boxes.round()
    boxes = (boxes + origin).to(dtype)
    scores = torch.rand(n, generator=g)
    if tie_levels:
        scores = (scores * tie_levels).floor() / tie_levels
    return boxes, scores, torch.randint(0, classes, (n,), generator=g)


def _check_case(boxes, scores, idxs, t):
    out = batched_nms(boxes, scores, idxs, t)
    assert out.dtype == torch.int64 and out.ndim == 1
    assert out.tolist() == reference_batched_nms(boxes, scores, idxs, t)


@pytest.mark.parametrize(
    ("classes", "options"),
    [
        (1, {}),  # one class
        (3, {"tie_levels": 4}),  # many tied scores: ties go in index order
        (80, {"spread": 60.0}),  # many classes, crowded
        (5, {"origin": 2.0**20}),  # far from the origin: labels are compared, coordinates never shifted
        (4, {"integer": False, "dtype": torch.float64}),  # continuous coordinates, computed in float64
        (2, {"dtype": torch.float16, "spread": 200.0}),  # half precision, upcast for the IoU
    ],
)
def test_equals_greedy_nms_on_random_cases(classes, options, seed):
    g = torch.Generator().manual_seed(seed)
    for case in range(25):
        n = (0, 1, 2)[case] if case < 3 else int(torch.randint(3, 260, (1,), generator=g))
        t = (0.25, 0.5, 0.625, 0.75)[case % 4]
        _check_case(*random_case(n, classes, g, **options), t)


def test_equals_greedy_nms_at_any_threshold_in_float64(seed):
    g = torch.Generator().manual_seed(seed)
    for t in (0.0, 0.3, 0.45, 0.7, 1.0):
        _check_case(*random_case(200, 3, g, integer=False, dtype=torch.float64), t)


def test_iou_equal_to_the_threshold_does_not_suppress():
    boxes = torch.tensor([[0.0, 0, 20, 10], [10, 0, 30, 10], [0, 0, 20, 10]])  # IoU(0, 1) = 1/3 exactly
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert batched_nms(boxes, scores, torch.zeros(3, dtype=torch.int64), 0.5).tolist() == [0, 1]
    assert batched_nms(boxes, scores, torch.tensor([0, 0, 1]), 0.9).tolist() == [0, 1, 2]


def test_a_long_chain_is_settled_exactly():
    # Each box overlaps its neighbours only: greedy keeps every other box; the fixed point needs one iteration per
    # link, far more than `nms`'s default max_iters, and the drop-in iterates until nothing changes.
    n = 80
    x = torch.arange(n, dtype=torch.float32) * 6
    boxes = torch.stack([x, torch.zeros(n), x + 10, torch.full((n,), 10.0)], -1)
    scores = torch.linspace(1, 0.1, n)
    kept = batched_nms(boxes, scores, torch.zeros(n, dtype=torch.int64), 0.2)
    assert kept.tolist() == list(range(0, n, 2)) == reference_batched_nms(boxes, scores, torch.zeros(n), 0.2)


def test_large_inputs_use_blocks_and_stay_exact(seed):
    g = torch.Generator().manual_seed(seed)
    boxes, scores, idxs = random_case(2500, 4, g, spread=800.0)  # 6.25M pairs: two row blocks in eager
    _check_case(boxes, scores, idxs, 0.5)


def _compile_case(g, n, dtype=torch.float32):
    return random_case(n, 3, g, integer=dtype != torch.float64, dtype=dtype)


def test_compiles_with_fullgraph_when_dynamic_output_shapes_are_captured(seed):
    g = torch.Generator().manual_seed(seed)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(batched_nms, fullgraph=True, dynamic=True, backend="aot_eager")
        for n in (0, 1, 37, 211):
            boxes, scores, idxs = _compile_case(g, n)
            assert torch.equal(compiled(boxes, scores, idxs, 0.5), batched_nms(boxes, scores, idxs, 0.5))
        x = torch.arange(40, dtype=torch.float32) * 6  # a chain: the in-graph loop runs ~40 iterations
        chain = torch.stack([x, torch.zeros(40), x + 10, torch.full((40,), 10.0)], -1)
        scores, idxs = torch.linspace(1, 0.1, 40), torch.zeros(40, dtype=torch.int64)
        assert compiled(chain, scores, idxs, 0.2).tolist() == list(range(0, 40, 2))


@pytest.mark.slow
def test_inductor_matches_eager(seed):
    g = torch.Generator().manual_seed(seed)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(batched_nms, fullgraph=True, dynamic=True)
        for n in (5, 300):
            boxes, scores, idxs = _compile_case(g, n, torch.float64)
            assert torch.equal(compiled(boxes, scores, idxs, 0.5), batched_nms(boxes, scores, idxs, 0.5))


def test_without_the_flag_the_graph_breaks_once_at_the_end(seed):
    boxes, scores, idxs = _compile_case(torch.Generator().manual_seed(seed), 64)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False):
        explained = torch._dynamo.explain(batched_nms)(boxes, scores, idxs, 0.5)
    assert explained.graph_count == 1  # sort, IoU, the whole loop: one graph; nothing traced after the break
    assert len(explained.break_reasons) == 1 and "nonzero" in str(explained.break_reasons[0].reason)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.zeros(5, 3), torch.zeros(5), torch.zeros(5)), "boxes must be"),
        ((torch.zeros(5, 4), torch.zeros(4), torch.zeros(5)), "scores and idxs must be"),
        ((torch.zeros(5, 4), torch.zeros(5), torch.zeros(5, 1)), "scores and idxs must be"),
        ((torch.zeros(5, 4, dtype=torch.int64), torch.zeros(5), torch.zeros(5)), "floating point"),
    ],
)
def test_bad_input_is_one_clear_error(args, message):
    with pytest.raises(UsageError, match=message):
        batched_nms(*args, 0.5)
    with pytest.raises(UsageError, match="iou_threshold"):
        batched_nms(torch.zeros(5, 4), torch.zeros(5), torch.zeros(5), 1.5)


def test_replacing_without_torchvision_is_a_clear_error(monkeypatch):
    for name in ("torchvision", "torchvision.ops", "torchvision.ops.boxes"):
        monkeypatch.setitem(sys.modules, name, None)  # what an environment without torchvision looks like
    with pytest.raises(UsageError, match="needs torchvision"), replace_torchvision_nms():
        pass


def test_replace_torchvision_nms_patches_where_torchvision_looks_and_restores():
    tv = pytest.importorskip("torchvision")
    import torchvision.models.detection.roi_heads as roi_heads
    import torchvision.models.detection.rpn as rpn

    original = tv.ops.boxes.batched_nms
    with pytest.raises(RuntimeError, match="inside"), replace_torchvision_nms():
        assert tv.ops.boxes.batched_nms is batched_nms and tv.ops.batched_nms is batched_nms
        assert roi_heads.box_ops.batched_nms is batched_nms and rpn.box_ops.batched_nms is batched_nms
        raise RuntimeError("inside")  # restored on the way out of an error too
    assert tv.ops.boxes.batched_nms is original and tv.ops.batched_nms is original


def test_equals_torchvision_batched_nms_on_cpu(seed):
    tv = pytest.importorskip("torchvision")
    g = torch.Generator().manual_seed(seed)
    for case in range(40):
        n = int(torch.randint(0, 400, (1,), generator=g))
        boxes, scores, idxs = random_case(n, 1 + case % 5, g, integer=False, dtype=torch.float64)
        scores = torch.randperm(n, generator=g).double() / max(n, 1)  # distinct: torchvision's ties are unordered
        assert torch.equal(batched_nms(boxes, scores, idxs, 0.5), tv.ops.batched_nms(boxes, scores, idxs, 0.5))


def _run_detector(model, images, box_ops):
    """Detections, the RPN's proposals, and every batched_nms call as (boxes, scores, idxs, threshold, kept)."""
    proposals, calls, called = [], [], box_ops.batched_nms

    def recording(boxes, scores, idxs, iou_threshold):
        kept = called(boxes, scores, idxs, iou_threshold)
        calls.append((boxes, scores, idxs, iou_threshold, kept))
        return kept

    hook = model.rpn.register_forward_hook(lambda m, i, out: proposals.extend(out[0]))
    try:
        with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(box_ops, "batched_nms", recording)
            return model(images), proposals, calls
    finally:
        hook.remove()


@pytest.mark.slow
def test_a_torchvision_detector_gives_the_same_detections_under_the_replacement():
    tv = pytest.importorskip("torchvision")
    model = tv.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).eval()
    images = [torch.rand(3, 240, 320), torch.rand(3, 256, 256)]
    plain, plain_proposals, calls = _run_detector(model, images, tv.ops.boxes)
    assert calls  # the RPN's and the box head's, per image
    tie_order_only = False
    for boxes, scores, idxs, t, kept in calls:  # ours on the very inputs torchvision saw inside the model
        ours = batched_nms(boxes, scores, idxs, t)
        if not torch.equal(ours, kept):  # tied scores may come in another order; nothing else may differ
            assert torch.equal(scores[ours], scores[kept]), (boxes.shape, t)
            tie_order_only = True
    with replace_torchvision_nms():
        replaced, proposals, _ = _run_detector(model, images, tv.ops.boxes)
    if tie_order_only:
        pytest.skip("tied scores ordered differently by torchvision: later stages may legitimately differ")
    for a, b in zip(plain_proposals, proposals, strict=True):
        torch.testing.assert_close(a, b)  # proposals: what the RPN kept with batched_nms
    for a, b in zip(plain, replaced, strict=True):
        for key in ("boxes", "scores", "labels"):
            torch.testing.assert_close(a[key], b[key])


@requires_cuda
def test_equals_torchvision_batched_nms_on_cuda(seed):
    tv = pytest.importorskip("torchvision")
    g = torch.Generator().manual_seed(seed)
    for case in range(200):
        n = int(torch.randint(0, 5000, (1,), generator=g)) if case else 0
        # float64: torchvision shifts each class's boxes apart, which in float32 moves IoUs near the threshold
        boxes, scores, idxs = random_case(n, 1 + case % 8, g, spread=1000.0, integer=False, dtype=torch.float64)
        scores = torch.randperm(n, generator=g).double() / max(n, 1)  # distinct: torchvision's ties are unordered
        boxes, scores, idxs = boxes.cuda(), scores.cuda(), idxs.cuda()
        t = (0.3, 0.5, 0.7)[case % 3]
        assert torch.equal(batched_nms(boxes, scores, idxs, t), tv.ops.batched_nms(boxes, scores, idxs, t)), case


@requires_cuda
def test_cuda_equals_cpu_in_float32_and_compiles(seed):
    g = torch.Generator().manual_seed(seed)
    for n in (0, 1, 700, 4000):
        boxes, scores, idxs = random_case(n, 4, g, spread=1000.0)
        cpu = batched_nms(boxes, scores, idxs, 0.7)
        assert torch.equal(batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.7).cpu(), cpu)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(batched_nms, fullgraph=True, dynamic=True)
        for n in (3, 500, 3000):
            boxes, scores, idxs = (t.cuda() for t in random_case(n, 4, g, integer=False, dtype=torch.float64))
            assert torch.equal(compiled(boxes, scores, idxs, 0.7), batched_nms(boxes, scores, idxs, 0.7))
