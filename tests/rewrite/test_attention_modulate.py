"""The rewrites that route third-party code to our ops (issue 33): `attention_kernel` (F.scaled_dot_product_attention
-> our flash attention) and `layer_norm_modulate_kernel` (adaLN's LN(x) * (1 + scale) + shift -> our one-pass
kernel), on small models written as users write them, on the device Triton runs on (the CPU under its interpreter
without a GPU), against float64."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullgraph
from fullgraph.ops import measured
from tests.rewrite.test_rewrites import reference, run


class SelfAttention(nn.Module):
    """timm's Attention, as it is written there: one qkv projection, SDPA, heads merged back."""

    def __init__(self, dim=48, heads=3, **sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        kwargs = dict(self.sdpa, attn_mask=mask) if mask is not None else self.sdpa
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class GroupedQuery(nn.Module):
    """A decoder's grouped-query attention (transformers' Llama style): 4 query heads over 2 key/value heads."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * kv_heads * self.d)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(b, n, -1)


def close_to(out, ref, rel=1e-5):
    rel = rel if out.device.type == "cpu" else 1e-4  # GPU: Inductor's fp32 GEMMs reorder sums
    return (out.double() - ref).abs().max().item() <= rel * ref.abs().max().item()


@pytest.mark.parametrize("model", [SelfAttention(), GroupedQuery()], ids=["vit", "gqa-causal"])
def test_sdpa_becomes_our_kernel_when_forced_and_matches_fp64(model, triton_device):
    torch.manual_seed(0)
    width = 48 if isinstance(model, SelfAttention) else 32
    model, x = model.eval().to(triton_device), torch.randn(2, 13, width, device=triton_device)  # 13 tokens: odd
    out, cm = run(model, x, rewrites=["attention_kernel"])
    assert close_to(out, reference(model, x))
    assert cm.stats.rewrite_counts() == {"attention_kernel": 1} and cm.stats.graph_breaks == 0
    (applied,) = cm.stats.rewrites
    assert applied.line.startswith("test_attention_modulate.py:")
    assert applied.detail.startswith("SDPA 3 heads of 16" if isinstance(model, SelfAttention) else "SDPA 4/2 heads")


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (SelfAttention(dropout_p=0.1), "dropout_p=0.1: attention dropout (training) runs in torch's SDPA"),
        (SelfAttention(), "our kernel cannot serve this call: it takes no attn_mask"),
    ],
    ids=["dropout", "mask"],
)
def test_sdpa_calls_our_kernel_cannot_serve_are_left_with_the_reason(model, reason, triton_device):
    torch.manual_seed(1)
    model, x = model.to(triton_device), torch.randn(2, 9, 48, device=triton_device)
    mask = torch.randn(9, 9, device=triton_device) if "mask" in reason else None  # additive (float64 reference)
    args = (x,) if mask is None else (x, mask)
    torch._dynamo.reset()
    cm = fullgraph.compile(model.eval(), "dev", rewrites=["attention_kernel"])
    with torch.no_grad():
        out = cm(*args)
    assert cm.stats.rewrites == ()
    assert [s.reason[: len(reason)] for s in cm.stats.rewrites_skipped] == [reason]
    if mask is None:  # dropout in eval mode: SDPA's own dropout still draws, so only the mask case is compared
        return
    ref = reference(model, x, mask)
    assert close_to(out, ref)


def test_attention_follows_the_ops_policy_and_auto_keeps_sdpa_in_fp32(triton_device):
    torch.manual_seed(2)
    model, x = SelfAttention().eval().to(triton_device), torch.randn(2, 13, 48, device=triton_device)
    _, cm = run(model, x)  # auto: the dispatch keeps torch's SDPA (fp32, off CUDA graphs), and says why
    assert cm.stats.rewrites == ()
    assert [s.reason.split(" (")[0] for s in cm.stats.rewrites_skipped] == ["auto: torch's SDPA here"]
    with fullgraph.ops.policy(attention="kernel"):  # our ops' vocabulary: kernel takes it under auto
        out, cm = run(model, x)
    assert cm.stats.rewrite_counts() == {"attention_kernel": 1}
    assert close_to(out, reference(model, x))
    causal = GroupedQuery().eval().to(triton_device)
    _, cm = run(causal, torch.randn(2, 13, 32, device=triton_device))
    assert [s.reason.split(" (")[0] for s in cm.stats.rewrites_skipped] == [
        "auto: causal and grouped-query attention were not measured in a graph"
    ]
    with fullgraph.ops.policy(attention="native"):  # native stops it, even forced
        _, cm = run(model, x, rewrites=["attention_kernel"])
    assert cm.stats.rewrites == ()
    assert [s.reason for s in cm.stats.rewrites_skipped] == ["op attention's policy is native"]


def modulate(x, shift, scale):
    """DiT's (facebookresearch/DiT) modulation."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class AdaLNBlock(nn.Module):
    """A DiT block's pre-attention half as DiT and diffusers write it: adaLN parameters from the conditioning, a
    LayerNorm without affine, modulated; attention of head dim 16; the second norm modulated diffusers' way."""

    def __init__(self, dim=48, affine=False):
        super().__init__()
        self.ada = nn.Linear(dim, 4 * dim)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=affine, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(dim)

    def forward(self, x, c):
        shift1, scale1, shift2, scale2 = self.ada(F.silu(c)).chunk(4, dim=1)
        x = x + self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + (shift2[:, None] + (scale2[:, None] + 1) * self.norm2(x))  # operands the other way round


def test_adaln_modulation_becomes_one_kernel_when_forced_and_matches_fp64(triton_device):
    torch.manual_seed(3)
    model = AdaLNBlock().eval().to(triton_device)
    x, c = torch.randn(2, 11, 48, device=triton_device), torch.randn(2, 48, device=triton_device)
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev", rewrites=["layer_norm_modulate_kernel"])
    with torch.no_grad():
        out = cm(x, c)
    assert close_to(out, reference(model, x, c))
    assert [a.where for a in cm.stats.rewrites] == ["", ""] and cm.stats.graph_breaks == 0
    assert {a.line.split(":")[0] for a in cm.stats.rewrites} == {"test_attention_modulate.py"}
    assert cm.stats.rewrites[0].detail == "LayerNorm over 48 + modulation (float32) -> fullgraph's kernel"


class NotQuite(nn.Module):
    """Modulations the kernel does not compute: per-token shift/scale, and a norm whose output is used twice."""

    def __init__(self, dim=24):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)

    def forward(self, x, shift, scale):
        per_token = self.norm(x) * (1 + scale) + shift  # [B, N, C] parameters: not one row per batch element
        n = self.norm(x)
        return per_token + n * (1 + scale[:, :1]) + shift[:, :1] + n


