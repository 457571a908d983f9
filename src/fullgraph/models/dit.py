"""A DiT stack (diffusion transformer) built from `fullgraph.ops`, and a plain-PyTorch twin with the same state dict.

Each block (adaLN-Zero, as in DiT, Peebles & Xie 2023, and the video DiTs after it):

    shift1, scale1, gate1, shift2, scale2, gate2 = ada(silu(c))                   # each [B, C]
    h = modulate(layer_norm(x), shift1, scale1)                                    # LayerNorm without affine
    q, k, v = qkv(h) -> heads; q, k = rope(rms_norm(q)), rope(rms_norm(k))         # op qk_norm_rope
    x = gated_residual(x, proj(attention(q, k, v)), gate1)                         # x + gate1 * attn
    x = gated_residual(x, fc2(gelu_tanh(fc1(modulate(layer_norm(x), shift2, scale2)))), gate2)

and the stack ends with a final adaLN (shift, scale) and a linear layer. RoPE positions are 1-D (token index) or
video (frames x height x width: the head dim split in three, each part rotated by its axis' index, the layout of
the open video DiTs). `ada` starts at zero (adaLN-Zero: every block starts as the identity); randomize the weights
to compare the two forms.

`DiT` uses `fullgraph.ops`: layer_norm_modulate (the gated residual, LayerNorm and modulation as one op; both of a
block's gated residuals are carried into the next block's first norm, the last block's into the final norm),
qk_norm_rope (the q/k RMSNorm and RoPE as one op; RMSNorm alone without RoPE), linear_gelu, skinny_linear (the adaLN
projections of the conditioning: a few rows, a read of the weight) and attention, so each op's policy picks native
or kernel;
`PlainDiT` writes the same computation with `F.layer_norm`, a rotate-half RoPE and SDPA, the way users write it
today. Both load each other's state dicts: the comparison in the DiT issue.
This module imports `ops` only (DESIGN.md, Layers): compile it from outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph import ops
from fullgraph.errors import UsageError
from fullgraph.models._calls import must_call_as_usual
from fullgraph.ops import direct, measured


@dataclass(frozen=True)
class DiTConfig:
    """A DiT stack's shape. `rope`: "1d" (positions 0..N-1, up to `max_tokens`), "video" (the `grid` of
    (frames, height, width) tokens, N = their product) or None."""

    dim: int = 384
    heads: int = 6
    depth: int = 12
    mlp_ratio: float = 4.0
    out_dim: int | None = None  # the final linear's width; default dim
    rope: str | None = "1d"
    max_tokens: int = 16384
    grid: tuple[int, int, int] | None = None
    rope_base: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.dim <= 0 or self.heads <= 0 or self.dim % self.heads:
            raise UsageError(f"dim ({self.dim}) must be a positive multiple of heads ({self.heads})")
        if (self.dim // self.heads) % 2:
            raise UsageError(f"head dim {self.dim // self.heads} must be even for RoPE; change dim or heads")
        if self.depth < 1:
            raise UsageError(f"depth must be at least 1, got {self.depth}")
        if self.rope not in (None, "1d", "video"):
            raise UsageError(f"rope={self.rope!r}: choose '1d', 'video' or None")
        if self.rope == "video":
            if self.grid is None or len(self.grid) != 3 or min(self.grid) < 1:
                raise UsageError(f"rope='video' needs grid=(frames, height, width) of positive sizes, got {self.grid}")
            if self.head_dim < 6:
                raise UsageError(f"rope='video' splits the head dim in three even parts; {self.head_dim} is too small")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def hidden(self) -> int:
        return int(self.dim * self.mlp_ratio)


CONFIGS = {
    "dit_s": DiTConfig(dim=384, heads=6, depth=12),
    "dit_b": DiTConfig(dim=768, heads=12, depth=12),
    "dit_xl": DiTConfig(dim=1152, heads=16, depth=28),
    "dit_3072": DiTConfig(dim=3072, heads=24, depth=4),  # the DiT issue's measured stack (4 blocks of a 3072 model)
}


def config(name: str, **overrides) -> DiTConfig:
    """A named config (dit_s, dit_b, dit_xl, dit_3072) with fields replaced, e.g. config("dit_b", depth=2)."""
    if name not in CONFIGS:
        raise UsageError(f"unknown DiT config {name!r}; choose one of {', '.join(CONFIGS)}")
    fields = {f: getattr(CONFIGS[name], f) for f in DiTConfig.__dataclass_fields__}
    return DiTConfig(**{**fields, **overrides})


def video_split(head_dim: int) -> tuple[int, int, int]:
    """Rotary dims for (frames, height, width): height and width get 2·(D // 6) each, frames the rest (all even)."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_tables_for(cfg: DiTConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(cos, sin), each [tokens, head_dim / 2], float32: for "1d" the first `max_tokens` positions, for "video"
    each token of the grid (frames-major), its three axes' angles side by side."""
    if cfg.rope is None:
        return None
    if cfg.rope == "1d":
        return ops.rope_tables(cfg.max_tokens, cfg.head_dim, cfg.rope_base)
    frames, height, width = cfg.grid
    t, h, w = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij")
    cos, sin = [], []
    for pos, size, rotary in zip((t, h, w), cfg.grid, video_split(cfg.head_dim), strict=True):
        c, s = ops.rope_tables(size, rotary, cfg.rope_base)  # [size, rotary / 2]
        cos.append(c[pos.reshape(-1)])
        sin.append(s[pos.reshape(-1)])
    return torch.cat(cos, -1), torch.cat(sin, -1)  # [F·H·W, head_dim / 2]


def _rope_slice(cfg: DiTConfig, cos: torch.Tensor, sin: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    limit = cos.shape[0]
    if (cfg.rope == "video" and n != limit) or n > limit:
        want = f"the grid's {limit} tokens {cfg.grid}" if cfg.rope == "video" else f"at most max_tokens={limit}"
        raise UsageError(f"x has {n} tokens; this DiT's RoPE holds {want}")
    return cos[:n], sin[:n]


def _block_params(block: nn.Module, cfg: DiTConfig, norm) -> None:
    block.ada = nn.Linear(cfg.dim, 6 * cfg.dim)
    block.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
    block.q_norm = norm(cfg.head_dim, eps=cfg.eps)
    block.k_norm = norm(cfg.head_dim, eps=cfg.eps)
    block.proj = nn.Linear(cfg.dim, cfg.dim)
    block.fc1 = nn.Linear(cfg.dim, cfg.hidden)
    block.fc2 = nn.Linear(cfg.hidden, cfg.dim)
    nn.init.zeros_(block.ada.weight)  # adaLN-Zero
    nn.init.zeros_(block.ada.bias)


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.heads, self.head_dim, self.eps, self.dim = cfg.heads, cfg.head_dim, cfg.eps, cfg.dim
        _block_params(self, cfg, ops.RMSNorm)

    def forward(self, x, c, rope=None, pending=None, finish: bool = True):
        """x [B, N, C] -> the block's output x + gate1 * attn + gate2 * mlp. Both gated residuals can join the next
        norm: with `finish=False` the block returns (x, pending) without them, pending = (attn, gate1, mlp, gate2),
        and the next block (or the stack's final norm) takes it as `pending`, adding both branches inside its own
        `layer_norm_modulate` in one float32 sum: one pass where the ops apart take several, and the residual stream
        rounded once a block, as Inductor's fusion of the native ops rounds it (rounded after each branch, the DiT's
        error with the kernel was 1.04-1.14x all native's on an H100; `benchmarks/lnm_error.py`)."""
        f = self._forms(x, rope is not None, finish)
        ada = f.skinny_linear(F.silu(c), self.ada.weight, self.ada.bias)  # [B, 6C]: a read of the weight
        shift1, scale1, gate1, shift2, scale2, gate2 = _modulation(ada, 6)  # each [B, 1, C]
        if pending is None:
            h = f.layer_norm_modulate(x, shift1, scale1, self.eps)  # h: [B, N, C]
        else:
            h, x = f.layer_norm_modulate(x, shift1, scale1, self.eps, *pending)  # x: the previous block's output
        q, k, v = self.qkv(h).unflatten(-1, (3, self.heads, self.head_dim)).unbind(2)  # q: [B, N, H, D]
        if rope is not None:  # the norms and the rotation as one op (seq dim 1: [B, N, H, D])
            q, k = f.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, *rope, self.eps, False, 1)
        else:
            q, k = f.rms_norm(self.q_norm, q), f.rms_norm(self.k_norm, k)
        attn = self.proj(f.attention(q, k, v).flatten(2))
        h = f.layer_norm_modulate(x, shift2, scale2, self.eps, attn, gate1, None, None, False)  # y only: the sum
        # x + gate1 * attn is formed again, with the MLP's branch, by the next norm
        mlp = self.fc2(f.linear_gelu(h, self.fc1.weight, self.fc1.bias, "tanh"))
        return _finished(f, x, (attn, gate1, mlp, gate2)) if finish else (x, (attn, gate1, mlp, gate2))

    def _forms(self, x, rope: bool, finish: bool):
        """The ops this call runs: in inference each op's chosen form called directly (`ops.direct`: the block's
        tensors are its own, made from inputs the stack checked, so the per-op checks and policy lookups are only
        host time eager and guards compiled), else (autograd records) the checked ops of `fullgraph.ops`."""
        policy = self.q_norm.policy
        if not direct.usable() or policy != self.k_norm.policy:
            return _CHECKED
        calls = _CALLS[rope, finish]
        own, shape = (("rms_norm", policy),) if policy else (), measured.shape_of(x, self.head_dim, self.dim)
        return direct.direct(x.device, x.numel(), calls, own, shape)


# A block's calls of each op, for `ops.direct`'s counts (attention counts its own), by (RoPE, finish). With RoPE
# the q/k norms run inside op qk_norm_rope, whose policy (not the norm modules' own) picks their form; the norms
# and modulations inside op layer_norm_modulate.
_CALLS = {
    (rope, finish): f"layer_norm_modulate:2,{'qk_norm_rope:1' if rope else 'rms_norm:2'},linear_gelu:1,skinny_linear:1"
    + (",gated_residual:2" if finish else "")
    for rope in (False, True)
    for finish in (False, True)
}
_CALLS_FINAL = "layer_norm_modulate:1,skinny_linear:1"


def _finished(f, x: torch.Tensor, pending: tuple) -> torch.Tensor:
    """A block's output from its input x and its pending branches (attn, gate1, mlp, gate2): two gated residuals, as
    a block called alone adds them (rounded after each, where the next norm adds both in one sum)."""
    attn, gate1, mlp, gate2 = pending
    return f.gated_residual(f.gated_residual(x, attn, gate1), mlp, gate2)


def _modulation(ada: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """The adaLN output [B, n * C] as n parameters [B, 1, C], in its own dtype for every form: the fused kernel
    computes in float32 itself (given float32 slices, the compiled graph wrote each out as a float32 copy first: 41
    Triton launches against auto's 15 in a 4-block stack at 1024 tokens on the H200,
    benchmarks/results/dit_graph_probe_h200.txt), and the native forms compiled are the plain twin's formula, which
    Inductor computes in float32 (an upcast here gave the same results through differently named kernels)."""
    return ada[:, None].chunk(n, dim=-1)


def _norm_module(module, x):
    return module(x)


def _checked_rope(x, cos, sin, interleaved, seq_dim):
    return ops.apply_rope(x, cos, sin, interleaved=interleaved, layout="bsnd" if seq_dim == 1 else "bnsd")


def _checked_attention(q, k, v):
    return ops.attention(q, k, v, layout="bsnd")


def _checked_qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, interleaved, seq_dim):
    layout = "bsnd" if seq_dim == 1 else "bnsd"
    return ops.qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps=eps, interleaved=interleaved, layout=layout)


