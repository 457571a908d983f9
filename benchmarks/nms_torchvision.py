"""Graph breaks of torchvision's Faster R-CNN under torch.compile, with and without fullgraph's batched_nms.

`fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None)` in eval mode, called as users call it (a list of two
images of different sizes), is run through `torch._dynamo.explain` four ways:
  plain              torchvision as installed
  plain + capture    with `capture_dynamic_output_shape_ops=True` (a scoped `torch._dynamo.config.patch`)
  replaced           inside `fullgraph.models.nms.replace_torchvision_nms()`
  replaced + capture both
and reports graphs, graph breaks and the distinct break reasons. "plain + capture" is the fair baseline for
"replaced + capture": the flag also keeps torchvision's own NMS op (a dynamic-size fake) in the graph.

Checks, from one seed: every batched_nms call of the plain model (the RPN's, thousands of boxes per image, and the
box head's) is replayed through ours on the same inputs (equal indices, or the tied scores that explain a
difference); the detections (boxes, labels, scores) and RPN proposals of the model inside the replacement equal the
plain model's, eagerly and compiled with --backend (aot_eager by default: the captured graphs with eager's
numerics, so any difference is the graphs'; inductor's own numerics may move boxes near a threshold).

Random weights rarely score a class above torchvision's default box_score_thresh (0.05); the script says when no
detection passed (the RPN's proposals are then what is compared) and --score-thresh lowers it.

Run: PYTHONPATH=src python3 benchmarks/nms_torchvision.py [--device cuda] [--backend aot_eager] [--csv F]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from unittest import mock

import torch

from fullgraph.bench.results import append_csv, make_rows
from fullgraph.bench.suites.nms import compare_kept
from fullgraph.bench.table import format_table
from fullgraph.models.nms import batched_nms, replace_torchvision_nms

VARIANTS = (("plain", False, False), ("plain + capture", False, True), ("replaced", True, False),
            ("replaced + capture", True, True))  # fmt: skip


def scope(replaced: bool, capture: bool):
    """The context a variant runs in: the replacement or not, the flag set or not (both undone on exit)."""
    stack = contextlib.ExitStack()
    if replaced:
        stack.enter_context(replace_torchvision_nms())
    stack.enter_context(torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture))
    return stack


def run(model, images):
    """Detections and the RPN's proposals (the boxes its batched_nms kept, per image)."""
    proposals = []
    hook = model.rpn.register_forward_hook(lambda m, i, out: proposals.extend(p.detach().clone() for p in out[0]))
    try:
        with torch.no_grad():
            return model(images), proposals
    finally:
        hook.remove()


def compare(expected, actual) -> str:
    """ "equal", or where detections and proposals first differ."""
    (dets_e, props_e), (dets_a, props_a) = expected, actual
    pairs = [(f"image {i} {k}", d_e[k], d_a[k]) for i, (d_e, d_a) in enumerate(zip(dets_e, dets_a, strict=True))
             for k in ("boxes", "labels", "scores")]  # fmt: skip
    pairs += [(f"image {i} proposals", p_e, p_a) for i, (p_e, p_a) in enumerate(zip(props_e, props_a, strict=True))]
    for name, e, a in pairs:
        if e.shape != a.shape:
            return f"{name}: shape {tuple(a.shape)} vs {tuple(e.shape)}"
        try:
            torch.testing.assert_close(a, e)
        except AssertionError:
            return f"{name}: max |diff| {(a.double() - e.double()).abs().max().item():.3g}"
    return "equal"


def replay_nms_calls(model, images) -> str:
    """Run the plain model recording each batched_nms call, then run ours on the same inputs."""
    import torchvision.ops.boxes as box_ops

    original, calls = box_ops.batched_nms, []

    def recording(boxes, scores, idxs, iou_threshold):
        keep = original(boxes, scores, idxs, iou_threshold)
        calls.append((boxes.clone(), scores.clone(), idxs.clone(), iou_threshold, keep.clone()))
        return keep

    with mock.patch.object(box_ops, "batched_nms", recording):
        run(model, images)
    lines = []
    for boxes, scores, idxs, t, keep in calls:
        ours = batched_nms(boxes, scores, idxs, t)
        ties = scores.numel() - scores.unique().numel()
        verdict = compare_kept(ours, keep, scores)
        lines.append(f"  N={boxes.shape[0]:>6}  iou>{t}  {ties} tied scores  kept {len(keep):>5}  {verdict}")
    return "\n".join(lines)


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:150]}"


