"""Detection outputs compared by matched detections, not a flat error (issue 34, item 6)."""

import pytest
import torch

from fullgraph.diagnose.configs import rel_err
from fullgraph.diagnose.detections import IOU_MIN, MATCHED_MIN, box_iou, detection_lists, matched_fraction


def _image(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    xy = torch.rand(n, 2, generator=gen) * 200
    wh = 20 + torch.rand(n, 2, generator=gen) * 80
    scores = torch.rand(n, generator=gen).sort(descending=True).values
    return {"boxes": torch.cat([xy, xy + wh], 1), "scores": scores, "labels": torch.randint(1, 5, (n,), generator=gen)}


@pytest.fixture
def ref():
    gen = torch.Generator().manual_seed(34)
    return [_image(37, gen), _image(23, gen)]


def _take(d, order):
    return {k: v[order] for k, v in d.items()}


def test_a_reorder_of_near_tied_scores_passes_where_the_flat_error_fails(ref):
    out = [dict(d) for d in ref]
    scores = out[0]["scores"].clone()
    scores[3] = scores[4] = (scores[3] + scores[4]) / 2  # near-tied
    out[0] = _take({**out[0], "scores": scores}, torch.tensor([0, 1, 2, 4, 3, *range(5, 37)]))  # swapped order
    out[0]["scores"] = out[0]["scores"] + 1e-5 * torch.randn(37)
    ref0 = {**ref[0], "scores": scores}
    refs = [ref0, ref[1]]
    assert rel_err(out, refs) > 1e-2  # the flat error cannot tell a reorder from an error
    assert matched_fraction(out, refs, IOU_MIN[torch.float32], 1e-3) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_moved_box_fails_and_small_noise_passes(ref, dtype):
    iou, need = IOU_MIN[dtype], MATCHED_MIN[dtype]
    noisy = [{**d, "boxes": d["boxes"] + 0.2 * torch.randn_like(d["boxes"])} for d in ref]
    assert matched_fraction(noisy, ref, iou, 4e-2) >= need
    moved = [dict(d) for d in ref]
    boxes = moved[1]["boxes"].clone()
    boxes[:2] += 60.0  # two boxes of 60 moved far off: 2 of 60 unmatched, 96.7%
    moved[1]["boxes"] = boxes
    got = matched_fraction(moved, ref, iou, 4e-2)
    assert got == pytest.approx(58 / 60)
    assert (got >= need) == (dtype != torch.float32)  # under fp32's 98%; within low precision's 95%


def test_a_wrong_label_a_far_score_or_a_missing_detection_is_not_matched(ref):
    labels = [{**ref[0], "labels": ref[0]["labels"] % 4 + 1}, ref[1]]
    assert matched_fraction(labels, ref, 0.9, 1e-3) == pytest.approx(23 / 60)
    scores = [{**ref[0], "scores": ref[0]["scores"] + 0.1}, ref[1]]
    assert matched_fraction(scores, ref, 0.9, 1e-3) == pytest.approx(23 / 60)
    fewer = [_take(ref[0], torch.arange(30)), ref[1]]
    assert matched_fraction(fewer, ref, 0.9, 1e-3) == pytest.approx(53 / 60)
    assert matched_fraction(ref[:1], ref, 0.9, 1e-3) == 0.0  # a different number of images
    assert matched_fraction(torch.zeros(3), ref, 0.9, 1e-3) == 0.0


def test_only_lists_of_detection_dicts_are_detections_and_iou_is_right():
    assert detection_lists(torch.zeros(3)) is None and detection_lists([]) is None
    assert detection_lists([{"boxes": torch.zeros(0, 4)}]) is None  # no scores or labels
    assert matched_fraction(torch.zeros(3), torch.zeros(3), 0.9, 1e-3) is None  # plain tensors: the flat error
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    assert box_iou(a, b).tolist() == [[pytest.approx(50 / 150), 0.0]]
    empty = [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}]
    assert matched_fraction(empty, empty, 0.9, 1e-3) == 1.0


class _Detector(torch.nn.Module):
    """Returns fixed detections, in the order given: a stand-in for a detector whose compiled row reorders ties."""

    def __init__(self, dets):
        super().__init__()
        self.dets = dets

    def forward(self, x):
        return [{k: v + 0 * x.sum() if v.is_floating_point() else v for k, v in d.items()} for d in self.dets]


def test_a_doctor_row_with_detection_outputs_is_judged_by_matched_detections(ref):
    from fullgraph.diagnose import configs as cfg
    from fullgraph.diagnose.html import render_html
    from fullgraph.diagnose.inputs import Example
    from fullgraph.diagnose.report import Report
    from fullgraph.diagnose.summary import format_summary

    reordered = [_take(d, torch.randperm(len(d["boxes"]), generator=torch.Generator().manual_seed(1))) for d in ref]
    example = Example.of((torch.randn(2, 3),), None)
    rows = []
    moved_boxes = [{**d, "boxes": d["boxes"] + 50} for d in ref]
    for dets in (reordered, moved_boxes):
        c = cfg.Candidate("eager", torch.float32)
        cfg.prepare(c, _Detector(dets), example, cfg.Reference(ref), torch.device("cpu"))
        c.samples, c.round_medians = [1.0, 1.1], [1.0, 1.1]
        rows.append(c.result(noisy=False))
    ok, moved = rows
    assert ok.rel_err > 1e-2 and ok.matched == 1.0 and ok.matched_min == MATCHED_MIN[torch.float32] and ok.ok
    assert moved.matched == 0.0 and not moved.ok
    text = format_summary(Report("t", "cpu", [], {}, configs=[ok]), width=200)
    assert "100.0% matched" in text
    assert "98% matched" in render_html(Report("t", "cpu", [], {}, configs=[ok]))
