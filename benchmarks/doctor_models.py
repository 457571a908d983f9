"""`fullgraph.doctor` on third-party models on the GPU, each checked against `torch._dynamo.explain`.

timm ViT-B/16 and ResNet-50, a BERT-base encoder called with keyword inputs, a GPT-2 greedy decoding loop,
torchvision's Faster and Mask R-CNN on a list of images, and the chapter's exercise 2.5. All random weights, built
offline (timm `pretrained=False`, transformers from configs, torchvision `weights=None, weights_backbone=None`).
Per model: the doctor's break count against explain's, recompiles, the recommendation and its speed-up, where the
time goes (the largest kernel class, its share, any flags), wall seconds. A model that fails prints its error and
the rest go on. Every model has a time budget, scaled so the whole run fits DEADLINE_S.

Run: PYTHONPATH=src python benchmarks/doctor_models.py [MODEL ...]
Writes doctor_models.json (every report, keyed by model) and doctor_models.csv under $OUT when it is set.
"""

from __future__ import annotations

import copy
import csv
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the decoding loop and exercise 2.5 live with the doctor's CPU tests

from tests.diagnose import real_models  # noqa: E402
from tests.diagnose.real_models import GreedyDecoder  # noqa: E402
from tests.diagnose.targets import exercise_2_5  # noqa: E402

import fullgraph  # noqa: E402

# The whole run, explain and model building included, aims to end by then (8 min with overruns).
DEADLINE_S = float(os.environ.get("DOCTOR_MODELS_DEADLINE", 400))
SCALE = float(os.environ.get("DOCTOR_MODELS_SCALE", 1))  # multiplies each model's budget (a rerun of a few)
BF16, FP32 = torch.bfloat16, torch.float32
GPU_MODES = ("eager", "default", "reduce-overhead")


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], tuple]  # -> (fn, args, kwargs) on the GPU, float32
    modes: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    budget: float  # seconds, before scaling to the deadline


def timm_model(name: str, batch: int):
    def build():
        import timm

        model = timm.create_model(name, pretrained=False).eval().cuda()
        return model, (torch.randn(batch, 3, 224, 224, device="cuda"),), {}

    return build


def bert_base():
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(num_labels=3)).eval().cuda()  # BERT-base's sizes
    input_ids = torch.randint(0, model.config.vocab_size, (32, 128), device="cuda")
    attention_mask = torch.ones(32, 128, dtype=torch.int64, device="cuda")
    attention_mask[16:, 96:] = 0  # half the batch padded
    return model, (), {"input_ids": input_ids, "attention_mask": attention_mask}


def gpt2_greedy():
    from transformers import GPT2Config, GPT2LMHeadModel

    lm = GPT2LMHeadModel(GPT2Config()).eval().cuda()  # GPT-2 small's sizes
    model = GreedyDecoder(lm, steps=8, stop_token_id=-1)  # every step runs and tests its stop condition
    return model, (torch.randint(0, lm.config.vocab_size, (4, 32), device="cuda"),), {}


def rcnn(name: str):
    def build():
        from torchvision.models import detection

        model = getattr(detection, name)(weights=None, weights_backbone=None).eval().cuda()
        images = [torch.rand(3, h, w, device="cuda") for h, w in ((480, 640), (512, 384), (600, 800))]
        return model, (images,), {}

    return build


def exercise():
    x, threshold = exercise_2_5.inputs(batch=48)  # the threshold from the CPU weights, before they move
    exercise_2_5.model.cuda()
    return exercise_2_5.process, (x.cuda(), threshold), {}


def test_model(builder):
    """One of the doctor's CPU test models (tests/diagnose/real_models.py), on the GPU: the acceptance runs the
    detection-style model and the tiny BERT with keyword inputs on both machines."""

    def build():
        model, args, kwargs = builder()
        to = lambda v: v.cuda() if isinstance(v, torch.Tensor) else v  # noqa: E731
        args = tuple([to(a) for a in v] if isinstance(v, list) else to(v) for v in args)
        return model.cuda(), args, {k: to(v) for k, v in kwargs.items()}

    return build


CASES = [
    Case("vit_base_patch16_224", timm_model("vit_base_patch16_224", 256), GPU_MODES, (BF16,), 75),
    Case("resnet50", timm_model("resnet50", 128), GPU_MODES, (BF16,), 50),
    Case("bert_base", bert_base, GPU_MODES, (FP32, BF16), 60),
    Case("gpt2_greedy", gpt2_greedy, ("eager", "default"), (BF16,), 50),
    Case("fasterrcnn_resnet50_fpn", rcnn("fasterrcnn_resnet50_fpn"), ("eager", "default"), (FP32,), 70),
    Case("maskrcnn_resnet50_fpn", rcnn("maskrcnn_resnet50_fpn"), ("eager", "default"), (FP32,), 70),
    Case("exercise_2_5", exercise, GPU_MODES, (FP32,), 25),
    Case("test_detector", test_model(real_models.detector), ("eager", "default"), (FP32,), 20),
    Case("test_bert_tiny", test_model(real_models.bert), ("eager", "default"), (FP32,), 20),
]