def _checked_layer_norm_modulate(x, shift, scale, eps, h=None, gate=None, h2=None, gate2=None, return_sum=True):
    return ops.layer_norm_modulate(x, shift, scale, eps, h=h, gate=gate, h2=h2, gate2=gate2, return_sum=return_sum)


# The same forms through fullgraph.ops' checked entries (rms_norm as the block's own module, with its policy).
_CHECKED = direct.Direct(
    ops.layer_norm, _norm_module, ops.modulate, ops.gated_residual, _checked_rope, ops.linear_gelu,
    _checked_qk_norm_rope, _checked_layer_norm_modulate, ops.skinny_linear, _checked_attention, {},
)  # fmt: skip


class PlainDiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.heads, self.head_dim, self.eps = cfg.heads, cfg.head_dim, cfg.eps
        _block_params(self, cfg, nn.RMSNorm)

    def forward(self, x, c, rope=None):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(c))[:, None].chunk(6, dim=-1)  # [B, 1, C]
        h = F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale1) + shift1
        q, k, v = self.qkv(h).unflatten(-1, (3, self.heads, self.head_dim)).unbind(2)  # q: [B, N, H, D]
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate_half_rope(q, *rope), rotate_half_rope(k, *rope)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [B, H, N, D]
        x = x + gate1 * self.proj(a.transpose(1, 2).flatten(2))
        h = F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale2) + shift2
        return x + gate2 * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The usual RoPE (x·cos + rotate_half(x)·sin) on x [B, N, H, D] with tables [N, D / 2]."""
    cos = torch.cat((cos, cos), -1)[:, None].to(x.dtype)  # [N, 1, D]
    sin = torch.cat((sin, sin), -1)[:, None].to(x.dtype)
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), -1) * sin


class _Stack(nn.Module):
    """What both forms share: the parameters (same names, so state dicts load across), the RoPE tables and the
    checks; the blocks (`block_cls`) and the forward are each form's own."""

    block_cls: type[nn.Module]

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        tables = rope_tables_for(cfg)
        self.register_buffer("rope_cos", None if tables is None else tables[0], persistent=False)
        self.register_buffer("rope_sin", None if tables is None else tables[1], persistent=False)
        self.blocks = nn.ModuleList(self.block_cls(cfg) for _ in range(cfg.depth))
        self.final_ada = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.final = nn.Linear(cfg.dim, cfg.out_dim or cfg.dim)
        nn.init.zeros_(self.final_ada.weight)
        nn.init.zeros_(self.final_ada.bias)

    def _check(self, x: torch.Tensor, c: torch.Tensor) -> None:
        if x.ndim != 3 or x.shape[-1] != self.cfg.dim:
            raise UsageError(f"x must be [B, N, {self.cfg.dim}], got {tuple(x.shape)}")
        if c.shape != (x.shape[0], self.cfg.dim):
            raise UsageError(f"c must be [B, C] = [{x.shape[0]}, {self.cfg.dim}], got {tuple(c.shape)}")

    def _rope(self, n: int):
        if self.rope_cos is None:
            return None
        return _rope_slice(self.cfg, self.rope_cos, self.rope_sin, n)


