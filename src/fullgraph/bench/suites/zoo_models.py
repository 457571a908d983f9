"""The models of suite `zoo` (not a suite itself): third-party models as their users build and call them, with
random weights (the GPU machine has no model hub), and the tiny stand-ins of `--small`.

An entry names the package it needs, builds the model from that package's module, and draws the inputs of one
batch as its users pass them: an image tensor for timm and torchvision, keyword inputs for transformers
(`input_ids=`, `attention_mask=`, `token_type_ids=`, as a tokenizer returns them; `pixel_values=` for vision
models). Inputs are drawn in float32 on the CPU; the suite moves and casts them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.env import first_line

IMAGE = 224
TOKENS = 128  # a text model's sequence length
PADDED = 16  # tokens of padding at the end of every other sequence (a batch of sentences of unequal length)


@dataclass(frozen=True)
class Entry:
    """One model of the zoo."""

    name: str  # "timm/vit_base_patch16_224": the library, then the model's name in it
    library: str  # the package it needs ("" for the stand-ins)
    build: Callable[[Any], nn.Module]  # the library's module -> the model, random weights
    inputs: Callable[[int], tuple[tuple, dict]]  # batch -> (args, kwargs), float32, on the CPU
    batches: tuple[int, ...]  # a small batch (1-4) and a large one


def image_input(size: int = IMAGE) -> Callable[[int], tuple[tuple, dict]]:
    return lambda batch: ((torch.randn(batch, 3, size, size),), {})


def pixel_values(batch: int) -> tuple[tuple, dict]:
    return (), {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE)}


def text_input(vocab: int, token_types: bool, tokens: int = TOKENS) -> Callable[[int], tuple[tuple, dict]]:
    """input_ids and an attention mask with the last PADDED tokens of every other sequence padding."""

    def draw(batch: int) -> tuple[tuple, dict]:
        mask = torch.ones(batch, tokens, dtype=torch.long)
        mask[1::2, tokens - min(PADDED, tokens // 2) :] = 0
        kwargs = {"input_ids": torch.randint(0, vocab, (batch, tokens)), "attention_mask": mask}
        if token_types:
            kwargs["token_type_ids"] = torch.zeros(batch, tokens, dtype=torch.long)
        return (), kwargs

    return draw


def _timm(name: str, batches: tuple[int, int]) -> Entry:
    return Entry(f"timm/{name}", "timm", lambda timm: timm.create_model(name, pretrained=False), image_input(),
                 batches)  # fmt: skip


def _torchvision(name: str, batches: tuple[int, int]) -> Entry:
    return Entry(f"torchvision/{name}", "torchvision", lambda tv: getattr(tv.models, name)(weights=None),
                 image_input(), batches)  # fmt: skip


def _transformers(model: str, config: str, inputs, batches: tuple[int, int]) -> Entry:
    return Entry(f"transformers/{model}", "transformers", lambda tf: getattr(tf, model)(getattr(tf, config)()),
                 inputs, batches)  # fmt: skip


VISION_TRANSFORMER = (4, 256)  # the batches of the ViT anchors (DESIGN.md)
CONVNET = (4, 128)
TEXT = (4, 64)  # sequences of TOKENS

MODELS: tuple[Entry, ...] = (
    _timm("vit_small_patch16_224", VISION_TRANSFORMER),
    _timm("vit_base_patch16_224", VISION_TRANSFORMER),
    _timm("deit_small_patch16_224", VISION_TRANSFORMER),
    _timm("convnext_tiny", CONVNET),
    _timm("swin_tiny_patch4_window7_224", CONVNET),
    _timm("resnet50", CONVNET),
    _timm("efficientnet_b0", CONVNET),
    _transformers("BertModel", "BertConfig", text_input(30522, token_types=True), TEXT),
    _transformers("GPT2Model", "GPT2Config", text_input(50257, token_types=False), TEXT),
    _transformers("ViTModel", "ViTConfig", pixel_values, VISION_TRANSFORMER),
    _transformers("CLIPVisionModel", "CLIPVisionConfig", pixel_values, VISION_TRANSFORMER),
    _torchvision("resnet50", CONVNET),
    _torchvision("convnext_tiny", CONVNET),
    _torchvision("vit_b_16", VISION_TRANSFORMER),
)


class PatchMLP(nn.Module):
    """A stand-in vision model, written as users write one: a patch-embedding convolution (stride = kernel), a
    LayerNorm, an MLP with `nn.GELU` (the patterns of `patch_gemm` and `gelu_epilogue`), a linear head."""

    def __init__(self, dim: int = 32, patch: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)  # x: [B, N, D]
        x = x + self.fc2(self.act(self.fc1(self.norm(x))))
        return self.head(x.mean(1))


class TinyEncoder(nn.Module):
    """A stand-in text model called as transformers' are (`input_ids=`, `attention_mask=`), returning a dict: an
    embedding, one masked SDPA layer, an MLP with GELU."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed(input_ids)  # h: [B, N, D]
        b, n, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = attention_mask[:, None, None, :].bool()  # mask: [B, 1, 1, N], True where a token attends
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # a: [B, H, N, D/H]
        h = h + self.proj(a.transpose(1, 2).reshape(b, n, d))
        h = h + self.fc2(F.gelu(self.fc1(self.norm2(h))))
        return {"last_hidden_state": h}


SMALL: tuple[Entry, ...] = (
    Entry("small/patch_mlp", "", lambda _: PatchMLP(), image_input(32), (1, 4)),
    Entry("small/tiny_encoder", "", lambda _: TinyEncoder(), text_input(100, token_types=False, tokens=16), (1, 4)),
)


def import_library(library: str) -> tuple[Any, str]:
    """(the library's module, "") or (None, why it cannot be used): not installed, or installed and failing to
    import (a torchvision built for another torch, say). "" needs nothing."""
    if not library:
        return None, ""
    try:
        return importlib.import_module(library), ""
    except Exception as e:  # any failure at import: the model is skipped, never a traceback
        if isinstance(e, ModuleNotFoundError) and e.name == library:
            return None, f"{library} is not installed"
        return None, f"{library} does not import: {first_line(e)}"


def redraw_zero_weights(model: nn.Module) -> int:
    """Draw weights for the linear layers a library starts at zero, in place; how many there were. torchvision's
    ViT-B/16 built with `weights=None` zeroes its classifier, so every output is exactly 0 and each variant's error
    against the fp32 reference is 0/0 (NaN): nothing judged. A random model has no weights to keep."""
    zero = [m for m in model.modules() if isinstance(m, nn.Linear) and not m.weight.detach().any()]
    with torch.no_grad():
        for m in zero:
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.normal_(m.bias, std=0.02)
    return len(zero)


def primary_output(out: Any) -> torch.Tensor:
    """The tensor a model's output is judged by: the tensor itself, a ModelOutput's or dict's first value
    (transformers' `last_hidden_state`), a tuple's first element."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict of its non-None fields
        return primary_output(next(iter(out.values())))
    if isinstance(out, (tuple, list)) and out:
        return primary_output(out[0])
    raise TypeError(f"cannot judge a model output of type {type(out).__name__}")