def explain_count(fn, args, kwargs) -> int:
    with torch.no_grad():
        return torch._dynamo.explain(fn)(*args, **kwargs).graph_break_count


def headline(report) -> str:
    """Where the time goes in the last profiled row (the recommended one): its largest class, share, flags."""
    if not report.breakdowns:
        return ""
    b = report.breakdowns[-1]
    top = max(b.classes, key=lambda c: c.ms, default=None)
    text = f"{b.label}: {top.name} {top.share:.0%} of {b.kernel_ms:.2f} ms" if top else b.label
    if b.idle_share is not None and b.idle_share > 0.2:
        text += f", GPU idle {b.idle_share:.0%}"
    return text + "".join(f"; {f.kind} {f.ms:.2f} ms" for f in b.flags)


def run_case(case: Case, budget: float) -> dict:
    t0 = time.monotonic()
    row = {"model": case.name, "budget_s": round(budget)}
    fn, args, kwargs = case.build()
    # explain on a copy taken before any call: set-once state (torchvision's poolers set their scales on the first
    # call, through a graph break) would otherwise be set up for the doctor, which then counts 2 breaks fewer.
    row["explain_breaks"] = explain_count(copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn, args, kwargs)
    torch._dynamo.reset()
    report = fullgraph.doctor(
        fn, args, kwargs=kwargs, target=case.name, modes=case.modes, dtypes=case.dtypes, budget=budget, reps=20,
        progress=lambda msg: print(f"  [{time.monotonic() - t0:6.1f}s] {case.name}: {msg}", file=sys.stderr),
    )  # fmt: skip
    rec = report.recommendation
    row.update(
        doctor_breaks=report.graph_break_count,
        located=sum(1 for b in report.graph_breaks if b.line > 0),
        recompiles=sum(r.count for r in report.recompiles),
        recommendation=rec.config if rec else "",
        speedup=round(rec.speedup, 3) if rec and rec.speedup else None,
        baseline=rec.baseline if rec else "",
        breakdown=headline(report),
        configs_failed=sum(1 for c in report.configs if c.error),
        wall_s=round(time.monotonic() - t0, 1),
        report=report.to_dict(),
    )
    return row


def markdown(rows: list[dict]) -> str:
    head = "| model | breaks (doctor / explain) | recompiles | recommendation | speed-up | where the time goes | s |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:100]} | | | | | {r['wall_s']} |")
            continue
        match = "" if r["doctor_breaks"] == r["explain_breaks"] else " **differ**"
        speedup = f"{r['speedup']:.2f}x {r['baseline']}" if r["speedup"] else "-"
        lines.append(
            f"| {r['model']} | {r['doctor_breaks']} / {r['explain_breaks']}{match}, {r['located']} located "
            f"| {r['recompiles']} "
            f"| {r['recommendation'] or '-'} | {speedup} | {r['breakdown'] or '-'} | {r['wall_s']} |"
        )
    return "\n".join(lines)


def write(rows: list[dict], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "doctor_models.json"), "w") as f:
        json.dump({r["model"]: r.get("report") or {"error": r.get("error")} for r in rows}, f, indent=1)
    fields = ["model", "explain_breaks", "doctor_breaks", "located", "recompiles", "recommendation", "speedup",
              "baseline", "breakdown", "configs_failed", "budget_s", "wall_s", "error"]  # fmt: skip
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    meta = {"torch": torch.__version__, "gpu": gpu, "date": time.strftime("%Y-%m-%d")}
    with open(os.path.join(out, "doctor_models.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields + list(meta), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, **meta})


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("doctor_models.py needs a CUDA GPU", file=sys.stderr)
        return 2
    cases = [c for c in CASES if not argv or c.name in argv]
    start, rows = time.monotonic(), []
    for i, case in enumerate(cases):
        left = DEADLINE_S - (time.monotonic() - start)
        share = case.budget / sum(c.budget for c in cases[i:])  # what is left, shared by what is still to run
        budget = max(15.0, min(case.budget * SCALE, left * share))
        print(f"=== {case.name} (budget {budget:.0f} s)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            rows.append(run_case(case, budget))
        except Exception as e:  # one model failing is a result; the others still run
            print("".join(traceback.format_exception(e)[-6:]), file=sys.stderr)
            rows.append({"model": case.name, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
        rows[-1].setdefault("wall_s", round(time.monotonic() - t0, 1))
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        write(rows, os.environ["OUT"])
    print(markdown(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
