"""The models `doctor_models.py` runs the doctor on: third-party models with random weights, built offline (timm
`pretrained=False`, transformers from configs, torchvision `weights=None, weights_backbone=None`), the doctor's own
CPU test models, and `--small`'s CPU stand-ins. Not a script: `doctor_models.py` imports it.

A case builds `(fn, args, kwargs)` in float32 on the device it is given, and says how the doctor examines it (modes,
dtypes, our fixes to measure) and how long the whole case is expected to take on the GPU (`est_s`: building,
explain and the doctor with the 120 s budget, overruns included), which is how the set is split into device calls:
each model's whole time on an H100 with three parts side by side (2026-12-06, `results/doctor_models_34*_h100.csv`),
plus 15%.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tests.diagnose import fake_torchvision, real_models
from tests.diagnose.real_models import GreedyDecoder
from tests.diagnose.targets import breaks, exercise_2_5

from fullgraph.diagnose.inputs import Example

BF16, FP32 = torch.bfloat16, torch.float32
GPU_MODES = ("eager", "default", "reduce-overhead")
DETECTOR_MODES = ("eager", "default")  # each compile of a detector takes tens of seconds, and it breaks anyway
CPU_MODES = ("eager", "default")
GROUPS = ("timm", "transformers", "torchvision", "detectors", "ours")
ACCEPTANCE = GROUPS[:4]  # issue 34's set: third-party models only


@dataclass(frozen=True)
class Case:
    name: str
    group: str  # one of GROUPS ("small" for --small's)
    build: Callable[[torch.device], tuple]  # device -> (fn, args, kwargs), float32
    modes: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    est_s: float  # the whole case on a GPU shared by three parts, for splitting the set into device calls
    with_: tuple[str, ...] = ()  # our fixes the doctor measures beside the rows as written
    # Outputs are lists of detections (boxes, scores, labels): compiled rows must be judged by matched detections.
    # Not the doctor's test detector: its outputs have no labels, so the flat error judges them, as it should.
    detector: bool = False
    reps: int = 20


def moved(fn, args: tuple, kwargs: dict, device: torch.device) -> tuple:
    """(fn, args, kwargs) on `device`: a module, and every tensor of the inputs (lists of images too)."""
    example = Example.of(args, kwargs).to(device)
    return (fn.to(device) if isinstance(fn, torch.nn.Module) else fn), example.args, example.kwargs


def timm_model(name: str, batch: int):
    def build(device):
        import timm

        return timm.create_model(name, pretrained=False).eval(), (torch.randn(batch, 3, 224, 224),), {}

    return build


def torchvision_classifier(name: str, batch: int):
    def build(device):
        from torchvision import models

        return getattr(models, name)(weights=None).eval(), (torch.randn(batch, 3, 224, 224),), {}

    return build


def torchvision_detector(name: str):
    def build(device):
        from torchvision.models import detection

        model = getattr(detection, name)(weights=None, weights_backbone=None).eval()
        if name.startswith("retinanet"):  # its prior (bias -4.6: every score ~0.01, under the 0.05 threshold) would
            torch.nn.init.zeros_(model.head.classification_head.cls_logits.bias)  # leave nothing to compare
        return model, ([torch.rand(3, h, w) for h, w in ((480, 640), (512, 384), (600, 800))],), {}

    return build


def bert_base(device):
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(num_labels=3)).eval()  # BERT-base's sizes
    input_ids = torch.randint(0, model.config.vocab_size, (32, 128))
    attention_mask = torch.ones(32, 128, dtype=torch.int64)
    attention_mask[16:, 96:] = 0  # half the batch padded
    return model, (), {"input_ids": input_ids, "attention_mask": attention_mask}


def gpt2_greedy(device):
    from transformers import GPT2Config, GPT2LMHeadModel

    lm = GPT2LMHeadModel(GPT2Config()).eval()  # GPT-2 small's sizes
    model = GreedyDecoder(lm, steps=8, stop_token_id=-1)  # every step runs and tests its stop condition
    return model, (torch.randint(0, lm.config.vocab_size, (4, 32)),), {}


def t5(small: bool):
    """An encoder-decoder called as in training or scoring: `input_ids`, `attention_mask`, `decoder_input_ids`.
    T5Config's defaults are t5-small's sizes; `small` is a tiny one for the CPU."""

    def build(device):
        from transformers import T5Config, T5ForConditionalGeneration

        tiny = dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
        config = T5Config(**(tiny if small else {}), decoder_start_token_id=0, pad_token_id=0)
        batch, tokens = (2, 16) if small else (16, 128)
        mask = torch.ones(batch, tokens, dtype=torch.int64)
        mask[batch // 2 :, tokens * 3 // 4 :] = 0
        kwargs = {
            "input_ids": torch.randint(1, config.vocab_size, (batch, tokens)),
            "attention_mask": mask,
            "decoder_input_ids": torch.randint(1, config.vocab_size, (batch, tokens // 4)),
        }
        return T5ForConditionalGeneration(config).eval(), (), kwargs

    return build


def clip_vision(small: bool):
    def build(device):
        from transformers import CLIPVisionConfig, CLIPVisionModel

        tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=8)
        config = CLIPVisionConfig(**(tiny if small else {}), image_size=32 if small else 224)  # ViT-B/32's sizes
        batch, size = (2, 32) if small else (64, 224)
        return CLIPVisionModel(config).eval(), (), {"pixel_values": torch.randn(batch, 3, size, size)}

    return build


def exercise(device):
    x, threshold = exercise_2_5.inputs(batch=48)  # the threshold from the CPU weights, before they move
    exercise_2_5.model.to(device)
    return exercise_2_5.process, (x, threshold), {}


def test_model(builder):
    """One of the doctor's CPU test models (tests/diagnose), built on the CPU and moved."""
    return lambda device: builder()