class DiT(_Stack):
    """The stack built from `fullgraph.ops` (each op's policy picks native or kernel)."""

    block_cls = DiTBlock

    def _apply(self, fn, recurse=True):
        """The RoPE tables follow the model to a device but stay float32 (`ops.apply_rope` computes in float32:
        tables cast to bf16 would lose precision and cost a cast back on every call); rebuilt from the config."""
        super()._apply(fn, recurse)
        tables = rope_tables_for(self.cfg) if self.rope_cos is not None else None
        if tables is not None and self.rope_cos.dtype != torch.float32:
            self.rope_cos, self.rope_sin = (t.to(self.rope_cos.device) for t in tables)
        return self

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x: tokens [B, N, dim]; c: conditioning [B, dim]. Each block hands its two gated residuals to the next
        block's first norm (`DiTBlock.forward`, finish=False), the last one to the final norm."""
        self._check(x, c)
        rope = self._rope(x.shape[1])
        pending = None
        for block in self.blocks:
            if must_call_as_usual(block):  # watched or replaced: its usual call, on a finished x
                if pending is not None:  # the last block's branches, as its finished call adds them
                    x = _finished(self._forms(x, "gated_residual:2"), x, pending)
                x, pending = block(x, c, rope), None
            else:
                x, pending = block(x, c, rope, pending, finish=False)
        f = self._forms(x, _CALLS_FINAL)
        shift, scale = _modulation(f.skinny_linear(F.silu(c), self.final_ada.weight, self.final_ada.bias), 2)
        if pending is None:
            return self.final(f.layer_norm_modulate(x, shift, scale, self.cfg.eps))
        return self.final(f.layer_norm_modulate(x, shift, scale, self.cfg.eps, *pending)[0])

    def _forms(self, x, calls: str):
        """The stack's own ops (outside the blocks): direct forms in inference, else the checked ops."""
        if not direct.usable():
            return _CHECKED
        return direct.direct(x.device, x.numel(), calls, (), measured.shape_of(x, self.cfg.head_dim, self.cfg.dim))


class PlainDiT(_Stack):
    """The same stack in plain PyTorch (`F.layer_norm`, rotate-half RoPE, SDPA); loads `DiT`'s state dict."""

    block_cls = PlainDiTBlock

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x: tokens [B, N, dim]; c: conditioning [B, dim] (timestep and class embedding, summed)."""
        self._check(x, c)
        rope = self._rope(x.shape[1])
        for block in self.blocks:
            x = block(x, c, rope)
        shift, scale = self.final_ada(F.silu(c)).chunk(2, dim=-1)
        x = F.layer_norm(x, x.shape[-1:], eps=self.cfg.eps) * (1 + scale[:, None]) + shift[:, None]
        return self.final(x)


def dit(name: str = "dit_s", plain: bool = False, **overrides) -> nn.Module:
    """`dit("dit_b", depth=2)`: a DiT (or, with plain=True, its plain-PyTorch twin) from a named config."""
    cfg = config(name, **overrides)
    return PlainDiT(cfg) if plain else DiT(cfg)
