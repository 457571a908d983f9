import json

import pytest
import torch

from fullgraph.bench.suites import nms as suite
from fullgraph.cli.main import main
from fullgraph.errors import UsageError
from fullgraph.models.nms import box_iou, nms
from tests.bench.suites import run_suite

CPU = torch.device("cpu")


@pytest.mark.slow
def test_suite_times_ours_eager_and_compiled_and_checks_exactness(tmp_path, capsys):
    rows, timed = run_suite(tmp_path, "nms", "--boxes", "150", "--batches", "4", "--iou", "0.45", "--top-k", "120",
                            "--capacity", "30")  # fmt: skip
    has_torchvision = suite.torchvision_reference()[0] is not None
    assert timed == {"ours, eager", "ours, compiled"} | ({"torchvision, eager"} if has_torchvision else set())
    by = {(r.variant, r.metric): r.value for r in rows}
    for variant in ("ours, eager", "ours, compiled"):
        assert by[(variant, "exact")] == 1.0 and by[(variant, "converged")] == 1.0
        assert by[(variant, "images_equal")] >= 3  # the tied image may differ; the distinct and empty ones may not
        assert 0 < by[(variant, "p20_ms")] <= by[(variant, "median_ms")] <= by[(variant, "p80_ms")]
    assert by[("ours, compiled", "graph_breaks")] == 0 and by[("ours, compiled", "graphs")] == 1
    assert ("ours, eager", "graph_breaks") not in by
    params = json.loads(rows[0].params)
    assert (params["iou_threshold"], params["top_k"], params["capacity"], params["boxes"]) == (0.45, 120, 30, 150)
    assert params["cases"] == "distinct,tied,empty,distinct"
    out = capsys.readouterr().out
    if not has_torchvision:
        assert "torchvision not installed: reference skipped" in out
    assert "IoU > 0.45, score > 0.05, top-k 120, capacity 30" in out


def test_inputs_have_a_tied_and_an_empty_image_and_repeat_for_a_seed():
    settings = suite.Settings()
    boxes, scores, labels, cases = suite.make_inputs(300, 4, settings, seed=5, device=CPU)
    assert boxes.shape == (4, 300, 4) and scores.shape == labels.shape == (4, 300) and labels.dtype == torch.int64
    assert cases == ("distinct", "tied", "empty", "distinct")
    assert (boxes[..., 2:] > boxes[..., :2]).all()
    assert [suite.has_ties(s, 0.05) for s in scores] == [False, True, False, False]
    assert (scores[2] <= 0.05).all() and (scores[0] > 0.05).any()
    again = suite.make_inputs(300, 4, settings, seed=5, device=CPU)
    assert all(torch.equal(a, b) for a, b in zip((boxes, scores, labels), again[:3], strict=True))


def test_greedy_reference_is_greedy_nms():
    boxes, scores, labels, _ = suite.make_inputs(400, 1, suite.Settings(), seed=11, device=CPU)
    boxes, scores, labels = boxes[0], scores[0], labels[0]
    kept = suite.greedy_nms(boxes, scores, labels, 0.5)
    assert 0 < len(kept) < 400 and (scores[kept].diff() < 0).all()  # suppresses some, best first
    iou = box_iou(boxes.double(), boxes.double())
    same = labels[:, None] == labels[None, :]
    k = kept.tolist()
    assert not ((iou[k][:, k] > 0.5) & same[k][:, k]).fill_diagonal_(False).any()  # no two kept boxes overlap
    for i in set(range(400)) - set(k):  # every other box has a better kept box of its class over it
        assert any(scores[j] > scores[i] and same[i, j] and iou[i, j] > 0.5 for j in k), i


def test_ours_matches_the_reference_and_a_wrong_answer_is_caught():
    settings = suite.Settings(iou_threshold=0.5, top_k=150, capacity=40)
    boxes, scores, labels, _ = suite.make_inputs(250, 4, settings, seed=3, device=CPU)
    out = nms(boxes, scores, labels, **settings.ours())
    kept = suite.kept_indices(out, boxes, scores, labels)
    for i in range(4):
        k = int(out.num_kept[i])
        assert torch.equal(boxes[i, kept[i]], out.boxes[i, :k])
        expected = suite.reference_keep(suite.greedy_nms, boxes[i], scores[i], labels[i], settings)
        if i != 1:  # image 1 has tied scores
            assert suite.compare_kept(kept[i], expected, scores[i]) == "equal"
    loose = suite.Settings(iou_threshold=0.3, top_k=150, capacity=40)  # another threshold: another answer
    wrong = suite.reference_keep(suite.greedy_nms, boxes[0], scores[0], labels[0], loose)
    assert suite.compare_kept(kept[0], wrong, scores[0]).startswith("DIFFERENT")


def test_compare_kept_names_what_differs():
    scores = torch.tensor([0.9, 0.5, 0.5, 0.3])
    a, b = torch.tensor([0, 1, 3]), torch.tensor([0, 2, 3])
    assert suite.compare_kept(a, a, scores) == "equal"
    assert suite.compare_kept(torch.tensor([0, 2, 1]), torch.tensor([0, 1, 2]), scores).startswith("equal but tied")
    assert suite.compare_kept(a, b, scores) == "other tied boxes kept"
    assert suite.compare_kept(a, torch.tensor([0, 1]), scores) == "DIFFERENT (3 vs 2 kept)"


def test_a_box_not_in_the_input_is_no_match():
    settings = suite.Settings(top_k=50, capacity=10)
    boxes, scores, labels, _ = suite.make_inputs(60, 1, settings, seed=0, device=CPU)
    out = nms(boxes, scores, labels, **settings.ours())
    out.boxes[0, 0, 0] += 1  # a kept box that was never proposed
    assert suite.kept_indices(out, boxes, scores, labels) == [None]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--iou", "1.5"], "--iou"),
        (["--score-threshold", "1"], "--score-threshold"),
        (["--top-k", "0"], "--top-k"),
        (["--capacity", "-3"], "--capacity"),
        (["--boxes", "many"], "--boxes"),
        (["--batches", "0"], "--batches"),
    ],
)
def test_bad_flags_are_one_error_naming_the_flag(tmp_path, capsys, flags, named):
    assert main(["bench", "nms", "--device", "cpu", *flags, "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert f"error: {named}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.csv").exists()


def test_settings_reject_bad_values_directly():
    with pytest.raises(UsageError, match="--iou"):
        suite.Settings(iou_threshold=-0.1)