def explain(model, images, replaced: bool, capture: bool):
    """(graphs, breaks, reasons, seconds), or (None, None, {error: 1}, seconds) when Dynamo gives up on the model
    (with the flag on, a guard on a data-dependent size, such as torchvision's `boxes.numel() == 0`, is an error)."""
    torch._dynamo.reset()
    start = time.perf_counter()
    try:
        with scope(replaced, capture), torch.no_grad():
            out = torch._dynamo.explain(model)(images)
    except Exception as e:  # a tracing error is a result to report, not a reason to lose the table
        return None, None, collections.Counter({f"error: {first_line(e)}": 1}), time.perf_counter() - start
    reasons = collections.Counter(str(r.reason).strip().splitlines()[0][:110] for r in out.break_reasons)
    return out.graph_count, out.graph_break_count, reasons, time.perf_counter() - start


def compiled_check(model, images, replaced, capture, backend, expected) -> str:
    torch._dynamo.reset()
    try:
        with scope(replaced, capture):
            compiled = torch.compile(model, backend=backend)
            return compare(expected, run(compiled, images))
    except Exception as e:  # as in explain
        return f"error: {first_line(e)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu")
    parser.add_argument("--backend", default="aot_eager", help="torch.compile backend of the compiled check")
    parser.add_argument("--score-thresh", type=float, default=None, help="box_score_thresh (torchvision: 0.05)")
    parser.add_argument("--csv", default=None, help="append result rows to this CSV")
    args = parser.parse_args()
    try:
        import torchvision
    except ImportError:
        print("nms_torchvision.py needs torchvision: pip install torchvision", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("nms_torchvision.py: no CUDA GPU here (--device cpu runs it on the CPU)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    extra = {} if args.score_thresh is None else {"box_score_thresh": args.score_thresh}
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, **extra)
    model = model.eval().to(args.device)
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, h, w, generator=g).to(args.device) for h, w in ((480, 640), (512, 512))]

    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, device {args.device}")
    print("batched_nms calls of the plain model, replayed through fullgraph's:")
    print(replay_nms_calls(model, images))
    expected = run(model, images)
    counts = [len(d["boxes"]) for d in expected[0]]
    print(f"detections per image {counts}, proposals per image {[len(p) for p in expected[1]]}")
    if not any(counts):
        print("no detection passed box_score_thresh: the output checks compare the RPN's proposals (--score-thresh)")
    with replace_torchvision_nms():
        eager_replaced = compare(expected, run(model, images))

    rows, table, reasons_by_variant = [], [], {}
    for name, replaced, capture in VARIANTS:
        graphs, breaks, reasons, seconds = explain(model, images, replaced, capture)
        reasons_by_variant[name] = reasons
        eager = eager_replaced if replaced else "-"
        compiled = compiled_check(model, images, replaced, capture, args.backend, expected) if replaced else "-"
        table.append([name, graphs, breaks, eager, compiled, round(seconds, 1)])
        metrics = {"explain_s": (seconds, "s")}
        if graphs is not None:
            metrics |= {"graphs": (graphs, ""), "graph_breaks": (breaks, "")}
        if replaced:
            metrics["outputs_equal_eager"] = (eager == "equal", "")
            metrics["outputs_equal_compiled"] = (compiled == "equal", "")
        params = {"images": "3x480x640,3x512x512", "backend": args.backend, "score_thresh": args.score_thresh}
        rows += make_rows("nms_torchvision", "fasterrcnn_resnet50_fpn", name, metrics, params)
    headers = ["variant", "graphs", "graph breaks", "eager = plain", f"compiled ({args.backend}) = plain", "explain s"]
    print(format_table(headers, table))
    for name, reasons in reasons_by_variant.items():
        print(f"{name}: break reasons")
        for reason, n in reasons.most_common():
            print(f"  {n:>3} x {reason}")
    if args.csv:
        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