def stand_in_detector(device):
    """--small's detector: torchvision's NMS stand-in (tests/diagnose/fake_torchvision.py, breaks and fails in bf16
    as torchvision's does), for the fix columns on a machine without torchvision."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        folder = Path(tempfile.mkdtemp(prefix="fake_torchvision_"))
        fake_torchvision.write(folder)
        sys.path.insert(0, str(folder))
        import detector
    else:
        raise RuntimeError("torchvision imports here: run the detectors group instead of its stand-in")
    model, args = detector.build()
    return model, args, {}


def _breaks(builder):
    return lambda device: (*builder(), {})


CASES: tuple[Case, ...] = (
    Case("vit_base_patch16_224", "timm", timm_model("vit_base_patch16_224", 256), GPU_MODES, (BF16,), 45),
    Case("resnet50", "timm", timm_model("resnet50", 128), GPU_MODES, (BF16,), 25),
    Case("convnext_tiny", "timm", timm_model("convnext_tiny", 128), GPU_MODES, (BF16,), 45),
    Case(
        "swin_tiny_patch4_window7_224", "timm", timm_model("swin_tiny_patch4_window7_224", 128), GPU_MODES, (BF16,), 120
    ),
    Case("efficientnet_b0", "timm", timm_model("efficientnet_b0", 128), GPU_MODES, (BF16,), 40),
    Case("bert_base", "transformers", bert_base, GPU_MODES, (FP32, BF16), 80),
    Case("gpt2_greedy", "transformers", gpt2_greedy, ("eager", "default"), (BF16,), 105),
    Case("t5_small", "transformers", t5(small=False), GPU_MODES, (BF16,), 60),
    Case("clip_vision_b32", "transformers", clip_vision(small=False), GPU_MODES, (BF16,), 40),
    Case("tv_resnet50", "torchvision", torchvision_classifier("resnet50", 128), GPU_MODES, (BF16,), 15),
    Case("tv_convnext_tiny", "torchvision", torchvision_classifier("convnext_tiny", 128), GPU_MODES, (BF16,), 40),
    Case("tv_vit_b_16", "torchvision", torchvision_classifier("vit_b_16", 256), GPU_MODES, (BF16,), 45),
    *(
        Case(name, "detectors", torchvision_detector(name), DETECTOR_MODES, (FP32, BF16), est, fixes, True, 10)
        for name, est, fixes in (  # R-CNN's box and mask heads pool with roi_align, which has no bf16 kernel
            ("fasterrcnn_resnet50_fpn", 155, ("nms", "roi_align")),
            ("maskrcnn_resnet50_fpn", 200, ("nms", "roi_align")),
            ("retinanet_resnet50_fpn", 140, ("nms",)),
            ("ssdlite320_mobilenet_v3_large", 160, ("nms",)),
        )
    ),
    Case("exercise_2_5", "ours", exercise, GPU_MODES, (FP32,), 30),
    Case("test_detector", "ours", test_model(real_models.detector), ("eager", "default"), (FP32,), 40),
    Case("test_bert_tiny", "ours", test_model(real_models.bert), ("eager", "default"), (FP32,), 30),
)

# --small: what builds on a CPU in seconds (transformers from tiny configs, the doctor's test models), fp32.
SMALL: tuple[Case, ...] = (
    Case("bert_tiny", "small", test_model(real_models.bert), CPU_MODES, (FP32,), 20),
    Case("gpt2_greedy_tiny", "small", test_model(real_models.gpt2_greedy), CPU_MODES, (FP32,), 30),
    Case("t5_tiny", "small", t5(small=True), CPU_MODES, (FP32,), 30),
    Case("clip_vision_tiny", "small", clip_vision(small=True), CPU_MODES, (FP32,), 20),
    Case("test_detector", "small", test_model(real_models.detector), CPU_MODES, (FP32,), 30),
    Case("stand_in_nms_detector", "small", stand_in_detector, CPU_MODES, (FP32, BF16), 30, ("nms",), True, 5),
    Case("three_hits", "small", _breaks(breaks.three_hits), CPU_MODES, (FP32,), 10),
    Case("skipped_loop", "small", _breaks(breaks.skipped), CPU_MODES, (FP32,), 10),
    Case("exercise_2_5", "small", test_model(real_models.exercise), CPU_MODES, (FP32,), 20),
)


def select(wanted: list[str], small: bool) -> list[Case]:
    """Cases in the order named (a group's in the catalog's order), each once; none named: the acceptance set (or
    every --small case). The order is the caller's so that a part run against a deadline starts its longest case
    first."""
    catalog = SMALL if small else CASES
    if not wanted:
        return [c for c in catalog if small or c.group in ACCEPTANCE]
    known = {c.name for c in catalog} | {c.group for c in catalog}
    bad = [w for w in wanted if w not in known]
    if bad:
        raise SystemExit(
            f"doctor_models.py: unknown model or group {', '.join(bad)}; choose from {', '.join(sorted(known))}"
        )
    picked = [c for w in wanted for c in catalog if w in (c.name, c.group)]
    return list(dict.fromkeys(picked))