def test_modulations_that_almost_match_are_left_alone(triton_device):
    torch.manual_seed(4)
    x, shift, scale = (torch.randn(2, 5, 24, device=triton_device) for _ in range(3))
    model = NotQuite().eval().to(triton_device)
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev", rewrites=["layer_norm_modulate_kernel"])
    with torch.no_grad():
        out = cm(x, shift, scale)
    assert cm.stats.rewrites == () and cm.stats.rewrites_skipped == ()
    assert close_to(out, reference(model, x, shift, scale))
    affine = AdaLNBlock(affine=True).eval().to(triton_device)  # a LayerNorm with weight and bias: skipped, with why
    torch._dynamo.reset()
    cm = fullgraph.compile(affine, "dev", rewrites=["layer_norm_modulate_kernel"])
    with torch.no_grad():
        cm(torch.randn(2, 11, 48, device=triton_device), torch.randn(2, 48, device=triton_device))
    assert cm.stats.rewrite_counts() == {"layer_norm_modulate_kernel": 1}  # norm2 only
    assert [s.reason.split(":")[0] for s in cm.stats.rewrites_skipped] == ["the LayerNorm has a weight or bias"]


def test_modulation_auto_asks_the_decision_data_with_the_models_head_dim(monkeypatch, triton_device):
    asked = []

    def choice(op, device=None, shape=None):
        asked.append((op, shape))
        return "kernel" if op == "layer_norm_modulate" and shape.head_dim == 16 and shape.width == 48 else "native"

    monkeypatch.setattr(measured, "compiled_choice", choice)
    torch.manual_seed(5)
    model = AdaLNBlock().eval().to(triton_device)
    x, c = torch.randn(2, 11, 48, device=triton_device), torch.randn(2, 48, device=triton_device)
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev")
    with torch.no_grad():
        out = cm(x, c)
    assert cm.stats.rewrite_counts() == {"layer_norm_modulate_kernel": 2}
    asked = [s for op, s in asked if op == "layer_norm_modulate"]
    assert asked == [measured.Shape(torch.float32, 16, 48, 22)] * 2  # head dim read off the graph's SDPA
    assert close_to(out, reference(model, x, c))
    with fullgraph.ops.policy(layer_norm_modulate="native", layer_norm="kernel"):
        torch._dynamo.reset()
        cm = fullgraph.compile(model, "dev")
        with torch.no_grad():
            cm(x, c)
    # the modulated norms stay native; the LayerNorm alone under its own kernel policy takes our norm kernel
    assert cm.stats.rewrite_counts() == {"layer_norm_kernel": 2}
    assert "op layer_norm_modulate's policy is native" in {s.reason for s in cm.stats.rewrites_skipped}


@pytest.mark.parametrize(
    ("heads", "dtype", "applied"),
    [(1, torch.float16, True), (4, torch.float16, False), (1, torch.float32, False)],
    ids=["hd64-fp16", "hd16", "fp32"],
)
def test_attention_auto_follows_the_graphed_measurement(monkeypatch, triton_device, heads, dtype, applied):
    """Auto takes our kernel where the dispatch's measured rule does (under CUDA graphs, at a size it fits: stood
    in for here), only at a measured head dim (64 or 128) and in half precision (fp16 here: tl.dot in bf16 is wrong
    under Triton's interpreter, tests/kernels/test_flash_attention.py)."""
    monkeypatch.setattr(measured, "graphed_kernel_fits", lambda op, device, numel: op == "attention")
    torch.manual_seed(6)
    model = SelfAttention(dim=64, heads=heads).eval().to(triton_device, dtype)
    x = torch.randn(2, 9, 64, device=triton_device, dtype=dtype)
    out, cm = run(model, x)
    assert (cm.stats.rewrite_counts() == {"attention_kernel": 1}) is applied
    if not applied:
        assert [s.reason.split(" (")[0] for s in cm.stats.rewrites_skipped] == ["auto: torch's SDPA here"]
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()  # fp16: its rounding
