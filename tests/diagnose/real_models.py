"""Real-world model shapes for the doctor's tests: tiny configurations, random weights, no downloads, CPU.

Each builder returns `(fn, args, kwargs)`, the callable the doctor examines and what to call it with, built
from the current torch seed. Not collected by pytest (no `test_` prefix).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from tests.diagnose.targets import bert as targets_bert
from tests.diagnose.targets import exercise_2_5


def bert():
    """A transformers encoder called with keyword inputs (`input_ids=`, `attention_mask=`), as a tokenizer's dict."""
    return targets_bert.model(), (), targets_bert.inputs()


class GreedyDecoder(nn.Module):
    """Greedy decoding with a KV cache and a stop test, the loop `generate` runs. The stop test (`if all sequences
    finished`) reads a tensor's value inside a loop, so Dynamo gives up on the whole loop (the frame runs eagerly)
    and compiles the language model alone, again for each new cache length until it marks that length dynamic."""

    def __init__(self, lm: nn.Module, steps: int, stop_token_id: int):
        super().__init__()
        self.lm, self.steps, self.stop_token_id = lm, steps, stop_token_id
        # transformers 5 renamed the cache argument and output field (`past_key_values` before): fixed here, once.
        self.cache_name = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"

    def forward(self, input_ids):
        out = self.lm(input_ids=input_ids, use_cache=True)
        tokens = [input_ids]
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for _ in range(self.steps):
            next_token = out.logits[:, -1].argmax(-1)  # next_token: [B]
            next_token = torch.where(finished, self.stop_token_id, next_token)
            tokens.append(next_token[:, None])
            finished = finished | (next_token == self.stop_token_id)
            if finished.all():  # break: a condition on a tensor's value, as generate's stopping check
                break
            cache = {self.cache_name: getattr(out, self.cache_name)}
            out = self.lm(input_ids=next_token[:, None], use_cache=True, **cache)
        return torch.cat(tokens, dim=1)  # [B, N + steps]


def gpt2_greedy(steps: int = 3):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    lm = GPT2LMHeadModel(config).eval()
    # Stop on an id the model never emits: every step runs, as with a fixed max_new_tokens, and every step still
    # tests the stop condition, whatever the random weights predict.
    model = GreedyDecoder(lm, steps, stop_token_id=-1)
    return model, (torch.randint(1, config.vocab_size, (2, 8)),), {}


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of boxes a [N, 4] against b [M, 4], (x1, y1, x2, y2) -> [N, M]."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def python_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS as a Python loop over a shrinking tensor: its length and every iteration depend on data."""
    order = scores.argsort(descending=True)
    keep = []
    while order.numel() > 0:
        i = order[0]
        keep.append(i)
        ious = box_iou(boxes[i][None], boxes[order[1:]])[0]
        order = order[1:][ious <= iou_threshold]
    return torch.stack(keep) if keep else order


class TinyDetector(nn.Module):
    """The shape of torchvision's detection models: a list of images of different sizes, each through a conv
    backbone and a box head, scores filtered by a threshold (a data-dependent number of boxes), then NMS."""

    def __init__(self, score_threshold: float = 0.5, iou_threshold: float = 0.5, stride: int = 8):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Conv2d(16, 5, 1)  # per cell: 4 box offsets and a score
        self.score_threshold, self.iou_threshold, self.stride = score_threshold, iou_threshold, stride

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        results = []
        for image in images:
            out = self.head(self.backbone(image[None]))[0]  # out: [5, H/8, W/8]
            h, w = out.shape[1:]
            ys, xs = torch.meshgrid(
                torch.arange(h, device=out.device), torch.arange(w, device=out.device), indexing="ij"
            )
            centers = torch.stack([xs, ys], -1).reshape(-1, 2).to(out.dtype) * self.stride + self.stride / 2
            deltas = out[:4].reshape(4, -1).T  # deltas: [H*W/64, 4]
            sizes = self.stride * deltas[:, 2:].exp()
            boxes = torch.cat([centers + deltas[:, :2] - sizes, centers + deltas[:, :2] + sizes], -1)
            scores = out[4].reshape(-1).sigmoid()
            keep = scores > self.score_threshold  # data-dependent: how many boxes survive
            boxes, scores = boxes[keep], scores[keep]
            kept = python_nms(boxes, scores, self.iou_threshold)
            results.append({"boxes": boxes[kept], "scores": scores[kept]})
        return results


def detector():
    model = TinyDetector().eval()
    images = [torch.randn(3, 64, 80), torch.randn(3, 48, 64), torch.randn(3, 72, 56)]
    with torch.no_grad():  # the threshold at the first image's median score: about half its cells pass, on any draw
        scores = model.head(model.backbone(images[0][None]))[0, 4].sigmoid()
        model.score_threshold = float(scores.median())
    return model, (images,), {}


def exercise():
    """Exercise 2.5: `process(x, threshold)`, compiled by its decorator, with a Python float threshold."""
    x, threshold = exercise_2_5.inputs()
    return exercise_2_5.process, (x, threshold), {}


class Chatty(nn.Module):
    """Prints in forward on every call, as debugging code left in a model does. Straight-line code: a print inside
    a loop would make Dynamo skip the whole frame (no graph at all), here each print splits the graph."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.first, self.second, self.third = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        x = torch.tanh(self.first(x))
        print(f"chatty: after first, shape {tuple(x.shape)}")  # break: print
        x = torch.tanh(self.second(x))
        print("chatty: after second")  # break: print
        return self.third(x).softmax(-1)


def chatty():
    return Chatty().eval(), (torch.randn(4, 16),), {}


MODELS = {"bert": bert, "gpt2_greedy": gpt2_greedy, "detector": detector, "exercise_2_5": exercise, "chatty": chatty}


@pytest.fixture
def fresh_dynamo():
    """Dynamo reset around a test that compares with torch._dynamo.explain (which resets it anyway)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def line_of(path: str, text: str) -> int:
    """1-based number of the only line of `path` containing `text`."""
    with open(path, encoding="utf-8") as f:
        hits = [i for i, line in enumerate(f, 1) if text in line]
    assert len(hits) == 1, f"{text!r} is on lines {hits} of {path}"
    return hits[0]
